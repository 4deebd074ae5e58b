// Unit tests of protocol 1.1's constrained output on the C# side: the [Serializable] mapping of json_output and
// tool-call arguments, and the request fields a game sets.
using System;
using System.Collections.Generic;
using Igi.Json;
using Igi.MsgPack;
using Igi.Protocol;

namespace Igi.Tests
{
    public enum Emotion { Neutral, Happy, Angry }

    [Serializable]
    public class NpcLine
    {
        public string line;
        public Emotion emotion;
        public string action;
    }

    [Serializable]
    public class GiveItemArgs
    {
        public string item;
        public int count;
        public List<string> tags = new List<string>();
    }

    public static class StructuredTests
    {
        public static void Register(TestRunner t)
        {
            t.Add("structured:json_output_maps_onto_a_serializable_class", () =>
            {
                var reply = new GenerateReply { FinishReason = FinishReason.Stop, JsonOutput = "{\"line\": \"Welcome!\", \"emotion\": \"happy\", \"action\": \"wave\", \"extra\": 1}" };
                NpcLine say = reply.Parsed<NpcLine>();
                Check.Equal("Welcome!", say.line, "line");
                Check.Equal(Emotion.Happy, say.emotion, "enum by name");
                Check.Equal("wave", say.action, "action");
                Check.True(new GenerateReply { FinishReason = FinishReason.Stop }.Parsed<NpcLine>() == null, "no json_output: null");
            });
            t.Add("structured:tool_call_arguments_map_and_bad_values_are_format_errors", () =>
            {
                var call = new ToolCall { Id = "call_1", Name = "give_item", Arguments = "{\"item\": \"sword\", \"count\": 2, \"tags\": [\"sharp\"]}" };
                GiveItemArgs args = call.ArgumentsAs<GiveItemArgs>();
                Check.Equal("sword", args.item, "item");
                Check.Equal(2, args.count, "count");
                Check.Equal(1, args.tags.Count, "list");
                bool threw = false;
                try { IgiJson.FromJson<GiveItemArgs>("{\"count\": \"two\"}"); }
                catch (FormatException) { threw = true; }
                Check.True(threw, "a string for an int is a FormatException");
            });
            t.Add("structured:generate_request_1_1_fields_round_trip", () =>
            {
                var request = new GenerateRequest
                {
                    Text = "",
                    JsonSchema = "{\"type\": \"object\"}",
                    ToolChoice = "give_item",
                    ToolResult = new ToolResult { CallId = "call_1", Name = "give_item", Content = "{\"given\": true}" },
                };
                var w = new MsgPackWriter();
                request.Write(w);
                var back = (GenerateRequest)GenerateRequest.Read(new FieldReader(MsgPackReader.Decode(w.ToArray()), "generate_request"));
                Check.Equal("give_item", back.ToolChoice, "tool_choice");
                Check.Equal("call_1", back.ToolResult.CallId, "tool_result.call_id");
                Check.Equal(null, back.Grammar, "grammar nil");
                bool threw = false;
                var tools = new List<object> { new MsgPackMap().Add("name", "9lives") };
                var content = new MsgPackMap().Add("persona", "p").Add("system_prompt", "").Add("tools", tools);
                try { CreateSessionRequest.Read(new FieldReader(MsgPackReader.Decode(MsgPackWriter.Encode(content)), "create_session_request")); }
                catch (IgiProtocolException) { threw = true; }
                Check.True(threw, "a tool name starting with a digit is refused");
            });
            t.Add("structured:new_error_codes_raise_their_exceptions", () =>
            {
                Check.Equal(typeof(IgiInvalidSchemaException), ErrorCodes.ToException(new ErrorReply { Code = "invalid_schema", Message = "m" }).GetType(), "invalid_schema");
                Check.Equal(typeof(IgiInvalidToolArgumentsException), ErrorCodes.ToException(new ErrorReply { Code = "invalid_tool_arguments", Message = "m" }).GetType(), "invalid_tool_arguments");
            });
            t.Add("structured:decoder_refuses_grammar_with_json_schema_and_duplicate_tool_names", () =>
            {
                var both = new MsgPackMap().Add("text", "hi").Add("grammar", "root ::= \"yes\"").Add("json_schema", "{\"type\": \"boolean\"}");
                var e = Check.Throws<IgiProtocolException>(
                    () => GenerateRequest.Read(new FieldReader(MsgPackReader.Decode(MsgPackWriter.Encode(both)), "generate_request")), "generate both");
                Check.Equal("invalid_request", e.Classification, "generate_request: classification");
                var session = new MsgPackMap().Add("persona", "p").Add("system_prompt", "").Add("grammar", "root ::= \"yes\"").Add("json_schema", "{}");
                e = Check.Throws<IgiProtocolException>(
                    () => CreateSessionRequest.Read(new FieldReader(MsgPackReader.Decode(MsgPackWriter.Encode(session)), "create_session_request")), "session both");
                Check.Equal("invalid_request", e.Classification, "create_session_request: classification");
                var tools = new List<object> { new MsgPackMap().Add("name", "wave"), new MsgPackMap().Add("name", "wave") };
                var twice = new MsgPackMap().Add("persona", "p").Add("system_prompt", "").Add("tools", tools);
                e = Check.Throws<IgiProtocolException>(
                    () => CreateSessionRequest.Read(new FieldReader(MsgPackReader.Decode(MsgPackWriter.Encode(twice)), "create_session_request")), "tools twice");
                Check.True(e.Message.Contains("'wave' twice"), "the message names the tool: " + e.Message);
                // Names differing in case are distinct (the daemon compares them as written).
                var cased = new List<object> { new MsgPackMap().Add("name", "wave"), new MsgPackMap().Add("name", "Wave") };
                var ok = (CreateSessionRequest)CreateSessionRequest.Read(new FieldReader(
                    MsgPackReader.Decode(MsgPackWriter.Encode(new MsgPackMap().Add("persona", "p").Add("system_prompt", "").Add("tools", cased))), "create_session_request"));
                Check.Equal(2, ok.Tools.Count, "wave and Wave");
            });
            t.Add("structured:validate_states_the_rules_the_decoder_checks", () =>
            {
                new GenerateRequest { Grammar = "root ::= \"a\"" }.Validate();
                new CreateSessionRequest { JsonSchema = "{}", Tools = { new Tool { Name = "a" }, new Tool { Name = "b" } } }.Validate();
                Check.Throws<IgiProtocolException>(() => new GenerateRequest { Grammar = "root ::= \"a\"", JsonSchema = "{}" }.Validate(), "generate both");
                Check.Throws<IgiProtocolException>(() => new CreateSessionRequest { Grammar = "root ::= \"a\"", JsonSchema = "{}" }.Validate(), "session both");
                Check.Throws<IgiProtocolException>(() => new CreateSessionRequest { Tools = { new Tool { Name = "a" }, new Tool { Name = "a" } } }.Validate(), "tools twice");
            });
        }
    }
}
