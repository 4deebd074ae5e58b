// igi/values.hpp - IgiClientCore, messages layer: nested value objects carried inside messages.
//
// Field order is wire order (ipc/PROTOCOL.md); defaults are the spec's defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "igi/wire_fields.hpp"

namespace igi {

/// Sampling parameters of a session or of one generation (llama.cpp sampler vocabulary).
struct Sampling {
  double temperature = 0.7;  ///< 0 = greedy
  double top_p = 0.95;
  std::int64_t top_k = 40;  ///< 0 = disabled
  std::optional<std::int64_t> seed;  ///< uint32; nullopt = random
  std::int64_t max_tokens = 128;
  std::vector<std::string> stop;

  template <class V>
  void Visit(V& v) {
    v.Def("temperature", temperature, rules::Range(0.0, 5.0));
    Rule top_p_rule = rules::Range(0.0, 1.0);
    top_p_rule.min_exclusive = true;
    v.Def("top_p", top_p, top_p_rule);
    v.Def("top_k", top_k, rules::kNonNeg);
    v.Def("seed", seed, rules::kU32);
    v.Def("max_tokens", max_tokens, rules::kPositive);
    v.Def("stop", stop, rules::MaxLen(8));
  }
};

/// Limits the daemon enforces, announced in hello_reply.
struct Limits {
  std::int64_t max_frame_bytes = 1048576;
  std::int64_t max_prompt_tokens = 4096;
  std::int64_t max_sessions = 64;
  std::int64_t max_queue_depth = 16;
  /// 1.4: priority points a queued generate_request gains per second it waits (>= 0), so no NPC waits for ever
  /// behind higher priorities: the daemon ranks a request as if it had arrived priority / priority_ageing_per_s
  /// seconds earlier. 0 (absent: a daemon older than 1.4) = strict priority.
  double priority_ageing_per_s = 0.0;

  template <class V>
  void Visit(V& v) {
    v.Def("max_frame_bytes", max_frame_bytes, rules::Range(1024.0, 9.2233720368547758e18));
    v.Def("max_prompt_tokens", max_prompt_tokens, rules::kPositive);
    v.Def("max_sessions", max_sessions, rules::kPositive);
    v.Def("max_queue_depth", max_queue_depth, rules::kPositive);
    v.Def("priority_ageing_per_s", priority_ageing_per_s, rules::kNonNeg);
  }
};

/// The loaded model.
struct ModelInfo {
  std::string path;
  std::string architecture;
  std::int64_t n_layer = 0;
  std::optional<std::int64_t> n_params;
  double file_mib = 0.0;
  std::int64_t n_ctx = 0;

  template <class V>
  void Visit(V& v) {
    v.Req("path", path);
    v.Req("architecture", architecture);
    v.Req("n_layer", n_layer, rules::kNonNeg);
    v.Def("n_params", n_params, rules::kNonNeg);
    v.Req("file_mib", file_mib, rules::kNonNeg);
    v.Req("n_ctx", n_ctx, rules::kNonNeg);
  }
};

/// Summary of the placement plan in force (or proposed).
struct Plan {
  std::string strategy;  ///< e.g. "cpu_only", "full_gpu", "layer_split"
  double gpu_mib = 0.0;
  double cpu_mib = 0.0;
  std::optional<std::int64_t> n_gpu_layers;
  std::string summary;

  template <class V>
  void Visit(V& v) {
    v.Req("strategy", strategy);
    v.Req("gpu_mib", gpu_mib, rules::kNonNeg);
    v.Req("cpu_mib", cpu_mib, rules::kNonNeg);
    v.Def("n_gpu_layers", n_gpu_layers, rules::kNonNeg);
    v.Def("summary", summary);
  }
};

/// How the daemon paces token generation to protect the game's frame time.
struct Throttle {
  std::optional<std::int64_t> tokens_per_frame;  ///< nullopt = unlimited
  double sleep_ms_between_tokens = 0.0;

  template <class V>
  void Visit(V& v) {
    v.Def("tokens_per_frame", tokens_per_frame, rules::kNonNeg);
    v.Def("sleep_ms_between_tokens", sleep_ms_between_tokens, rules::kNonNeg);
  }
};

/// Token counts of one generation.
struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;

  template <class V>
  void Visit(V& v) {
    v.Req("prompt_tokens", prompt_tokens, rules::kNonNeg);
    v.Req("completion_tokens", completion_tokens, rules::kNonNeg);
  }
};

/// 1.1: a tool an NPC session may call (create_session_request.tools).
struct Tool {
  std::string name;         ///< 1-64 of [A-Za-z0-9_-], not starting with a digit or '-'
  std::string description;  ///< what the tool does, shown to the model
  std::string parameters = "{}";  ///< JSON Schema of the arguments object, as JSON text

  template <class V>
  void Visit(V& v) {
    v.Req("name", name, rules::kToolName);
    v.Def("description", description, rules::MaxLen(1024));
    v.Def("parameters", parameters, rules::MaxLen(16384));
  }
};

/// 1.1: a tool call the NPC made (generate_reply.tool_call, finish_reason "tool_call").
struct ToolCall {
  std::string id;         ///< the call's id; the tool_result that answers it names it
  std::string name;       ///< a tool the session registered
  std::string arguments;  ///< JSON text of the arguments, valid against the tool's parameters

  template <class V>
  void Visit(V& v) {
    v.Req("id", id, rules::kToolCallId);
    v.Req("name", name, rules::kToolName);
    v.Req("arguments", arguments);
  }
};

/// 1.1: the game's answer to a tool call (generate_request.tool_result).
struct ToolResult {
  std::string call_id;
  std::string name;
  std::string content;  ///< what the tool did, for the model

  template <class V>
  void Visit(V& v) {
    v.Req("call_id", call_id, rules::kToolCallId);
    v.Req("name", name, rules::kToolName);
    v.Def("content", content, rules::MaxLen(16384));
  }
};

}  // namespace igi
