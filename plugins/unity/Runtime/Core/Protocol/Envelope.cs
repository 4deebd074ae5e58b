// Layer: core/protocol. Header frame and the 4-frame wire message: [b"IGI1", signature, header, content].
using System;
using System.Collections.Generic;
using System.Text;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>The header frame, keys in wire order: msg_id, parent_id, session_id, type, protocol_version, sent_at.</summary>
    public sealed class Header : IWireObject
    {
        /// <summary>uuid4 hex (32 lowercase hex digits), unique per message.</summary>
        public string MsgId;
        /// <summary>msg_id of the request this message answers; null for requests.</summary>
        public string ParentId;
        /// <summary>The NPC session the message concerns; null when none.</summary>
        public string SessionId;
        /// <summary>Message type, e.g. "generate_request".</summary>
        public string Type;
        /// <summary>"major.minor" of the sender.</summary>
        public string ProtocolVersion = IgiVersion.Protocol;
        /// <summary>Sender wall clock, unix seconds.</summary>
        public double SentAt;

        private static readonly DateTime Epoch = new DateTime(1970, 1, 1, 0, 0, 0, DateTimeKind.Utc);

        /// <summary>A fresh message id (uuid4 as 32 lowercase hex digits).</summary>
        public static string NewMsgId() { return Guid.NewGuid().ToString("N"); }

        /// <summary>The current wall clock in unix seconds.</summary>
        public static double Now() { return (DateTime.UtcNow - Epoch).TotalSeconds; }

        /// <summary>A header for a new message with a fresh id and the current time.</summary>
        public static Header New(string type, string sessionId = null, string parentId = null)
        {
            return new Header { MsgId = NewMsgId(), ParentId = parentId, SessionId = sessionId, Type = type, SentAt = Now() };
        }

        /// <inheritdoc/>
        public void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 6).Str("msg_id", MsgId).Str("parent_id", ParentId).Str("session_id", SessionId)
                .Str("type", Type).Str("protocol_version", ProtocolVersion).F64("sent_at", SentAt);
        }

        /// <summary>Reads and validates a decoded header map.</summary>
        public static Header Read(FieldReader r)
        {
            var h = new Header
            {
                MsgId = r.MsgId("msg_id"),
                ParentId = r.MsgId("parent_id", true),
                SessionId = r.SessionId("session_id", true),
                Type = r.Str("type", maxLength: 64),
                ProtocolVersion = r.Version("protocol_version", false, IgiVersion.AbsentHeaderProtocol),
                SentAt = r.F64("sent_at", min: 0.0).Value,
            };
            if (h.Type.Length == 0) throw new IgiProtocolException("invalid header: field 'type' is empty");
            return h;
        }

        /// <summary>The major number of <see cref="ProtocolVersion"/>.</summary>
        public int Major { get { return int.Parse(ProtocolVersion.Split('.')[0]); } }
    }

    /// <summary>A decoded wire message: header plus typed content.</summary>
    public sealed class Envelope
    {
        /// <summary>The header.</summary>
        public Header Header;
        /// <summary>The typed content.</summary>
        public IgiMessage Message;
    }

    /// <summary>Encodes and decodes the 4-frame messages of ipc/PROTOCOL.md.</summary>
    public static class WireCodec
    {
        /// <summary>Frame 1: the protocol magic.</summary>
        public static readonly byte[] Magic = Encoding.ASCII.GetBytes("IGI1");

        /// <summary>Default largest header or content frame (hello_reply's limits.max_frame_bytes).</summary>
        public const int DefaultMaxFrameBytes = 1048576;

        /// <summary>Encodes a message into its four frames, signed.</summary>
        /// <exception cref="ArgumentException">The header's type is not the message's type.</exception>
        public static byte[][] Encode(Header header, IgiMessage message, Signer signer)
        {
            if (header.Type != message.Type)
                throw new ArgumentException("header type '" + header.Type + "' != message type '" + message.Type + "'");
            var hw = new MsgPackWriter();
            header.Write(hw);
            byte[] headerBytes = hw.ToArray();
            byte[] contentBytes = message.EncodeContent();
            return new[] { (byte[])Magic.Clone(), signer.Sign(headerBytes, contentBytes), headerBytes, contentBytes };
        }

        /// <summary>
        /// Checks the frame shape and the signature, then decodes the header and the content.
        /// Order (PROTOCOL.md section 2): frame count, magic and signature-frame shape (bad_frame), HMAC (bad_signature),
        /// header, major version (unsupported_version), known type (unknown_type), session_id when required, content.
        /// </summary>
        /// <exception cref="IgiProtocolException">Any failure; its Classification names the class of failure.</exception>
        public static Envelope Decode(IList<byte[]> frames, Signer signer, int maxFrameBytes = DefaultMaxFrameBytes)
        {
            CheckFrames(frames);
            if (!signer.Verify(frames[1], frames[2], frames[3]))
                throw new IgiSignatureException("HMAC-SHA256 signature does not match");
            Header header = DecodeHeader(frames[2], maxFrameBytes);
            return new Envelope { Header = header, Message = DecodeContent(header, frames[3], maxFrameBytes) };
        }

        /// <summary>Checks the [magic, signature, header, content] shape without verifying the HMAC.</summary>
        /// <exception cref="IgiFrameException">Wrong frame count, magic, or a signature frame that is not 64 lowercase hex bytes.</exception>
        public static void CheckFrames(IList<byte[]> frames)
        {
            if (frames == null || frames.Count != 4)
                throw new IgiFrameException("expected 4 frames, got " + (frames == null ? 0 : frames.Count));
            if (!Same(frames[0], Magic)) throw new IgiFrameException("first frame is not the magic \"IGI1\"");
            byte[] sig = frames[1];
            if (sig == null || sig.Length != 64) throw new IgiFrameException("signature frame must be 64 bytes");
            foreach (byte b in sig)
                if (!((b >= (byte)'0' && b <= (byte)'9') || (b >= (byte)'a' && b <= (byte)'f')))
                    throw new IgiFrameException("signature frame is not lowercase hex");
        }

        /// <summary>Decodes and validates the header frame.</summary>
        public static Header DecodeHeader(byte[] headerBytes, int maxFrameBytes = DefaultMaxFrameBytes)
        {
            return Header.Read(new FieldReader(Unpack(headerBytes, maxFrameBytes), "header"));
        }

        /// <summary>Checks the header's major version, type and session_id, then decodes the content frame of its type.</summary>
        public static IgiMessage DecodeContent(Header header, byte[] contentBytes, int maxFrameBytes = DefaultMaxFrameBytes)
        {
            if (header.Major != IgiVersion.ProtocolMajor)
                throw new IgiProtocolException("header protocol_version " + header.ProtocolVersion + " has another major than " +
                                               IgiVersion.Protocol, ErrorCodes.UnsupportedVersion);
            if (!MessageRegistry.IsKnown(header.Type)) throw new IgiUnknownTypeException(header.Type);
            if (MessageRegistry.RequiresSession(header.Type) && header.SessionId == null)
                throw new IgiProtocolException(header.Type + " requires header.session_id");
            return MessageRegistry.Read(header.Type, Unpack(contentBytes, maxFrameBytes));
        }

        /// <summary>Decodes one frame with the size limit (too_large) and safe msgpack limits.</summary>
        public static object Unpack(byte[] data, int maxFrameBytes = DefaultMaxFrameBytes)
        {
            if (data.Length > maxFrameBytes)
                throw new MsgPackException(MsgPackErrorKind.TooLarge, 0, "frame of " + data.Length + " bytes exceeds " + maxFrameBytes);
            return MsgPackReader.Decode(data, new MsgPackLimits { MaxInputBytes = maxFrameBytes });
        }

        private static bool Same(byte[] a, byte[] b)
        {
            if (a == null || a.Length != b.Length) return false;
            for (int i = 0; i < a.Length; i++) if (a[i] != b[i]) return false;
            return true;
        }
    }
}
