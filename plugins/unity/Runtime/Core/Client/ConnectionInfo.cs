// Layer: core/client. The daemon's connection file: where to connect and with which key.
using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using Igi.Json;

namespace Igi.Client
{
    /// <summary>
    /// Contents of the JSON connection file the daemon writes once it serves:
    /// <c>{"transport", "ip", "port", "key", "signature_scheme", "protocol_version", "pid", "zmq_mechanism",
    /// "pid_start_ticks"}</c> (<c>zmq_mechanism</c> and <c>pid_start_ticks</c> since protocol 1.2; absent from an older
    /// daemon's file).
    /// </summary>
    public sealed class ConnectionInfo
    {
        private const int GroupOtherBits = 0x3F;  // octal 077: S_IRWXG | S_IRWXO

        /// <summary>"tcp" or "ipc".</summary>
        public string Transport { get; private set; }
        /// <summary>Host address (tcp) or socket path (ipc).</summary>
        public string Ip { get; private set; }
        /// <summary>TCP port (0 for ipc).</summary>
        public int Port { get; private set; }
        /// <summary>The per-launch HMAC key, hex.</summary>
        public string KeyHex { get; private set; }
        /// <summary>Always "hmac-sha256" in protocol 1.x.</summary>
        public string SignatureScheme { get; private set; }
        /// <summary>The daemon's protocol version, e.g. "1.0".</summary>
        public string ProtocolVersion { get; private set; }
        /// <summary>The daemon's process id (0 when absent).</summary>
        public int Pid { get; private set; }
        /// <summary>
        /// What the client presents at the ZeroMQ handshake (PROTOCOL.md 1.5): "plain" (the PLAIN credential
        /// <see cref="PlainUsername"/> / <see cref="PlainPassword"/>) or "null" (none; also what a file without the
        /// field, from a daemon older than protocol 1.2, means).
        /// </summary>
        public string ZmqMechanism { get; private set; }
        /// <summary>
        /// The daemon's start time in clock ticks since boot (Linux's <c>/proc/PID/stat</c> field 22), null where its
        /// platform has none or the file predates the field: with <see cref="Pid"/> it tells a daemon that is gone
        /// (<see cref="ProcessLiveness"/>).
        /// </summary>
        public long? PidStartTicks { get; private set; }

        /// <summary>The ZMQ_PLAIN username every client presents ("igi").</summary>
        public const string PlainUsernameValue = "igi";

        /// <summary>The ZMQ_PLAIN username to present, or null for the NULL mechanism.</summary>
        public string PlainUsername { get { return ZmqMechanism == "plain" ? PlainUsernameValue : null; } }

        /// <summary>
        /// The ZMQ_PLAIN password to present, or null for the NULL mechanism: the 64 ASCII bytes of the lowercase hex
        /// HMAC-SHA256(key, "igi-zmq-plain-1"), derived one way from the key so that PLAIN, which carries it in clear,
        /// never shows the signing key.
        /// </summary>
        public byte[] PlainPassword
        {
            get { return ZmqMechanism == "plain" ? DerivePlainPassword(Protocol.Hex.Decode(KeyHex)) : null; }
        }

        /// <summary>The ZMQ_PLAIN password of a launch key (PROTOCOL.md 1.5).</summary>
        public static byte[] DerivePlainPassword(byte[] key)
        {
            using (var hmac = new System.Security.Cryptography.HMACSHA256(key))
                return System.Text.Encoding.ASCII.GetBytes(Protocol.Hex.Encode(hmac.ComputeHash(System.Text.Encoding.ASCII.GetBytes("igi-zmq-plain-1"))));
        }

        /// <summary>
        /// The ZeroMQ endpoint, e.g. <c>tcp://127.0.0.1:5555</c>, <c>tcp://[::1]:5555</c> (an IPv6 host is bracketed)
        /// or <c>ipc:///tmp/igi.sock</c>.
        /// </summary>
        public string Endpoint
        {
            get
            {
                if (Transport == "ipc") return "ipc://" + Ip;
                string host = Ip.IndexOf(':') >= 0 && !Ip.StartsWith("[", StringComparison.Ordinal) ? "[" + Ip + "]" : Ip;
                return Transport + "://" + host + ":" + Port.ToString(CultureInfo.InvariantCulture);
            }
        }

        /// <summary>
        /// Reads and validates a connection file (every field required, unknown fields ignored, PROTOCOL.md section 13).
        /// On POSIX systems a file that group or others may access (any of the mode bits 077: the daemon writes it 0600)
        /// is refused, as the Python and C++ readers do; where the mode cannot be read (Windows, or see
        /// <see cref="PosixFileMode"/>) that check is skipped.
        /// </summary>
        /// <param name="path">The file the daemon wrote.</param>
        /// <param name="checkPermissions">Refuse (POSIX) a file that group or others can read, write or execute.</param>
        /// <exception cref="IgiConnectionFileException">Missing, unreadable, too-open mode, not JSON, or a field missing/invalid.</exception>
        public static ConnectionInfo Load(string path, bool checkPermissions = true)
        {
            int permissions;
            if (checkPermissions && PosixFileMode.TryGetPermissions(path, out permissions) && (permissions & GroupOtherBits) != 0)
                throw new IgiConnectionFileException("connection file '" + path + "' has mode " + Convert.ToString(permissions, 8) +
                                                     " (group or others may access it); it must be 600");
            string text;
            try { text = File.ReadAllText(path); }
            catch (Exception e) when (e is IOException || e is UnauthorizedAccessException || e is ArgumentException || e is NotSupportedException)
            {
                throw new IgiConnectionFileException("cannot read connection file '" + path + "': " + e.Message, e);
            }
            return Parse(text, path);
        }

        /// <summary>Parses connection-file JSON text; <paramref name="origin"/> names it in error messages.</summary>
        public static ConnectionInfo Parse(string json, string origin = "<string>")
        {
            Dictionary<string, object> d;
            try { d = MiniJson.Parse(json) as Dictionary<string, object>; }
            catch (FormatException e)
            {
                throw new IgiConnectionFileException("connection file '" + origin + "' is not valid JSON: " + e.Message, e);
            }
            if (d == null) throw new IgiConnectionFileException("connection file '" + origin + "' is not a JSON object");
            var info = new ConnectionInfo
            {
                Transport = RequireString(d, "transport", origin),
                Ip = RequireString(d, "ip", origin),
                KeyHex = RequireString(d, "key", origin),
                SignatureScheme = RequireString(d, "signature_scheme", origin),
                ProtocolVersion = RequireString(d, "protocol_version", origin),
                Port = RequireInt(d, "port", origin),
                Pid = RequireInt(d, "pid", origin),
                ZmqMechanism = OptionalString(d, "zmq_mechanism", "null", origin),
                PidStartTicks = OptionalTicks(d, "pid_start_ticks", origin),
            };
            if (info.ZmqMechanism != "plain" && info.ZmqMechanism != "null")  // PROTOCOL.md section 13
                throw new IgiConnectionFileException("connection file '" + origin + "': unsupported zmq_mechanism '" + info.ZmqMechanism + "'");
            if (info.Transport != "tcp" && info.Transport != "ipc")
                throw new IgiConnectionFileException("connection file '" + origin + "': unsupported transport '" + info.Transport + "'");
            if (info.Transport == "tcp" && (info.Port <= 0 || info.Port > 65535))
                throw new IgiConnectionFileException("connection file '" + origin + "': port " + info.Port + " out of range");
            if (info.Transport == "ipc" && info.Port != 0)  // PROTOCOL.md section 13: an ipc file's port is 0
                throw new IgiConnectionFileException("connection file '" + origin + "': transport ipc with port " + info.Port + ", expected 0");
            if (info.SignatureScheme != "hmac-sha256")
                throw new IgiConnectionFileException("connection file '" + origin + "': unsupported signature_scheme '" + info.SignatureScheme + "'");
            try { Protocol.Hex.Decode(info.KeyHex); }
            catch (FormatException e)
            {
                throw new IgiConnectionFileException("connection file '" + origin + "': key is not hex: " + e.Message, e);
            }
            if (info.KeyHex.Length != 64)  // PROTOCOL.md section 13: a 32-byte key as 64 hex digits
                throw new IgiConnectionFileException("connection file '" + origin + "': key has " + info.KeyHex.Length + " hex digits, expected 64");
            return info;
        }

        private static string RequireString(Dictionary<string, object> d, string key, string origin)
        {
            object v;
            if (!d.TryGetValue(key, out v) || !(v is string))
                throw new IgiConnectionFileException("connection file '" + origin + "': missing string field '" + key + "'");
            return (string)v;
        }

        private static string OptionalString(Dictionary<string, object> d, string key, string absent, string origin)
        {
            object v;
            if (!d.TryGetValue(key, out v)) return absent;
            if (!(v is string))
                throw new IgiConnectionFileException("connection file '" + origin + "': field '" + key + "' must be a string");
            return (string)v;
        }

        private static long? OptionalTicks(Dictionary<string, object> d, string key, string origin)
        {
            object v;
            if (!d.TryGetValue(key, out v) || v == null) return null;
            if (!(v is long) || (long)v < 0)
                throw new IgiConnectionFileException("connection file '" + origin + "': field '" + key + "' must be a non-negative integer or null");
            return (long)v;
        }

        private static int RequireInt(Dictionary<string, object> d, string key, string origin)
        {
            object v;
            if (!d.TryGetValue(key, out v) || !(v is long) || (long)v < 0 || (long)v > int.MaxValue)
                throw new IgiConnectionFileException("connection file '" + origin + "': missing or invalid integer field '" + key + "'");
            return (int)(long)v;
        }
    }
}
