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
        }
    }
}
