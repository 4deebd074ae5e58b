// Layer: core (no UnityEngine). The root of the plugin's typed exception tree.
//
// IgiException
//  +-- IgiProtocolException           bytes that do not follow ipc/PROTOCOL.md (Classification says how)
//  |    +-- MsgPackException          truncated / malformed / over-limit msgpack
//  |    +-- IgiFrameException         wrong frame count, magic or signature-frame shape
//  |    +-- IgiSignatureException     HMAC mismatch
//  |    +-- IgiUnknownTypeException   header type not in the protocol
//  +-- IgiTransportException          libzmq failed, or the native library is missing
//  +-- IgiConnectionFileException     the connection file is missing or malformed
//  |    +-- IgiStaleConnectionFileException   it names a daemon that is gone (killed without removing it)
//  +-- IgiTimeoutException            no terminal reply within the request timeout
//  +-- IgiClientClosedException       the client was disposed with the request in flight
//  +-- IgiRemoteException             the daemon answered error_reply{code, message, detail}
//       (one subclass per wire error code, see Protocol/ErrorCodes.cs)
using System;

namespace Igi
{
    /// <summary>Base of every exception the plugin throws on purpose.</summary>
    public class IgiException : Exception
    {
        /// <summary>Creates the exception with a message.</summary>
        public IgiException(string message) : base(message) { }

        /// <summary>Creates the exception with a message and its cause.</summary>
        public IgiException(string message, Exception inner) : base(message, inner) { }
    }

    /// <summary>Bytes that do not follow the wire protocol.</summary>
    public class IgiProtocolException : IgiException
    {
        /// <summary>
        /// Stable name of the failure, as in ipc/vectors/invalid.msgpack "expect": "bad_frame", "bad_signature",
        /// or the error code the daemon would answer with ("invalid_request", "unknown_type", "too_large", ...).
        /// </summary>
        public string Classification { get; private set; }

        /// <summary>Creates the exception.</summary>
        public IgiProtocolException(string message, string classification = "invalid_request") : base(message)
        {
            Classification = classification;
        }

        /// <summary>Creates the exception with its cause.</summary>
        public IgiProtocolException(string message, Exception inner, string classification = "invalid_request") : base(message, inner)
        {
            Classification = classification;
        }
    }

    /// <summary>Frames that do not have the [b"IGI1", signature, header, content] shape.</summary>
    public sealed class IgiFrameException : IgiProtocolException
    {
        /// <summary>Creates the exception.</summary>
        public IgiFrameException(string message) : base(message, "bad_frame") { }
    }

    /// <summary>A message whose HMAC-SHA256 signature does not match.</summary>
    public sealed class IgiSignatureException : IgiProtocolException
    {
        /// <summary>Creates the exception.</summary>
        public IgiSignatureException(string message) : base(message, "bad_signature") { }
    }

    /// <summary>libzmq failed, or the native library could not be loaded.</summary>
    public sealed class IgiTransportException : IgiException
    {
        /// <summary>The zmq errno, or 0 when not from libzmq.</summary>
        public int Errno { get; private set; }

        /// <summary>Creates the exception.</summary>
        public IgiTransportException(string message, int errno = 0) : base(message) { Errno = errno; }

        /// <summary>Creates the exception with its cause.</summary>
        public IgiTransportException(string message, Exception inner) : base(message, inner) { }
    }

    /// <summary>The daemon's connection file is missing or malformed.</summary>
    public class IgiConnectionFileException : IgiException
    {
        /// <summary>Creates the exception.</summary>
        public IgiConnectionFileException(string message) : base(message) { }

        /// <summary>Creates the exception with its cause.</summary>
        public IgiConnectionFileException(string message, Exception inner) : base(message, inner) { }
    }

    /// <summary>
    /// The connection file names a daemon that is gone (its pid does not run, or runs with another start time), and
    /// nothing answered a short handshake: a daemon killed with SIGKILL left it. Start the daemon; it replaces the file.
    /// </summary>
    public sealed class IgiStaleConnectionFileException : IgiConnectionFileException
    {
        /// <summary>The connection file.</summary>
        public string Path { get; private set; }

        /// <summary>The pid it names.</summary>
        public int Pid { get; private set; }

        /// <summary>Creates the exception.</summary>
        public IgiStaleConnectionFileException(string message, string path, int pid) : base(message)
        {
            Path = path;
            Pid = pid;
        }
    }

    /// <summary>No terminal reply arrived within the request timeout.</summary>
    public sealed class IgiTimeoutException : IgiException
    {
        /// <summary>Creates the exception.</summary>
        public IgiTimeoutException(string message) : base(message) { }
    }

    /// <summary>The client was closed while the request was in flight.</summary>
    public sealed class IgiClientClosedException : IgiException
    {
        /// <summary>Creates the exception.</summary>
        public IgiClientClosedException(string message) : base(message) { }
    }
}
