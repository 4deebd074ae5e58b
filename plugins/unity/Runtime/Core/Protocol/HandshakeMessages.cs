// Layer: core/protocol. Handshake, model, budget and frame-pacing messages.
using System.Collections.Generic;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>First message of a client: identifies it and negotiates the protocol version.</summary>
    public sealed class HelloRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "hello_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return HelloReply.TypeName; } }
        /// <summary>e.g. "unity-plugin".</summary>
        public string ClientName = "unity-plugin";
        /// <summary>Client software version.</summary>
        public string ClientVersion = IgiVersion.Plugin;
        /// <summary>Protocol version the client speaks.</summary>
        public string ProtocolVersion = IgiVersion.Protocol;
        /// <summary>Optional features the client supports.</summary>
        public List<string> Capabilities = new List<string>();

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 4).Str("client_name", ClientName).Str("client_version", ClientVersion)
                .Str("protocol_version", ProtocolVersion).StrList("capabilities", Capabilities);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new HelloRequest
            {
                ClientName = r.Str("client_name", maxLength: 256),
                ClientVersion = r.Str("client_version", maxLength: 64),
                ProtocolVersion = r.Version("protocol_version"),
                Capabilities = r.StrList("capabilities", 64),
            };
        }
    }

    /// <summary>The daemon's answer to hello: versions, timing rules, limits and the loaded model.</summary>
    public sealed class HelloReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "hello_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>igi_sdk version of the daemon.</summary>
        public string DaemonVersion;
        /// <summary>Protocol version the daemon speaks.</summary>
        public string ProtocolVersion;
        /// <summary>Optional features the daemon supports.</summary>
        public List<string> Capabilities = new List<string>();
        /// <summary>The client sends heartbeat_request this often, s, as announced; the client reads a value under <see cref="Igi.Client.IgiClient.MinHeartbeatIntervalS"/> as that minimum.</summary>
        public double HeartbeatIntervalS;
        /// <summary>Silence after which a peer is declared gone, s.</summary>
        public double ClientTimeoutS;
        /// <summary>Limits the daemon enforces.</summary>
        public Limits Limits = new Limits();
        /// <summary>Loaded model, null if none.</summary>
        public ModelInfo Model;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 7).Str("daemon_version", DaemonVersion).Str("protocol_version", ProtocolVersion)
                .StrList("capabilities", Capabilities).F64("heartbeat_interval_s", HeartbeatIntervalS)
                .F64("client_timeout_s", ClientTimeoutS).Obj("limits", Limits).Obj("model", Model);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new HelloReply
            {
                DaemonVersion = r.Str("daemon_version"),
                ProtocolVersion = r.Version("protocol_version"),
                Capabilities = r.StrList("capabilities"),
                HeartbeatIntervalS = r.F64("heartbeat_interval_s", min: 0.0).Value,
                ClientTimeoutS = r.F64("client_timeout_s", min: 0.0).Value,
                Limits = r.Obj("limits", Limits.Read),
                Model = r.Obj("model", ModelInfo.Read, true, true),
            };
        }
    }

    /// <summary>Load (or replace) the model.</summary>
    public sealed class LoadModelRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "load_model_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return LoadModelReply.TypeName; } }
        /// <summary>GGUF path; null = the embedded default model.</summary>
        public string ModelPath;
        /// <summary>Context length, tokens (>= 16).</summary>
        public long NCtx = 2048;
        /// <summary>New VRAM budget, MiB; null = keep the current one.</summary>
        public long? VramBudgetMib;
        /// <summary>1.1: vision projector (mmproj GGUF) beside the model; null = none (no vision).</summary>
        public string MmprojPath;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 4).Str("model_path", ModelPath).Int("n_ctx", NCtx).Int("vram_budget_mib", VramBudgetMib)
                .Str("mmproj_path", MmprojPath);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new LoadModelRequest
            {
                ModelPath = r.Str("model_path", false, true),
                NCtx = r.Int("n_ctx", false, dflt: 2048, min: 16).Value,
                VramBudgetMib = r.Int("vram_budget_mib", false, true, min: 0),
                MmprojPath = r.Str("mmproj_path", false, true),
            };
        }
    }

    /// <summary>The model is loaded under the returned plan.</summary>
    public sealed class LoadModelReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "load_model_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>The loaded model.</summary>
        public ModelInfo Model;
        /// <summary>The plan in force.</summary>
        public Plan Plan;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 2).Obj("model", Model).Obj("plan", Plan); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new LoadModelReply { Model = r.Obj("model", ModelInfo.Read), Plan = r.Obj("plan", Plan.Read) };
        }
    }

    /// <summary>Change the VRAM budget the game allows the daemon.</summary>
    public sealed class SetBudgetRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "set_budget_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return BudgetAck.TypeName; } }
        /// <summary>VRAM the game allows, MiB (0 = CPU only).</summary>
        public long VramBudgetMib;
        /// <summary>Free text for logs, e.g. "entering combat".</summary>
        public string Reason = "";
        /// <summary>1.3: the budget levels the game will ask for, MiB (at most <see cref="MaxLevels"/>), planned ahead
        /// by the daemon; null = the levels declared before stay, empty = none.</summary>
        public List<long> LevelsMib;
        /// <summary>Most entries of <see cref="LevelsMib"/>.</summary>
        public const int MaxLevels = 16;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 3).Int("vram_budget_mib", VramBudgetMib).Str("reason", Reason).IntList("levels_mib", LevelsMib);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new SetBudgetRequest
            {
                VramBudgetMib = r.Int("vram_budget_mib", min: 0).Value,
                Reason = r.Str("reason", false, dflt: "", maxLength: 256),
                LevelsMib = r.OptIntList("levels_mib", MaxLevels, min: 0),
            };
        }
    }

    /// <summary>Urgently shrink VRAM use to the budget within a deadline (priority path).</summary>
    public sealed class ReclaimRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "reclaim_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return BudgetAck.TypeName; } }
        /// <summary>VRAM the daemon may keep, MiB.</summary>
        public long VramBudgetMib;
        /// <summary>Time the game can wait, s from receipt.</summary>
        public double DeadlineS;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 2).Int("vram_budget_mib", VramBudgetMib).F64("deadline_s", DeadlineS); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new ReclaimRequest
            {
                VramBudgetMib = r.Int("vram_budget_mib", min: 0).Value,
                DeadlineS = r.F64("deadline_s", min: 0.0).Value,
            };
        }
    }

    /// <summary>Terminal reply of set_budget_request and reclaim_request.</summary>
    public sealed class BudgetAck : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "budget_ack";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>The budget asked for, MiB.</summary>
        public long RequestedMib;
        /// <summary>The budget the daemon now honours, MiB (&lt;= requested).</summary>
        public long GrantedMib;
        /// <summary>The plan is in force now (false: deferred until idle).</summary>
        public bool Applied;
        /// <summary>The plan runs fully on the CPU.</summary>
        public bool CpuFallback;
        /// <summary>The plan.</summary>
        public Plan Plan;
        /// <summary>Predicted time to first token, s.</summary>
        public double PredictedTtftS;
        /// <summary>Predicted decode speed, tokens/s.</summary>
        public double PredictedTps;
        /// <summary>Time spent applying the plan (reload), s.</summary>
        public double ApplyTimeS;
        /// <summary>Device memory in use after applying, MiB; null = no GPU.</summary>
        public double? MeasuredVramMib;
        /// <summary>e.g. "deadline_missed"; null = none.</summary>
        public string Warning;
        /// <summary>1.3: true = the placement in force is one planned ahead that fits the budget, put in force at once
        /// to release VRAM first; the daemon's exact plan follows in the background without another reply. Null (a
        /// daemon older than 1.3) or false: the plan is the one for the budget. See <see cref="IsInterim"/>.</summary>
        public bool? Interim;

        /// <summary><see cref="Interim"/> with null read as false.</summary>
        public bool IsInterim { get { return Interim == true; } }

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 11).Int("requested_mib", RequestedMib).Int("granted_mib", GrantedMib).Bool("applied", Applied)
                .Bool("cpu_fallback", CpuFallback).Obj("plan", Plan).F64("predicted_ttft_s", PredictedTtftS)
                .F64("predicted_tps", PredictedTps).F64("apply_time_s", ApplyTimeS)
                .F64("measured_vram_mib", MeasuredVramMib).Str("warning", Warning).Bool("interim", Interim);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new BudgetAck
            {
                RequestedMib = r.Int("requested_mib", min: 0).Value,
                GrantedMib = r.Int("granted_mib", min: 0).Value,
                Applied = r.Bool("applied").Value,
                CpuFallback = r.Bool("cpu_fallback").Value,
                Plan = r.Obj("plan", Plan.Read),
                PredictedTtftS = r.F64("predicted_ttft_s", min: 0.0).Value,
                PredictedTps = r.F64("predicted_tps", min: 0.0).Value,
                ApplyTimeS = r.F64("apply_time_s", min: 0.0).Value,
                MeasuredVramMib = r.F64("measured_vram_mib", true, true, min: 0.0),
                Warning = r.Str("warning", false, true),
                Interim = r.Bool("interim", false, true),
            };
        }
    }

    /// <summary>The game's frame timing, so the daemon can pace generation.</summary>
    public sealed class FrameStatsRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "frame_stats_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return FrameStatsReply.TypeName; } }
        /// <summary>Last (or smoothed) frame time, ms.</summary>
        public double FrameTimeMs;
        /// <summary>Frame time the game aims for, ms.</summary>
        public double TargetFrameTimeMs;
        /// <summary>Free device memory seen by the game, MiB; null = unknown.</summary>
        public double? FreeVramMib;
        /// <summary>GPU utilisation seen by the game, %; null = unknown.</summary>
        public double? GpuBusyPct;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 4).F64("frame_time_ms", FrameTimeMs).F64("target_frame_time_ms", TargetFrameTimeMs)
                .F64("free_vram_mib", FreeVramMib).F64("gpu_busy_pct", GpuBusyPct);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new FrameStatsRequest
            {
                FrameTimeMs = r.F64("frame_time_ms", min: 0.0).Value,
                TargetFrameTimeMs = r.F64("target_frame_time_ms", min: 0.0).Value,
                FreeVramMib = r.F64("free_vram_mib", false, true, min: 0.0),
                GpuBusyPct = r.F64("gpu_busy_pct", false, true, min: 0.0, max: 100.0),
            };
        }
    }

    /// <summary>The pacing the daemon applies now, and optionally a budget it would like.</summary>
    public sealed class FrameStatsReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "frame_stats_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>The pacing in force.</summary>
        public Throttle Throttle = new Throttle();
        /// <summary>Budget the daemon suggests, MiB; null = none.</summary>
        public long? ProposedBudgetMib;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 2).Obj("throttle", Throttle).Int("proposed_budget_mib", ProposedBudgetMib); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new FrameStatsReply
            {
                Throttle = r.Obj("throttle", Throttle.Read),
                ProposedBudgetMib = r.Int("proposed_budget_mib", false, true, min: 0),
            };
        }
    }
}
