// Layer: core/transport. P/Invoke declarations of the libzmq C API (libzmq >= 4.1).
using System;
using System.Runtime.InteropServices;

namespace Igi.Transport
{
    /// <summary>
    /// Raw libzmq entry points. The library is imported by the name <see cref="LibraryName"/> ("libzmq"):
    /// Windows loads <c>libzmq.dll</c>, macOS <c>libzmq.dylib</c>, Linux <c>libzmq.so</c>. On Linux systems
    /// that only have the runtime package (Debian <c>libzmq5</c>: <c>libzmq.so.5</c>), either place a
    /// <c>libzmq.so</c> next to the game (Unity: Assets/Plugins/x86_64/) or, under standalone Mono, ship
    /// the <c>Igi.Core.dll.config</c> dllmap that build.sh writes.
    /// </summary>
    public static class ZmqNative
    {
        /// <summary>The DllImport name of libzmq.</summary>
        public const string LibraryName = "libzmq";

        /// <summary>ZMQ_PAIR socket type.</summary>
        public const int ZMQ_PAIR = 0;
        /// <summary>ZMQ_ROUTER socket type (the daemon's side; used by tests).</summary>
        public const int ZMQ_ROUTER = 6;
        /// <summary>ZMQ_DEALER socket type.</summary>
        public const int ZMQ_DEALER = 5;
        /// <summary>ZMQ_DONTWAIT send/recv flag.</summary>
        public const int ZMQ_DONTWAIT = 1;
        /// <summary>ZMQ_SNDMORE send flag.</summary>
        public const int ZMQ_SNDMORE = 2;
        /// <summary>ZMQ_RCVMORE socket option.</summary>
        public const int ZMQ_RCVMORE = 13;
        /// <summary>ZMQ_LINGER socket option (ms).</summary>
        public const int ZMQ_LINGER = 17;
        /// <summary>ZMQ_MAXMSGSIZE socket option (int64 bytes).</summary>
        public const int ZMQ_MAXMSGSIZE = 22;
        /// <summary>ZMQ_IPV6 socket option (int, 1 = IPv6 endpoints allowed).</summary>
        public const int ZMQ_IPV6 = 42;
        /// <summary>ZMQ_PLAIN_SERVER socket option (int, 1 = this socket is a PLAIN server; used by tests).</summary>
        public const int ZMQ_PLAIN_SERVER = 44;
        /// <summary>ZMQ_PLAIN_USERNAME socket option (bytes): the PLAIN client's username.</summary>
        public const int ZMQ_PLAIN_USERNAME = 45;
        /// <summary>ZMQ_PLAIN_PASSWORD socket option (bytes): the PLAIN client's password.</summary>
        public const int ZMQ_PLAIN_PASSWORD = 46;
        /// <summary>ZMQ_ZAP_DOMAIN socket option (string; used by tests).</summary>
        public const int ZMQ_ZAP_DOMAIN = 55;
        /// <summary>ZMQ_LAST_ENDPOINT socket option (string).</summary>
        public const int ZMQ_LAST_ENDPOINT = 32;
        /// <summary>ZMQ_POLLIN poll event.</summary>
        public const short ZMQ_POLLIN = 1;
        /// <summary>errno EINTR.</summary>
        public const int EINTR = 4;
        /// <summary>errno EAGAIN (Linux/macOS value 11 or 35; compared through <see cref="IsEagain"/>).</summary>
        public const int EAGAIN_LINUX = 11;
        /// <summary>ETERM: the context was terminated.</summary>
        public const int ETERM = 156384712 + 53;

        /// <summary>Size of the opaque zmq_msg_t.</summary>
        public const int ZmqMsgSize = 64;

#pragma warning disable 1591 // raw C API: the libzmq names are the documentation (see zmq.h)
        /// <summary>zmq_pollitem_t on Linux/macOS (fd is int).</summary>
        [StructLayout(LayoutKind.Sequential)]
        public struct PollItemUnix
        {
            public IntPtr Socket;
            public int Fd;
            public short Events;
            public short Revents;
        }

        /// <summary>zmq_pollitem_t on Windows (fd is SOCKET, pointer sized).</summary>
        [StructLayout(LayoutKind.Sequential)]
        public struct PollItemWindows
        {
            public IntPtr Socket;
            public IntPtr Fd;
            public short Events;
            public short Revents;
        }

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern void zmq_version(out int major, out int minor, out int patch);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr zmq_ctx_new();

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_ctx_term(IntPtr context);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr zmq_socket(IntPtr context, int type);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_close(IntPtr socket);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_setsockopt(IntPtr socket, int option, ref int value, UIntPtr length);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl, EntryPoint = "zmq_setsockopt")]
        public static extern int zmq_setsockopt_int64(IntPtr socket, int option, ref long value, UIntPtr length);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl, EntryPoint = "zmq_setsockopt")]
        public static extern int zmq_setsockopt_bytes(IntPtr socket, int option, byte[] value, UIntPtr length);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_getsockopt(IntPtr socket, int option, ref int value, ref UIntPtr length);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl, EntryPoint = "zmq_getsockopt")]
        public static extern int zmq_getsockopt_bytes(IntPtr socket, int option, byte[] value, ref UIntPtr length);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_connect(IntPtr socket, [MarshalAs(UnmanagedType.LPStr)] string endpoint);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_bind(IntPtr socket, [MarshalAs(UnmanagedType.LPStr)] string endpoint);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_send(IntPtr socket, byte[] buffer, UIntPtr length, int flags);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_msg_init(IntPtr msg);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_msg_recv(IntPtr msg, IntPtr socket, int flags);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr zmq_msg_data(IntPtr msg);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern UIntPtr zmq_msg_size(IntPtr msg);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_msg_more(IntPtr msg);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_msg_close(IntPtr msg);

        // zmq_poll's timeout is a C long: 64-bit on LP64 (Linux/macOS), 32-bit on Windows.
        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl, EntryPoint = "zmq_poll")]
        public static extern int zmq_poll_unix([In, Out] PollItemUnix[] items, int count, IntPtr timeoutMs);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl, EntryPoint = "zmq_poll")]
        public static extern int zmq_poll_windows([In, Out] PollItemWindows[] items, int count, int timeoutMs);

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern int zmq_errno();

        [DllImport(LibraryName, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr zmq_strerror(int errnum);

#pragma warning restore 1591

        /// <summary>True on Windows, where zmq_pollitem_t and C long differ.</summary>
        public static readonly bool IsWindows = Environment.OSVersion.Platform == PlatformID.Win32NT;

        /// <summary>True when errno means "try again" (EAGAIN is 11 on Linux, 35 on macOS/BSD).</summary>
        public static bool IsEagain(int errno)
        {
            return errno == EAGAIN_LINUX || errno == 35;
        }

        /// <summary>The message of the last libzmq error, as an exception.</summary>
        public static IgiTransportException LastError(string what)
        {
            int errno = zmq_errno();
            string text = Marshal.PtrToStringAnsi(zmq_strerror(errno));
            return new IgiTransportException(what + " failed: " + text + " (errno " + errno + ")", errno);
        }
    }
}
