// Layer: core/protocol. Nested value objects carried inside messages (field order = wire order).
using System.Collections.Generic;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>Sampling parameters of a session or one generation (llama.cpp sampler vocabulary).</summary>
    public sealed class Sampling : IWireObject
    {
        /// <summary>Most stop strings accepted.</summary>
        public const int MaxStopStrings = 8;
        /// <summary>0 = greedy. Range [0, 5].</summary>
        public double Temperature = 0.7;
        /// <summary>Nucleus sampling mass, (0, 1].</summary>
        public double TopP = 0.95;
        /// <summary>0 = disabled.</summary>
        public long TopK = 40;
        /// <summary>uint32 RNG seed; null = random.</summary>
        public long? Seed;
        /// <summary>Completion tokens per generation (>= 1).</summary>
        public long MaxTokens = 128;
        /// <summary>Stop strings (at most 8).</summary>
        public List<string> Stop = new List<string>();

        /// <summary>Greedy decoding (temperature 0), the deterministic choice for tests and scripted lines.</summary>
        public static Sampling Greedy(long maxTokens = 128)
        {
            return new Sampling { Temperature = 0.0, MaxTokens = maxTokens };
        }

        /// <inheritdoc/>
        public void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 6).F64("temperature", Temperature).F64("top_p", TopP).Int("top_k", TopK)
                .Int("seed", Seed).Int("max_tokens", MaxTokens).StrList("stop", Stop);
        }

        /// <summary>Reads the object.</summary>
        public static Sampling Read(FieldReader r)
        {
            return new Sampling
            {
                Temperature = r.F64("temperature", false, dflt: 0.7, min: 0.0, max: 5.0).Value,
                TopP = r.F64("top_p", false, dflt: 0.95, min: 0.0, max: 1.0, exclusiveMin: true).Value,
                TopK = r.Int("top_k", false, dflt: 40, min: 0).Value,
                Seed = r.Int("seed", false, true, min: 0, max: uint.MaxValue),
                MaxTokens = r.Int("max_tokens", false, dflt: 128, min: 1).Value,
                Stop = r.StrList("stop", MaxStopStrings),
            };
        }
    }

    /// <summary>Limits the daemon enforces, announced in hello_reply.</summary>
    public sealed class Limits : IWireObject
    {
        /// <summary>Largest header or content frame, bytes.</summary>
        public long MaxFrameBytes = 1048576;
        /// <summary>Prompt tokens per generation including history.</summary>
        public long MaxPromptTokens = 4096;
        /// <summary>Open NPC sessions across all clients.</summary>
        public long MaxSessions = 64;
        /// <summary>Queued generate_requests before busy.</summary>
        public long MaxQueueDepth = 16;
        /// <summary>1.4: priority points a queued generate_request gains per second it waits (>= 0), so no NPC waits
        /// for ever behind higher priorities: the daemon ranks a request as if it had arrived priority /
        /// PriorityAgeingPerS seconds earlier. 0 (absent: a daemon older than 1.4) = strict priority.</summary>
        public double PriorityAgeingPerS;

        /// <inheritdoc/>
        public void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 5).Int("max_frame_bytes", MaxFrameBytes).Int("max_prompt_tokens", MaxPromptTokens)
                .Int("max_sessions", MaxSessions).Int("max_queue_depth", MaxQueueDepth)
                .F64("priority_ageing_per_s", PriorityAgeingPerS);
        }

        /// <summary>Reads the object.</summary>
        public static Limits Read(FieldReader r)
        {
            return new Limits
            {
                MaxFrameBytes = r.Int("max_frame_bytes", false, dflt: 1048576, min: 1024).Value,
                MaxPromptTokens = r.Int("max_prompt_tokens", false, dflt: 4096, min: 1).Value,
                MaxSessions = r.Int("max_sessions", false, dflt: 64, min: 1).Value,
                MaxQueueDepth = r.Int("max_queue_depth", false, dflt: 16, min: 1).Value,
                PriorityAgeingPerS = r.F64("priority_ageing_per_s", false, dflt: 0.0, min: 0.0).Value,
            };
        }
    }

    /// <summary>The loaded model.</summary>
    public sealed class ModelInfo : IWireObject
    {
        /// <summary>Absolute path of the GGUF file.</summary>
        public string Path;
        /// <summary>GGUF general.architecture, e.g. "llama".</summary>
        public string Architecture;
        /// <summary>Number of transformer blocks.</summary>
        public long NLayer;
        /// <summary>Parameter count when known.</summary>
        public long? NParams;
        /// <summary>GGUF file size, MiB.</summary>
        public double FileMib;
        /// <summary>Context length the model was loaded with, tokens.</summary>
        public long NCtx;

        /// <inheritdoc/>
        public void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 6).Str("path", Path).Str("architecture", Architecture).Int("n_layer", NLayer)
                .Int("n_params", NParams).F64("file_mib", FileMib).Int("n_ctx", NCtx);
        }

        /// <summary>Reads the object.</summary>
        public static ModelInfo Read(FieldReader r)
        {
            return new ModelInfo
            {
                Path = r.Str("path"),
                Architecture = r.Str("architecture"),
                NLayer = r.Int("n_layer", min: 0).Value,
                NParams = r.Int("n_params", false, true, min: 0),
                FileMib = r.F64("file_mib", min: 0.0).Value,
                NCtx = r.Int("n_ctx", min: 0).Value,
            };
        }
    }

    /// <summary>Summary of the placement plan in force (or proposed).</summary>
    public sealed class Plan : IWireObject
    {
        /// <summary>Planner strategy name, e.g. "cpu_only", "full_gpu", "layer_split".</summary>
        public string Strategy;
        /// <summary>Predicted device memory, MiB.</summary>
        public double GpuMib;
        /// <summary>Predicted host memory, MiB.</summary>
        public double CpuMib;
        /// <summary>llama.cpp n_gpu_layers when the strategy uses it.</summary>
        public long? NGpuLayers;
        /// <summary>One human-readable line.</summary>
        public string Summary = "";

        /// <inheritdoc/>
        public void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 5).Str("strategy", Strategy).F64("gpu_mib", GpuMib).F64("cpu_mib", CpuMib)
                .Int("n_gpu_layers", NGpuLayers).Str("summary", Summary);
        }

        /// <summary>Reads the object.</summary>
        public static Plan Read(FieldReader r)
        {
            return new Plan
            {
                Strategy = r.Str("strategy"),
                GpuMib = r.F64("gpu_mib", min: 0.0).Value,
                CpuMib = r.F64("cpu_mib", min: 0.0).Value,
                NGpuLayers = r.Int("n_gpu_layers", false, true, min: 0),
                Summary = r.Str("summary", false, dflt: ""),
            };
        }
    }

    /// <summary>How the daemon paces token generation to protect the game's frame time.</summary>
    public sealed class Throttle : IWireObject
    {
        /// <summary>Max tokens per game frame; null = unlimited.</summary>
        public long? TokensPerFrame;
        /// <summary>Pause between two decoded tokens, ms.</summary>
        public double SleepMsBetweenTokens;

        /// <inheritdoc/>
        public void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 2).Int("tokens_per_frame", TokensPerFrame).F64("sleep_ms_between_tokens", SleepMsBetweenTokens);
        }

        /// <summary>Reads the object.</summary>
        public static Throttle Read(FieldReader r)
        {
            return new Throttle
            {
                TokensPerFrame = r.Int("tokens_per_frame", false, true, min: 0),
                SleepMsBetweenTokens = r.F64("sleep_ms_between_tokens", false, dflt: 0.0, min: 0.0).Value,
            };
        }
    }

    /// <summary>Token counts of one generation.</summary>
    public sealed class Usage : IWireObject
    {
        /// <summary>Tokens evaluated for the prompt (including cached history).</summary>
        public long PromptTokens;
        /// <summary>Tokens generated.</summary>
        public long CompletionTokens;

        /// <inheritdoc/>
        public void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 2).Int("prompt_tokens", PromptTokens).Int("completion_tokens", CompletionTokens);
        }

        /// <summary>Reads the object.</summary>
        public static Usage Read(FieldReader r)
        {
            return new Usage
            {
                PromptTokens = r.Int("prompt_tokens", min: 0).Value,
                CompletionTokens = r.Int("completion_tokens", min: 0).Value,
            };
        }
    }

    /// <summary>1.1: a tool an NPC session may call (create_session_request.tools).</summary>
    public sealed class Tool : IWireObject
    {
        /// <summary>1-64 of A-Z a-z 0-9 _ -, not starting with a digit or '-'.</summary>
        public string Name = "";
        /// <summary>What the tool does, shown to the model (&lt;= 1024 characters).</summary>
        public string Description = "";
        /// <summary>JSON Schema of the arguments object, as JSON text (&lt;= 16384 characters).</summary>
        public string Parameters = "{}";

        /// <inheritdoc/>
        public void Write(MsgPackWriter w) { new FieldWriter(w, 3).Str("name", Name).Str("description", Description).Str("parameters", Parameters); }

        /// <summary>Reads the object.</summary>
        public static Tool Read(FieldReader r)
        {
            return new Tool
            {
                Name = r.ToolName("name"),
                Description = r.Str("description", false, dflt: "", maxLength: 1024),
                Parameters = r.Str("parameters", false, dflt: "{}", maxLength: 16384),
            };
        }
    }

    /// <summary>1.1: a tool call the NPC made (generate_reply.tool_call, finish_reason "tool_call").</summary>
    public sealed class ToolCall : IWireObject
    {
        /// <summary>The call's id; the tool_result that answers it names it.</summary>
        public string Id = "";
        /// <summary>A tool the session registered.</summary>
        public string Name = "";
        /// <summary>JSON text of the arguments, valid against the tool's parameters (feed it to JsonUtility.FromJson).</summary>
        public string Arguments = "{}";

        /// <inheritdoc/>
        public void Write(MsgPackWriter w) { new FieldWriter(w, 3).Str("id", Id).Str("name", Name).Str("arguments", Arguments); }

        /// <summary>Reads the object.</summary>
        public static ToolCall Read(FieldReader r)
        {
            return new ToolCall { Id = r.SessionId("id"), Name = r.ToolName("name"), Arguments = r.Str("arguments") };
        }
    }

    /// <summary>1.1: the game's answer to a tool call (generate_request.tool_result).</summary>
    public sealed class ToolResult : IWireObject
    {
        /// <summary>The ToolCall.Id answered.</summary>
        public string CallId = "";
        /// <summary>The tool called.</summary>
        public string Name = "";
        /// <summary>What happened, for the model (free text or JSON, &lt;= 16384 characters).</summary>
        public string Content = "";

        /// <inheritdoc/>
        public void Write(MsgPackWriter w) { new FieldWriter(w, 3).Str("call_id", CallId).Str("name", Name).Str("content", Content); }

        /// <summary>Reads the object.</summary>
        public static ToolResult Read(FieldReader r)
        {
            return new ToolResult { CallId = r.SessionId("call_id"), Name = r.ToolName("name"), Content = r.Str("content", false, dflt: "", maxLength: 16384) };
        }
    }
}
