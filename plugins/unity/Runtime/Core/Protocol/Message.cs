// Layer: core/protocol. Base of the typed messages and the type registry (wire "type" -> reader).
using System;
using System.Collections.Generic;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>Role of a message in the exchange.</summary>
    public enum MessageKind
    {
        /// <summary>Sent by the client; answered by exactly one terminal reply.</summary>
        Request,
        /// <summary>Terminal answer to a request (parent_id = request msg_id).</summary>
        Reply,
        /// <summary>Non-terminal push (token_event).</summary>
        Event,
    }

    /// <summary>
    /// A typed protocol message. The content map holds its fields in spec order; <see cref="Type"/> travels
    /// in the header only.
    /// </summary>
    public abstract class IgiMessage : IWireObject
    {
        /// <summary>The wire type string, e.g. "generate_request".</summary>
        public abstract string Type { get; }

        /// <summary>Request, reply or event.</summary>
        public virtual MessageKind Kind { get { return MessageKind.Reply; } }

        /// <summary>The header's session_id must be set (requests about one NPC session).</summary>
        public virtual bool RequiresSession { get { return false; } }

        /// <summary>Writes the content map.</summary>
        public abstract void Write(MsgPackWriter writer);

        /// <summary>The canonical content frame.</summary>
        public byte[] EncodeContent()
        {
            var w = new MsgPackWriter();
            Write(w);
            return w.ToArray();
        }
    }

    /// <summary>A request: <see cref="MessageKind.Request"/>.</summary>
    public abstract class IgiRequest : IgiMessage
    {
        /// <inheritdoc/>
        public override MessageKind Kind { get { return MessageKind.Request; } }

        /// <summary>The type of the successful terminal reply (error_reply can end any request).</summary>
        public abstract string ReplyType { get; }

        /// <summary>
        /// Checks the rules that span several fields (the decoder runs them after reading a request; the client runs
        /// them before sending one, so a request the daemon would refuse never leaves). Nothing to check by default.
        /// </summary>
        /// <exception cref="IgiProtocolException">A rule is broken (classification invalid_request).</exception>
        public virtual void Validate() { }
    }

    /// <summary>Maps wire type strings to content readers for every message of protocol 1.x.</summary>
    public static class MessageRegistry
    {
        private static readonly Dictionary<string, Func<FieldReader, IgiMessage>> Readers =
            new Dictionary<string, Func<FieldReader, IgiMessage>>(StringComparer.Ordinal)
            {
                { HelloRequest.TypeName, HelloRequest.Read },
                { HelloReply.TypeName, HelloReply.Read },
                { LoadModelRequest.TypeName, LoadModelRequest.Read },
                { LoadModelReply.TypeName, LoadModelReply.Read },
                { SetBudgetRequest.TypeName, SetBudgetRequest.Read },
                { ReclaimRequest.TypeName, ReclaimRequest.Read },
                { BudgetAck.TypeName, BudgetAck.Read },
                { FrameStatsRequest.TypeName, FrameStatsRequest.Read },
                { FrameStatsReply.TypeName, FrameStatsReply.Read },
                { CreateSessionRequest.TypeName, CreateSessionRequest.Read },
                { CreateSessionReply.TypeName, CreateSessionReply.Read },
                { CloseSessionRequest.TypeName, r => new CloseSessionRequest() },
                { CloseSessionReply.TypeName, r => new CloseSessionReply() },
                { GenerateRequest.TypeName, GenerateRequest.Read },
                { TokenEvent.TypeName, TokenEvent.Read },
                { GenerateReply.TypeName, GenerateReply.Read },
                { CancelRequest.TypeName, CancelRequest.Read },
                { CancelReply.TypeName, CancelReply.Read },
                { SaveSessionRequest.TypeName, SaveSessionRequest.Read },
                { SaveSessionReply.TypeName, SaveSessionReply.Read },
                { LoadSessionRequest.TypeName, LoadSessionRequest.Read },
                { LoadSessionReply.TypeName, LoadSessionReply.Read },
                { StatusRequest.TypeName, r => new StatusRequest() },
                { StatusReply.TypeName, StatusReply.Read },
                { HeartbeatRequest.TypeName, r => new HeartbeatRequest() },
                { HeartbeatReply.TypeName, HeartbeatReply.Read },
                { ShutdownRequest.TypeName, r => new ShutdownRequest() },
                { ShutdownReply.TypeName, r => new ShutdownReply() },
                { ErrorReply.TypeName, ErrorReply.Read },
            };

        private static readonly HashSet<string> SessionTypes = new HashSet<string>(StringComparer.Ordinal)
        {
            CloseSessionRequest.TypeName, GenerateRequest.TypeName, SaveSessionRequest.TypeName,
        };

        /// <summary>True when messages of this type need header.session_id ("session: required").</summary>
        public static bool RequiresSession(string type) { return type != null && SessionTypes.Contains(type); }

        /// <summary>Every known type string.</summary>
        public static ICollection<string> KnownTypes { get { return Readers.Keys; } }

        /// <summary>True when the type string is part of the protocol.</summary>
        public static bool IsKnown(string type) { return type != null && Readers.ContainsKey(type); }

        /// <summary>Decodes a content map into the typed message named by <paramref name="type"/>.</summary>
        /// <exception cref="IgiUnknownTypeException">The type is not part of the protocol.</exception>
        /// <exception cref="IgiProtocolException">The content does not match the type's schema.</exception>
        public static IgiMessage Read(string type, object content)
        {
            Func<FieldReader, IgiMessage> read;
            if (!Readers.TryGetValue(type, out read)) throw new IgiUnknownTypeException(type);
            return read(new FieldReader(content, type));
        }
    }

    /// <summary>A header whose type is not part of the protocol (answered by unknown_type).</summary>
    public sealed class IgiUnknownTypeException : IgiProtocolException
    {
        /// <summary>The unknown type string.</summary>
        public string MessageType { get; private set; }

        /// <summary>Creates the exception.</summary>
        public IgiUnknownTypeException(string type) : base("unknown message type '" + type + "'", "unknown_type") { MessageType = type; }
    }
}
