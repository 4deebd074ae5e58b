// Layer: core/protocol. Daemon-level messages: status, heartbeat, shutdown, error_reply.
using System.Collections.Generic;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>Ask for the daemon's state.</summary>
    public sealed class StatusRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "status_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return StatusReply.TypeName; } }
        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { w.WriteMapHeader(0); }
    }

    /// <summary>The daemon's state.</summary>
    public sealed class StatusReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "status_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>Loaded model, null if none.</summary>
        public ModelInfo Model;
        /// <summary>Budget in force, MiB; null = never set.</summary>
        public long? VramBudgetMib;
        /// <summary>Plan in force, null if none.</summary>
        public Plan Plan;
        /// <summary>Device memory in use, MiB; null = no GPU.</summary>
        public double? VramUsedMib;
        /// <summary>Open sessions.</summary>
        public long NSessions;
        /// <summary>Queued generate_requests.</summary>
        public long QueueDepth;
        /// <summary>Named counters (keys sorted on the wire).</summary>
        public MsgPackMap Counters = new MsgPackMap();
        /// <summary>Daemon uptime, s.</summary>
        public double UptimeS;

        /// <summary>The value of a named counter, 0 when absent.</summary>
        public long Counter(string name)
        {
            object v = Counters[name];
            return v is long ? (long)v : 0;
        }

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 8).Obj("model", Model).Int("vram_budget_mib", VramBudgetMib).Obj("plan", Plan)
                .F64("vram_used_mib", VramUsedMib).Int("n_sessions", NSessions).Int("queue_depth", QueueDepth)
                .FreeMap("counters", Counters).F64("uptime_s", UptimeS);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            var reply = new StatusReply
            {
                Model = r.Obj("model", ModelInfo.Read, true, true),
                VramBudgetMib = r.Int("vram_budget_mib", true, true, min: 0),
                Plan = r.Obj("plan", Plan.Read, true, true),
                VramUsedMib = r.F64("vram_used_mib", true, true, min: 0.0),
                NSessions = r.Int("n_sessions", min: 0).Value,
                QueueDepth = r.Int("queue_depth", min: 0).Value,
                Counters = r.FreeMap("counters", false, false),
                UptimeS = r.F64("uptime_s", min: 0.0).Value,
            };
            foreach (var kv in reply.Counters.Entries)
            {
                if (!(kv.Value is long) || (long)kv.Value < 0)
                    throw new IgiProtocolException("invalid status_reply: counter '" + kv.Key + "' must be a non-negative int");
            }
            return reply;
        }
    }

    /// <summary>Liveness probe; answered from the daemon's I/O loop.</summary>
    public sealed class HeartbeatRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "heartbeat_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return HeartbeatReply.TypeName; } }
        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { w.WriteMapHeader(0); }
    }

    /// <summary>Liveness answer.</summary>
    public sealed class HeartbeatReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "heartbeat_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>Daemon uptime, s.</summary>
        public double UptimeS;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 1).F64("uptime_s", UptimeS); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r) { return new HeartbeatReply { UptimeS = r.F64("uptime_s", min: 0.0).Value }; }
    }

    /// <summary>Ask the daemon to cancel all work, free memory and exit.</summary>
    public sealed class ShutdownRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "shutdown_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return ShutdownReply.TypeName; } }
        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { w.WriteMapHeader(0); }
    }

    /// <summary>Sent before the daemon exits.</summary>
    public sealed class ShutdownReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "shutdown_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { w.WriteMapHeader(0); }
    }

    /// <summary>Terminal reply of any request that failed.</summary>
    public sealed class ErrorReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "error_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>One of <see cref="ErrorCodes"/>; unknown codes from a newer daemon read as "internal".</summary>
        public string Code;
        /// <summary>Human-readable, for logs.</summary>
        public string Message = "";
        /// <summary>Structured detail (keys sorted), null = none.</summary>
        public MsgPackMap Detail;
        /// <summary>The same request may succeed later.</summary>
        public bool Retryable;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 4).Str("code", Code).Str("message", Message).FreeMap("detail", Detail).Bool("retryable", Retryable);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new ErrorReply
            {
                Code = ErrorCodes.Parse(r.Str("code")),
                Message = r.Str("message"),
                Detail = r.FreeMap("detail"),
                Retryable = r.Bool("retryable", false, dflt: false).Value,
            };
        }
    }

    /// <summary>Versions of the plugin and of the protocol it speaks.</summary>
    public static class IgiVersion
    {
        /// <summary>The plugin version (package.json "version").</summary>
        public const string Plugin = "0.1.0";
        /// <summary>The protocol version, "major.minor".</summary>
        public const string Protocol = "1.4";
        /// <summary>What a header without protocol_version is read as (PROTOCOL.md section 3): always the first
        /// version, whatever minor this plugin speaks. Senders always write <see cref="Protocol"/>.</summary>
        public const string AbsentHeaderProtocol = "1.0";
        /// <summary>The protocol major version; a daemon with another major is refused.</summary>
        public const int ProtocolMajor = 1;
    }
}
