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
}
