// Layer: core/transport. The seam between the client and the socket library: bytes in, bytes out.
using System;
using System.Collections.Generic;

namespace Igi.Transport
{
    /// <summary>
    /// A DEALER-style message transport. It moves multipart byte messages and never sees a typed message,
    /// so a managed implementation (e.g. over NetMQ) can replace <see cref="ZmqDealerTransport"/>.
    /// Threading contract: <see cref="Connect"/>, <see cref="Send"/>, <see cref="TryReceive"/> and
    /// <see cref="IDisposable.Dispose"/> are called from ONE thread (the client's I/O thread);
    /// <see cref="Wake"/> may be called from any thread.
    /// </summary>
    public interface IIgiTransport : IDisposable
    {
        /// <summary>Connects to an endpoint such as <c>tcp://127.0.0.1:5555</c>.</summary>
        void Connect(string endpoint);

        /// <summary>Sends one multipart message without blocking; throws <see cref="IgiTransportException"/> when it cannot be queued.</summary>
        void Send(IList<byte[]> frames);

        /// <summary>
        /// Waits up to <paramref name="timeoutMs"/> for one multipart message.
        /// Returns false on timeout or when <see cref="Wake"/> interrupted the wait.
        /// </summary>
        bool TryReceive(int timeoutMs, out byte[][] frames);

        /// <summary>Makes a pending or the next <see cref="TryReceive"/> return early. Thread-safe.</summary>
        void Wake();
    }

    /// <summary>
    /// Optional for an <see cref="IIgiTransport"/>: a hard cap on the size of one inbound frame (libzmq
    /// <c>ZMQ_MAXMSGSIZE</c>: a peer that sends a larger frame is disconnected). <see cref="Client.IgiClient"/> sets it before
    /// <see cref="IIgiTransport.Connect"/> to <c>2 * limits.max_frame_bytes</c> (PROTOCOL.md section 1.4): first for the
    /// default limit, then, when <c>hello_reply</c> announces another limit, on a fresh transport connected for a second
    /// handshake. A transport without this interface is used without a socket-level cap (the decoder still refuses
    /// frames over <c>max_frame_bytes</c>).
    /// </summary>
    public interface IIgiMessageSizeCap
    {
        /// <summary>
        /// Largest inbound frame, in bytes (-1 = no cap). Set it before <see cref="IIgiTransport.Connect"/>: libzmq applies
        /// the option only to connections made after it is set.
        /// </summary>
        long MaxMessageBytes { get; set; }
    }

    /// <summary>
    /// Optional for an <see cref="IIgiTransport"/>: the credential it presents at the ZeroMQ handshake. A daemon whose
    /// connection file says <c>"zmq_mechanism": "plain"</c> (PROTOCOL.md 1.5, protocol 1.2) refuses, before any message,
    /// every peer that does not present its ZMQ_PLAIN credential; <see cref="Client.IgiClient"/> sets it before
    /// <see cref="IIgiTransport.Connect"/> and refuses to use a transport without this interface against such a daemon.
    /// </summary>
    public interface IIgiHandshakeCredential
    {
        /// <summary>
        /// Present the ZMQ_PLAIN <paramref name="username"/> and <paramref name="password"/> at every handshake of the
        /// connections made after this call (set it before <see cref="IIgiTransport.Connect"/>).
        /// </summary>
        void SetPlainCredential(string username, byte[] password);
    }
}
