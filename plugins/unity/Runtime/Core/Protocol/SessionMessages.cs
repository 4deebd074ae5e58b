// Layer: core/protocol. NPC session and generation messages.
using System;
using System.Collections.Generic;
using Igi.MsgPack;

namespace Igi.Protocol
{
    /// <summary>Generation outcome carried by generate_reply.finish_reason.</summary>
    public static class FinishReason
    {
        /// <summary>End of turn or a stop string.</summary>
        public const string Stop = "stop";
        /// <summary>max_tokens reached.</summary>
        public const string Length = "length";
        /// <summary>cancel_request (or session close) ended it.</summary>
        public const string Cancelled = "cancelled";
        /// <summary>The engine failed mid-generation.</summary>
        public const string Error = "error";

        /// <summary>1.1: the reply is a tool call (GenerateReply.ToolCall).</summary>
        public const string ToolCall = "tool_call";

        /// <summary>True for one of the five values.</summary>
        public static bool IsValid(string s) { return s == Stop || s == Length || s == Cancelled || s == Error || s == ToolCall; }
    }

    /// <summary>Open an NPC session (persona, system prompt, default sampling).</summary>
    public sealed class CreateSessionRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "create_session_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return CreateSessionReply.TypeName; } }
        /// <summary>1.1: longest grammar, characters.</summary>
        public const int MaxGrammarChars = 65536;
        /// <summary>1.1: longest JSON Schema text, characters.</summary>
        public const int MaxSchemaChars = 16384;
        /// <summary>1.1: most tools of one session.</summary>
        public const int MaxTools = 32;
        /// <summary>NPC name or role (&lt;= 256 characters).</summary>
        public string Persona = "";
        /// <summary>System message of the chat template.</summary>
        public string SystemPrompt = "";
        /// <summary>Default sampling of the session.</summary>
        public Sampling Sampling = new Sampling();
        /// <summary>-100..100, higher is served first.</summary>
        public long Priority;
        /// <summary>1.1: default GBNF grammar of the replies; null = none.</summary>
        public string Grammar;
        /// <summary>1.1: default JSON Schema of the replies, as JSON text; null = none.</summary>
        public string JsonSchema;
        /// <summary>1.1: tools the NPC may call (at most 32, distinct names).</summary>
        public List<Tool> Tools = new List<Tool>();

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 7).Str("persona", Persona).Str("system_prompt", SystemPrompt).Obj("sampling", Sampling).Int("priority", Priority)
                .Str("grammar", Grammar).Str("json_schema", JsonSchema).ObjList("tools", Tools);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            var request = new CreateSessionRequest
            {
                Persona = r.Str("persona", maxLength: 256),
                SystemPrompt = r.Str("system_prompt", maxLength: 65536),
                Sampling = r.Obj("sampling", Sampling.Read, false, false, () => new Sampling()),
                Priority = r.Int("priority", false, dflt: 0, min: -100, max: 100).Value,
                Grammar = r.OptText("grammar", 1, MaxGrammarChars),
                JsonSchema = r.OptText("json_schema", 1, MaxSchemaChars),
                Tools = r.ObjList("tools", Tool.Read, MaxTools),
            };
            request.Validate();
            return request;
        }

        /// <summary>At most one of Grammar and JsonSchema, and distinct tool names (ipc/PROTOCOL.md 7.4).</summary>
        /// <exception cref="IgiProtocolException">Either rule is broken (classification invalid_request).</exception>
        public override void Validate()
        {
            RequestRules.AtMostOneConstraint(TypeName, Grammar, JsonSchema);
            RequestRules.DistinctToolNames(TypeName, Tools);
        }
    }

    /// <summary>The checks across fields of the 1.1 session requests, shared by the decoder and the client.</summary>
    internal static class RequestRules
    {
        internal static void AtMostOneConstraint(string what, string grammar, string jsonSchema)
        {
            if (grammar != null && jsonSchema != null)
                throw new IgiProtocolException("invalid " + what + ": set at most one of 'grammar' and 'json_schema'");
        }

        internal static void DistinctToolNames(string what, List<Tool> tools)
        {
            if (tools == null) return;
            var seen = new HashSet<string>(StringComparer.Ordinal);
            foreach (Tool tool in tools)
            {
                if (tool == null) throw new IgiProtocolException("invalid " + what + ": field 'tools' holds a null tool");
                if (!seen.Add(tool.Name))
                    throw new IgiProtocolException("invalid " + what + ": field 'tools' names '" + tool.Name + "' twice (tool names must be distinct)");
            }
        }
    }

    /// <summary>The new session; its id is also in the reply header's session_id.</summary>
    public sealed class CreateSessionReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "create_session_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>The session id.</summary>
        public string SessionId;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 1).Str("session_id", SessionId); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r) { return new CreateSessionReply { SessionId = r.SessionId("session_id") }; }
    }

    /// <summary>Close the header's session and free its KV state.</summary>
    public sealed class CloseSessionRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "close_session_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return CloseSessionReply.TypeName; } }
        /// <inheritdoc/>
        public override bool RequiresSession { get { return true; } }
        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { w.WriteMapHeader(0); }
    }

    /// <summary>The session is closed.</summary>
    public sealed class CloseSessionReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "close_session_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { w.WriteMapHeader(0); }
    }

    /// <summary>One player line for the header's session; answered by token_events then generate_reply.</summary>
    public sealed class GenerateRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "generate_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return GenerateReply.TypeName; } }
        /// <inheritdoc/>
        public override bool RequiresSession { get { return true; } }
        /// <summary>The player's line (user turn).</summary>
        public string Text = "";
        /// <summary>null = session default.</summary>
        public long? MaxTokens;
        /// <summary>null = session default.</summary>
        public Sampling Sampling;
        /// <summary>null = session priority.</summary>
        public long? Priority;
        /// <summary>1.1: GBNF grammar of this reply; null = the session's.</summary>
        public string Grammar;
        /// <summary>1.1: JSON Schema of this reply, as JSON text; null = the session's.</summary>
        public string JsonSchema;
        /// <summary>1.1: "auto" (null), "none", "required" or the name of a registered tool.</summary>
        public string ToolChoice;
        /// <summary>1.1: the game's answer to the session's last tool call (Text is then "" or a line after it).</summary>
        public ToolResult ToolResult;
        /// <summary>1.1: an image the NPC is shown with this line (see <see cref="Protocol.Image"/>); null = none.</summary>
        public Image Image;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 9).Str("text", Text).Int("max_tokens", MaxTokens).Obj("sampling", Sampling).Int("priority", Priority)
                .Str("grammar", Grammar).Str("json_schema", JsonSchema).Str("tool_choice", ToolChoice).Obj("tool_result", ToolResult)
                .Obj("image", Image);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            var request = new GenerateRequest
            {
                Text = r.Str("text", maxLength: 65536),
                MaxTokens = r.Int("max_tokens", false, true, min: 1),
                Sampling = r.Obj("sampling", Sampling.Read, false, true),
                Priority = r.Int("priority", false, true, min: -100, max: 100),
                Grammar = r.OptText("grammar", 1, CreateSessionRequest.MaxGrammarChars),
                JsonSchema = r.OptText("json_schema", 1, CreateSessionRequest.MaxSchemaChars),
                ToolChoice = r.OptToolName("tool_choice"),
                ToolResult = r.Obj("tool_result", ToolResult.Read, false, true),
                Image = r.Obj("image", Image.Read, false, true),
            };
            request.Validate();
            return request;
        }

        /// <summary>At most one of Grammar and JsonSchema (ipc/PROTOCOL.md 7.4).</summary>
        /// <exception cref="IgiProtocolException">Both are set (classification invalid_request).</exception>
        public override void Validate() { RequestRules.AtMostOneConstraint(TypeName, Grammar, JsonSchema); }
    }

    /// <summary>One generated token (non-terminal).</summary>
    public sealed class TokenEvent : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "token_event";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override MessageKind Kind { get { return MessageKind.Event; } }
        /// <summary>0-based position in this generation's output.</summary>
        public long Index;
        /// <summary>Detokenized piece (may be empty when a UTF-8 sequence is incomplete).</summary>
        public string Text = "";
        /// <summary>Vocabulary id.</summary>
        public long TokenId;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 3).Int("index", Index).Str("text", Text).Int("token_id", TokenId); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new TokenEvent { Index = r.Int("index", min: 0).Value, Text = r.Str("text"), TokenId = r.Int("token_id").Value };
        }
    }

    /// <summary>Terminal reply of generate_request.</summary>
    public sealed class GenerateReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "generate_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>One of <see cref="Igi.Protocol.FinishReason"/>.</summary>
        public string FinishReason;
        /// <summary>The full completion (concatenation of the token texts).</summary>
        public string Text = "";
        /// <summary>Token counts.</summary>
        public Usage Usage = new Usage();
        /// <summary>Time to first token, s; null if no token was produced.</summary>
        public double? TtftS;
        /// <summary>Decode speed, tokens/s (0 if fewer than 2 tokens).</summary>
        public double Tps;
        /// <summary>Model reloads (budget changes) while this generation ran.</summary>
        public long ReloadsDuring;
        /// <summary>1.1: the reply's JSON text, valid against the schema (map it with JsonUtility.FromJson&lt;T&gt;); null = none.</summary>
        public string JsonOutput;
        /// <summary>1.1: the tool call, set when FinishReason is "tool_call".</summary>
        public ToolCall ToolCall;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w)
        {
            new FieldWriter(w, 8).Str("finish_reason", FinishReason).Str("text", Text).Obj("usage", Usage)
                .F64("ttft_s", TtftS).F64("tps", Tps).Int("reloads_during", ReloadsDuring)
                .Str("json_output", JsonOutput).Obj("tool_call", ToolCall);
        }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            string reason = r.Str("finish_reason");
            if (!Protocol.FinishReason.IsValid(reason))
                throw new IgiProtocolException("invalid generate_reply: field 'finish_reason' has unknown value '" + reason + "'");
            return new GenerateReply
            {
                FinishReason = reason,
                Text = r.Str("text"),
                Usage = r.Obj("usage", Usage.Read),
                TtftS = r.F64("ttft_s", true, true, min: 0.0),
                Tps = r.F64("tps", min: 0.0).Value,
                ReloadsDuring = r.Int("reloads_during", false, dflt: 0, min: 0).Value,
                JsonOutput = r.Str("json_output", false, true),
                ToolCall = r.Obj("tool_call", ToolCall.Read, false, true),
            };
        }
    }

    /// <summary>Cancel a queued or running generate_request (priority path).</summary>
    public sealed class CancelRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "cancel_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return CancelReply.TypeName; } }
        /// <summary>msg_id of the generate_request to cancel.</summary>
        public string TargetMsgId;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 1).Str("target_msg_id", TargetMsgId); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r) { return new CancelRequest { TargetMsgId = r.MsgId("target_msg_id") }; }
    }

    /// <summary>Whether the target was found queued or running and is now cancelled.</summary>
    public sealed class CancelReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "cancel_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>True when the target was found and cancelled.</summary>
        public bool Cancelled;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 1).Bool("cancelled", Cancelled); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r) { return new CancelReply { Cancelled = r.Bool("cancelled").Value }; }
    }

    /// <summary>Persist the header's session (history + KV state) to a file.</summary>
    public sealed class SaveSessionRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "save_session_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return SaveSessionReply.TypeName; } }
        /// <inheritdoc/>
        public override bool RequiresSession { get { return true; } }
        /// <summary>File path; null = the daemon's sessions directory.</summary>
        public string Path;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 1).Str("path", Path); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r) { return new SaveSessionRequest { Path = r.Str("path", false, true) }; }
    }

    /// <summary>Where the session was saved.</summary>
    public sealed class SaveSessionReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "save_session_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>The file written.</summary>
        public string Path;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 1).Str("path", Path); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r) { return new SaveSessionReply { Path = r.Str("path") }; }
    }

    /// <summary>Restore a saved session as a new open session.</summary>
    public sealed class LoadSessionRequest : IgiRequest
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "load_session_request";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <inheritdoc/>
        public override string ReplyType { get { return LoadSessionReply.TypeName; } }
        /// <summary>The saved file.</summary>
        public string Path;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 1).Str("path", Path); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r) { return new LoadSessionRequest { Path = r.Str("path") }; }
    }

    /// <summary>The restored session.</summary>
    public sealed class LoadSessionReply : IgiMessage
    {
        /// <summary>Wire type.</summary>
        public const string TypeName = "load_session_reply";
        /// <inheritdoc/>
        public override string Type { get { return TypeName; } }
        /// <summary>The new session id.</summary>
        public string SessionId;
        /// <summary>Conversation turns restored.</summary>
        public long NTurns;

        /// <inheritdoc/>
        public override void Write(MsgPackWriter w) { new FieldWriter(w, 2).Str("session_id", SessionId).Int("n_turns", NTurns); }

        /// <summary>Reads the content.</summary>
        public static IgiMessage Read(FieldReader r)
        {
            return new LoadSessionReply { SessionId = r.SessionId("session_id"), NTurns = r.Int("n_turns", min: 0).Value };
        }
    }
}
