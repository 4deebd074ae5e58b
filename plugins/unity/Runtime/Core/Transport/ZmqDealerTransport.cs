// Layer: core/transport. DEALER socket over libzmq P/Invoke, with an inproc wake-up pair.
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Threading;

namespace Igi.Transport
{
    /// <summary>
    /// <see cref="IIgiTransport"/> over libzmq: one DEALER socket (linger 0, inbound frames capped by
    /// <c>ZMQ_MAXMSGSIZE</c>, see <see cref="MaxMessageBytes"/>; the handshake's ZMQ_PLAIN credential, see
    /// <see cref="SetPlainCredential"/>) plus an inproc PAIR pair so <see cref="Wake"/> can interrupt a blocking poll
    /// from another thread. It connects to <c>tcp://</c> and <c>ipc://</c> endpoints alike.
    /// </summary>
    public sealed class ZmqDealerTransport : IIgiTransport, IIgiMessageSizeCap, IIgiHandshakeCredential
    {
        /// <summary>
        /// The cap before a handshake has announced the daemon's limit: 2 x the default <c>limits.max_frame_bytes</c>
        /// (1 MiB, <c>WireCodec.DefaultMaxFrameBytes</c>), as PROTOCOL.md section 1.4 asks.
        /// </summary>
        public const long DefaultMaxMessageBytes = 2L * 1048576;

        private static int _instanceCounter;
        private readonly object _wakeLock = new object();
        private readonly int _maxFrames;
        private long _maxMessageBytes;
        private bool _connected;
        private IntPtr _context;
        private IntPtr _dealer;
        private IntPtr _wakeReader;
        private IntPtr _wakeWriter;
        private IntPtr _msg;
        private bool _disposed;

        /// <summary>Creates the context and sockets (not yet connected).</summary>
        /// <param name="maxMessageBytes">
        /// Largest inbound frame (<c>ZMQ_MAXMSGSIZE</c>, -1 = none); libzmq disconnects a peer that sends a larger one.
        /// <see cref="Client.IgiClient"/> overrides it with 2 x the daemon's announced <c>max_frame_bytes</c>.
        /// </param>
        /// <param name="maxFrames">Most frames one message may have; longer messages are drained and dropped.</param>
        /// <exception cref="IgiTransportException">libzmq is missing or failed.</exception>
        public ZmqDealerTransport(long maxMessageBytes = DefaultMaxMessageBytes, int maxFrames = 16)
        {
            if (maxMessageBytes < -1) throw new ArgumentOutOfRangeException("maxMessageBytes", "must be -1 (no cap) or more");
            _maxFrames = maxFrames;
            try
            {
                Open(maxMessageBytes);
            }
            catch
            {
                Dispose();
                throw;
            }
        }

        private void Open(long maxMessageBytes)
        {
            try
            {
                _context = ZmqNative.zmq_ctx_new();
            }
            catch (DllNotFoundException e)
            {
                throw new IgiTransportException(
                    "libzmq native library not found (DllImport name \"" + ZmqNative.LibraryName + "\"); install libzmq " +
                    "(Debian: libzmq5) or place libzmq.so / libzmq.dll / libzmq.dylib in the plugin folder", e);
            }
            catch (EntryPointNotFoundException e)
            {
                throw new IgiTransportException("the loaded libzmq lacks the libzmq 4 API", e);
            }
            if (_context == IntPtr.Zero) throw ZmqNative.LastError("zmq_ctx_new");
            _msg = Marshal.AllocHGlobal(ZmqNative.ZmqMsgSize);
            _dealer = NewSocket(ZmqNative.ZMQ_DEALER);
            SetInt64(_dealer, ZmqNative.ZMQ_MAXMSGSIZE, maxMessageBytes);
            _maxMessageBytes = maxMessageBytes;
            _wakeReader = NewSocket(ZmqNative.ZMQ_PAIR);
            _wakeWriter = NewSocket(ZmqNative.ZMQ_PAIR);
            string wakeEndpoint = "inproc://igi-wake-" + Interlocked.Increment(ref _instanceCounter) + "-" + Guid.NewGuid().ToString("N");
            Check(ZmqNative.zmq_bind(_wakeReader, wakeEndpoint), "zmq_bind(" + wakeEndpoint + ")");
            Check(ZmqNative.zmq_connect(_wakeWriter, wakeEndpoint), "zmq_connect(" + wakeEndpoint + ")");
        }

        /// <summary>
        /// Largest inbound frame in bytes (<c>ZMQ_MAXMSGSIZE</c>; -1 = no cap). libzmq applies the option only to
        /// connections made after it is set, so it can be changed only before <see cref="Connect"/>.
        /// </summary>
        /// <exception cref="InvalidOperationException">Set after <see cref="Connect"/> (it would not apply).</exception>
        /// <exception cref="ArgumentOutOfRangeException">A value below -1.</exception>
        public long MaxMessageBytes
        {
            get { return _maxMessageBytes; }
            set
            {
                ThrowIfDisposed();
                if (value < -1) throw new ArgumentOutOfRangeException("value", "must be -1 (no cap) or more");
                if (_connected)
                    throw new InvalidOperationException("ZMQ_MAXMSGSIZE applies only to connections made after it is set: " +
                                                        "set MaxMessageBytes before Connect, or connect a new transport");
                SetInt64(_dealer, ZmqNative.ZMQ_MAXMSGSIZE, value);
                _maxMessageBytes = value;
            }
        }

        /// <summary>
        /// Presents the ZMQ_PLAIN credential at the handshakes of this transport's connection (PROTOCOL.md 1.5).
        /// libzmq applies it only to connections made after it is set, so it can be set only before <see cref="Connect"/>.
        /// </summary>
        /// <exception cref="InvalidOperationException">Set after <see cref="Connect"/> (it would not apply).</exception>
        /// <exception cref="ArgumentException">A null or empty username or password, or one over 255 bytes.</exception>
        public void SetPlainCredential(string username, byte[] password)
        {
            ThrowIfDisposed();
            byte[] user = username == null ? null : System.Text.Encoding.UTF8.GetBytes(username);
            if (user == null || user.Length == 0 || user.Length > 255 || password == null || password.Length == 0 || password.Length > 255)
                throw new ArgumentException("a PLAIN username and password are 1-255 bytes each");
            if (_connected)
                throw new InvalidOperationException("the handshake credential applies only to connections made after it is set: " +
                                                    "set it before Connect, or connect a new transport");
            Check(ZmqNative.zmq_setsockopt_bytes(_dealer, ZmqNative.ZMQ_PLAIN_USERNAME, user, (UIntPtr)user.Length), "zmq_setsockopt(ZMQ_PLAIN_USERNAME)");
            Check(ZmqNative.zmq_setsockopt_bytes(_dealer, ZmqNative.ZMQ_PLAIN_PASSWORD, password, (UIntPtr)password.Length), "zmq_setsockopt(ZMQ_PLAIN_PASSWORD)");
        }

        /// <summary>The libzmq version as "major.minor.patch".</summary>
        public static string LibraryVersion()
        {
            int major, minor, patch;
            ZmqNative.zmq_version(out major, out minor, out patch);
            return major + "." + minor + "." + patch;
        }

        private IntPtr NewSocket(int type)
        {
            IntPtr s = ZmqNative.zmq_socket(_context, type);
            if (s == IntPtr.Zero) throw ZmqNative.LastError("zmq_socket");
            int linger = 0;
            Check(ZmqNative.zmq_setsockopt(s, ZmqNative.ZMQ_LINGER, ref linger, (UIntPtr)4), "zmq_setsockopt(ZMQ_LINGER)");
            return s;
        }

        private static void SetInt64(IntPtr socket, int option, long value)
        {
            Check(ZmqNative.zmq_setsockopt_int64(socket, option, ref value, (UIntPtr)8), "zmq_setsockopt(" + option + ")");
        }

        private static void Check(int rc, string what)
        {
            if (rc != 0) throw ZmqNative.LastError(what);
        }

        private void ThrowIfDisposed()
        {
            if (_disposed) throw new ObjectDisposedException("ZmqDealerTransport");
        }

        /// <inheritdoc/>
        public void Connect(string endpoint)
        {
            ThrowIfDisposed();
            if (IsIpv6Tcp(endpoint))
            {
                // libzmq resolves only IPv4 unless ZMQ_IPV6 is set before connecting (the daemon may bind tcp://[::1]:PORT).
                int ipv6 = 1;
                Check(ZmqNative.zmq_setsockopt(_dealer, ZmqNative.ZMQ_IPV6, ref ipv6, (UIntPtr)4), "zmq_setsockopt(ZMQ_IPV6)");
            }
            Check(ZmqNative.zmq_connect(_dealer, endpoint), "zmq_connect(" + endpoint + ")");
            _connected = true;
        }

        /// <summary>True for a tcp endpoint whose host is an IPv6 address (bracketed, e.g. <c>tcp://[::1]:5555</c>).</summary>
        public static bool IsIpv6Tcp(string endpoint)
        {
            return endpoint != null && endpoint.StartsWith("tcp://[", StringComparison.Ordinal);
        }

        /// <inheritdoc/>
        public void Send(IList<byte[]> frames)
        {
            ThrowIfDisposed();
            if (frames == null || frames.Count == 0) throw new ArgumentException("a message needs at least one frame");
            for (int i = 0; i < frames.Count; i++)
            {
                byte[] frame = frames[i] ?? new byte[0];
                int flags = ZmqNative.ZMQ_DONTWAIT | (i < frames.Count - 1 ? ZmqNative.ZMQ_SNDMORE : 0);
                while (true)
                {
                    int rc = ZmqNative.zmq_send(_dealer, frame, (UIntPtr)frame.Length, flags);
                    if (rc >= 0) break;
                    int errno = ZmqNative.zmq_errno();
                    if (errno == ZmqNative.EINTR) continue;
                    if (ZmqNative.IsEagain(errno))
                        throw new IgiTransportException("send queue full: the daemon is not reading (zmq EAGAIN)", errno);
                    throw ZmqNative.LastError("zmq_send");
                }
            }
        }

        /// <inheritdoc/>
        public bool TryReceive(int timeoutMs, out byte[][] frames)
        {
            ThrowIfDisposed();
            frames = null;
            bool dealerReady, wakeReady;
            Poll(timeoutMs, out dealerReady, out wakeReady);
            if (wakeReady) DrainWake();
            if (!dealerReady) return false;
            var parts = new List<byte[]>();
            bool more = true;
            int total = 0;
            while (more)
            {
                byte[] part;
                if (!ReceiveFrame(total == 0 ? ZmqNative.ZMQ_DONTWAIT : 0, out part, out more)) return false;
                total++;
                if (total <= _maxFrames) parts.Add(part);
            }
            if (total > _maxFrames) return false;  // over-long message: drained and dropped
            frames = parts.ToArray();
            return true;
        }

        private void Poll(int timeoutMs, out bool dealerReady, out bool wakeReady)
        {
            while (true)
            {
                int rc;
                if (ZmqNative.IsWindows)
                {
                    var items = new ZmqNative.PollItemWindows[2];
                    items[0].Socket = _dealer; items[0].Events = ZmqNative.ZMQ_POLLIN;
                    items[1].Socket = _wakeReader; items[1].Events = ZmqNative.ZMQ_POLLIN;
                    rc = ZmqNative.zmq_poll_windows(items, 2, timeoutMs);
                    dealerReady = (items[0].Revents & ZmqNative.ZMQ_POLLIN) != 0;
                    wakeReady = (items[1].Revents & ZmqNative.ZMQ_POLLIN) != 0;
                }
                else
                {
                    var items = new ZmqNative.PollItemUnix[2];
                    items[0].Socket = _dealer; items[0].Events = ZmqNative.ZMQ_POLLIN;
                    items[1].Socket = _wakeReader; items[1].Events = ZmqNative.ZMQ_POLLIN;
                    rc = ZmqNative.zmq_poll_unix(items, 2, (IntPtr)timeoutMs);
                    dealerReady = (items[0].Revents & ZmqNative.ZMQ_POLLIN) != 0;
                    wakeReady = (items[1].Revents & ZmqNative.ZMQ_POLLIN) != 0;
                }
                if (rc >= 0) return;
                if (ZmqNative.zmq_errno() == ZmqNative.EINTR) { dealerReady = wakeReady = false; return; }
                throw ZmqNative.LastError("zmq_poll");
            }
        }

        private bool ReceiveFrame(int flags, out byte[] data, out bool more)
        {
            data = null;
            more = false;
            Check(ZmqNative.zmq_msg_init(_msg), "zmq_msg_init");
            try
            {
                while (true)
                {
                    int rc = ZmqNative.zmq_msg_recv(_msg, _dealer, flags);
                    if (rc >= 0) break;
                    int errno = ZmqNative.zmq_errno();
                    if (errno == ZmqNative.EINTR) continue;
                    if (ZmqNative.IsEagain(errno)) return false;
                    throw ZmqNative.LastError("zmq_msg_recv");
                }
                int size = checked((int)(ulong)ZmqNative.zmq_msg_size(_msg));
                data = new byte[size];
                if (size > 0) Marshal.Copy(ZmqNative.zmq_msg_data(_msg), data, 0, size);
                more = ZmqNative.zmq_msg_more(_msg) != 0;
                return true;
            }
            finally
            {
                ZmqNative.zmq_msg_close(_msg);
            }
        }

        private void DrainWake()
        {
            while (true)
            {
                Check(ZmqNative.zmq_msg_init(_msg), "zmq_msg_init");
                int rc = ZmqNative.zmq_msg_recv(_msg, _wakeReader, ZmqNative.ZMQ_DONTWAIT);
                ZmqNative.zmq_msg_close(_msg);
                if (rc < 0) return;
            }
        }

        /// <inheritdoc/>
        public void Wake()
        {
            lock (_wakeLock)
            {
                if (_disposed) return;
                // A full wake queue already guarantees a wake-up, so EAGAIN is ignored.
                ZmqNative.zmq_send(_wakeWriter, new byte[0], UIntPtr.Zero, ZmqNative.ZMQ_DONTWAIT);
            }
        }

        /// <summary>Closes the sockets (linger 0: unsent messages are discarded) and terminates the context.</summary>
        public void Dispose()
        {
            lock (_wakeLock)
            {
                if (_disposed) return;
                _disposed = true;
                if (_dealer != IntPtr.Zero) ZmqNative.zmq_close(_dealer);
                if (_wakeReader != IntPtr.Zero) ZmqNative.zmq_close(_wakeReader);
                if (_wakeWriter != IntPtr.Zero) ZmqNative.zmq_close(_wakeWriter);
                _dealer = _wakeReader = _wakeWriter = IntPtr.Zero;
                if (_context != IntPtr.Zero)
                {
                    while (ZmqNative.zmq_ctx_term(_context) != 0 && ZmqNative.zmq_errno() == ZmqNative.EINTR) { }
                    _context = IntPtr.Zero;
                }
                if (_msg != IntPtr.Zero) { Marshal.FreeHGlobal(_msg); _msg = IntPtr.Zero; }
            }
        }
    }
}
