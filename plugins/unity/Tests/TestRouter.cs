// A raw libzmq ROUTER socket for transport/client tests: it plays the peer's socket, not the daemon's logic.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;
using Igi.Transport;

namespace Igi.Tests
{
    public sealed class TestRouter : IDisposable
    {
        private const int ZMQ_REP = 4;
        private IntPtr _ctx;
        private IntPtr _socket;
        private IntPtr _zapSocket;
        private Thread _zap;
        private volatile bool _stopZap;

        /// <summary>
        /// Binds tcp://HOST:* on an ephemeral port (an IPv6 host such as "::1" is bracketed and enables ZMQ_IPV6), or
        /// <c>ipc://ipcPath</c> when <paramref name="ipcPath"/> is given. With <paramref name="plainPassword"/> the socket
        /// is a ZMQ_PLAIN server, as the daemon's (PROTOCOL.md 1.5): a ZAP handler in its context lets in only username
        /// "igi" with that password (<see cref="ZapAccepted"/>, <see cref="ZapRefused"/> count its verdicts).
        /// </summary>
        public TestRouter(string host = "127.0.0.1", string ipcPath = null, byte[] plainPassword = null)
        {
            _ctx = ZmqNative.zmq_ctx_new();
            if (plainPassword != null) StartZap(plainPassword);
            _socket = ZmqNative.zmq_socket(_ctx, ZmqNative.ZMQ_ROUTER);
            int linger = 0;
            ZmqNative.zmq_setsockopt(_socket, ZmqNative.ZMQ_LINGER, ref linger, (UIntPtr)4);
            bool ipv6 = ipcPath == null && host.IndexOf(':') >= 0;
            if (ipv6)
            {
                int on = 1;
                ZmqNative.zmq_setsockopt(_socket, ZmqNative.ZMQ_IPV6, ref on, (UIntPtr)4);
            }
            if (plainPassword != null)
            {
                byte[] domain = Encoding.ASCII.GetBytes("igi");
                int on = 1;
                ZmqNative.zmq_setsockopt_bytes(_socket, ZmqNative.ZMQ_ZAP_DOMAIN, domain, (UIntPtr)domain.Length);
                ZmqNative.zmq_setsockopt(_socket, ZmqNative.ZMQ_PLAIN_SERVER, ref on, (UIntPtr)4);
            }
            string endpoint = ipcPath != null ? "ipc://" + ipcPath : "tcp://" + (ipv6 ? "[" + host + "]" : host) + ":*";
            if (ZmqNative.zmq_bind(_socket, endpoint) != 0)
            {
                var e = ZmqNative.LastError("zmq_bind");
                Dispose();
                throw e;
            }
            var buf = new byte[256];
            var len = (UIntPtr)buf.Length;
            if (ZmqNative.zmq_getsockopt_bytes(_socket, ZmqNative.ZMQ_LAST_ENDPOINT, buf, ref len) != 0) throw ZmqNative.LastError("getsockopt");
            Endpoint = Encoding.ASCII.GetString(buf, 0, (int)(ulong)len).TrimEnd('\0');
            Port = ipcPath != null ? 0 : int.Parse(Endpoint.Substring(Endpoint.LastIndexOf(':') + 1));
        }

        public string Endpoint { get; private set; }
        public int Port { get; private set; }
        public int ZapAccepted;
        public int ZapRefused;

        // The ZAP handler (RFC 27): libzmq asks it, over inproc, whether a PLAIN handshake may complete.
        private void StartZap(byte[] password)
        {
            _zapSocket = ZmqNative.zmq_socket(_ctx, ZMQ_REP);
            int linger = 0;
            ZmqNative.zmq_setsockopt(_zapSocket, ZmqNative.ZMQ_LINGER, ref linger, (UIntPtr)4);
            if (ZmqNative.zmq_bind(_zapSocket, "inproc://zeromq.zap.01") != 0) throw ZmqNative.LastError("zmq_bind(zap)");
            _zap = new Thread(() =>
            {
                while (!_stopZap)
                {
                    List<byte[]> request = ReceiveFrom(_zapSocket, 50);
                    if (request == null) continue;
                    bool ok = request.Count == 8 && Encoding.ASCII.GetString(request[5]) == "PLAIN" &&
                              Encoding.ASCII.GetString(request[6]) == "igi" && Encoding.ASCII.GetString(request[7]) == Encoding.ASCII.GetString(password);
                    if (ok) Interlocked.Increment(ref ZapAccepted); else Interlocked.Increment(ref ZapRefused);
                    var reply = new List<byte[]>
                    {
                        Encoding.ASCII.GetBytes("1.0"), request.Count > 1 ? request[1] : new byte[0],
                        Encoding.ASCII.GetBytes(ok ? "200" : "400"), Encoding.ASCII.GetBytes(ok ? "OK" : "refused"),
                        Encoding.ASCII.GetBytes(ok ? "igi" : ""), new byte[0],
                    };
                    SendOn(_zapSocket, reply);
                }
            }) { IsBackground = true, Name = "TestRouter ZAP" };
            _zap.Start();
        }

        /// <summary>Receives [identity, frames...] or null on timeout.</summary>
        public List<byte[]> Receive(int timeoutMs)
        {
            return ReceiveFrom(_socket, timeoutMs);
        }

        private static List<byte[]> ReceiveFrom(IntPtr socket, int timeoutMs)
        {
            var items = new ZmqNative.PollItemUnix[1];
            items[0].Socket = socket;
            items[0].Events = ZmqNative.ZMQ_POLLIN;
            // A signal (Mono's garbage collector suspends threads with one) interrupts zmq_poll with EINTR: poll again
            // for the time left, as the runtime's transport does. Returning null there failed a test at once with
            // "the router received a request" (seen once, on a loaded machine).
            var sw = Stopwatch.StartNew();
            while (true)
            {
                long left = Math.Max(0L, timeoutMs - sw.ElapsedMilliseconds);
                int rc = ZmqNative.zmq_poll_unix(items, 1, (IntPtr)left);
                if (rc > 0) break;
                if (rc == 0) return null;
                if (ZmqNative.zmq_errno() != ZmqNative.EINTR) throw ZmqNative.LastError("zmq_poll");
            }
            var frames = new List<byte[]>();
            IntPtr msg = Marshal.AllocHGlobal(ZmqNative.ZmqMsgSize);
            try
            {
                bool more = true;
                while (more)
                {
                    ZmqNative.zmq_msg_init(msg);
                    int got;
                    while ((got = ZmqNative.zmq_msg_recv(msg, socket, 0)) < 0 && ZmqNative.zmq_errno() == ZmqNative.EINTR) { }
                    if (got < 0) throw ZmqNative.LastError("zmq_msg_recv");
                    var data = new byte[(int)(ulong)ZmqNative.zmq_msg_size(msg)];
                    if (data.Length > 0) Marshal.Copy(ZmqNative.zmq_msg_data(msg), data, 0, data.Length);
                    frames.Add(data);
                    more = ZmqNative.zmq_msg_more(msg) != 0;
                    ZmqNative.zmq_msg_close(msg);
                }
            }
            finally { Marshal.FreeHGlobal(msg); }
            return frames;
        }

        public void Send(byte[] identity, IList<byte[]> frames)
        {
            var all = new List<byte[]> { identity };
            all.AddRange(frames);
            SendOn(_socket, all);
        }

        private static void SendOn(IntPtr socket, IList<byte[]> all)
        {
            for (int i = 0; i < all.Count; i++)
            {
                int flags = i < all.Count - 1 ? ZmqNative.ZMQ_SNDMORE : 0;
                int sent;
                while ((sent = ZmqNative.zmq_send(socket, all[i], (UIntPtr)all[i].Length, flags)) < 0
                       && ZmqNative.zmq_errno() == ZmqNative.EINTR) { }
                if (sent < 0) throw ZmqNative.LastError("zmq_send");
            }
        }

        public void Dispose()
        {
            if (_zap != null) { _stopZap = true; _zap.Join(); _zap = null; }
            if (_zapSocket != IntPtr.Zero) { ZmqNative.zmq_close(_zapSocket); _zapSocket = IntPtr.Zero; }
            if (_socket != IntPtr.Zero) { ZmqNative.zmq_close(_socket); _socket = IntPtr.Zero; }
            if (_ctx != IntPtr.Zero) { ZmqNative.zmq_ctx_term(_ctx); _ctx = IntPtr.Zero; }
        }
    }
}
