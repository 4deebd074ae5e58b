// igi/messages.hpp - IgiClientCore, messages layer: one struct per wire message type.
//
// Field order is wire order; the `type` travels in the header only. Every struct has kType and
// kKind ("request", "reply", "event"); requests about one NPC session set kRequiresSession, and
// priority-path requests (served at once, never queued) set kPriority.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "igi/image.hpp"
#include "igi/values.hpp"

namespace igi {

inline constexpr const char* kProtocolVersion = "1.4";
/// What a header without protocol_version is read as (PROTOCOL.md section 3): always the first version, whatever
/// minor this client speaks. Senders always write kProtocolVersion (NewHeader).
inline constexpr const char* kAbsentHeaderProtocolVersion = "1.0";
inline constexpr std::int64_t kMaxTextChars = 65536;
inline constexpr std::size_t kMaxGrammarChars = 65536;  ///< 1.1
inline constexpr std::size_t kMaxSchemaChars = 16384;   ///< 1.1
inline constexpr std::size_t kMaxTools = 32;            ///< 1.1

#define IGI_MESSAGE(type_name, kind, requires_session, priority)     \
  static constexpr const char* kType = type_name;                    \
  static constexpr const char* kKind = kind;                         \
  static constexpr bool kRequiresSession = requires_session;         \
  static constexpr bool kPriority = priority;

// --- handshake --------------------------------------------------------------------------------------
struct HelloRequest {
  IGI_MESSAGE("hello_request", "request", false, false)
  std::string client_name;
  std::string client_version;
  std::string protocol_version = kProtocolVersion;
  std::vector<std::string> capabilities;
  template <class V>
  void Visit(V& v) {
    v.Req("client_name", client_name, rules::MaxLen(256));
    v.Req("client_version", client_version, rules::MaxLen(64));
    v.Req("protocol_version", protocol_version, rules::kVersion);
    v.Def("capabilities", capabilities, rules::MaxLen(64));
  }
};

struct HelloReply {
  IGI_MESSAGE("hello_reply", "reply", false, false)
  std::string daemon_version;
  std::string protocol_version;
  std::vector<std::string> capabilities;
  double heartbeat_interval_s = 0.0;
  double client_timeout_s = 0.0;
  Limits limits;
  std::optional<ModelInfo> model;
  template <class V>
  void Visit(V& v) {
    v.Req("daemon_version", daemon_version);
    v.Req("protocol_version", protocol_version, rules::kVersion);
    v.Def("capabilities", capabilities);
    v.Req("heartbeat_interval_s", heartbeat_interval_s, rules::kNonNeg);
    v.Req("client_timeout_s", client_timeout_s, rules::kNonNeg);
    v.Req("limits", limits);
    v.Req("model", model);
  }
};

// --- model and budget -------------------------------------------------------------------------------
struct LoadModelRequest {
  IGI_MESSAGE("load_model_request", "request", false, false)
  std::optional<std::string> model_path;  ///< nullopt = the embedded default model
  std::int64_t n_ctx = 2048;
  std::optional<std::int64_t> vram_budget_mib;
  std::optional<std::string> mmproj_path;  ///< 1.1: vision projector beside the model; nullopt = none (no vision)
  template <class V>
  void Visit(V& v) {
    v.Def("model_path", model_path);
    v.Def("n_ctx", n_ctx, rules::Range(16.0, 9.2233720368547758e18));
    v.Def("vram_budget_mib", vram_budget_mib, rules::kNonNeg);
    v.Def("mmproj_path", mmproj_path);
  }
};

struct LoadModelReply {
  IGI_MESSAGE("load_model_reply", "reply", false, false)
  ModelInfo model;
  Plan plan;
  template <class V>
  void Visit(V& v) {
    v.Req("model", model);
    v.Req("plan", plan);
  }
};

/// Most entries of SetBudgetRequest::levels_mib (protocol 1.3).
inline constexpr std::size_t kMaxBudgetLevels = 16;

struct SetBudgetRequest {
  IGI_MESSAGE("set_budget_request", "request", false, false)
  std::int64_t vram_budget_mib = 0;  ///< 0 = CPU only
  std::string reason;
  /// 1.3: the budget levels the game will ask for, MiB (at most kMaxBudgetLevels), planned ahead by the daemon;
  /// nullopt = the levels declared before stay, empty = none.
  std::optional<std::vector<std::int64_t>> levels_mib;
  template <class V>
  void Visit(V& v) {
    v.Req("vram_budget_mib", vram_budget_mib, rules::kNonNeg);
    v.Def("reason", reason, rules::MaxLen(256));
    v.Def("levels_mib", levels_mib, Rule{0.0, std::numeric_limits<double>::infinity(), false, kMaxBudgetLevels});
  }
};

struct ReclaimRequest {
  IGI_MESSAGE("reclaim_request", "request", false, true)
  std::int64_t vram_budget_mib = 0;
  double deadline_s = 0.0;
  template <class V>
  void Visit(V& v) {
    v.Req("vram_budget_mib", vram_budget_mib, rules::kNonNeg);
    v.Req("deadline_s", deadline_s, rules::kNonNeg);
  }
};

/// Terminal reply of set_budget_request and reclaim_request.
struct BudgetAck {
  IGI_MESSAGE("budget_ack", "reply", false, false)
  std::int64_t requested_mib = 0;
  std::int64_t granted_mib = 0;
  bool applied = false;
  bool cpu_fallback = false;
  Plan plan;
  double predicted_ttft_s = 0.0;
  double predicted_tps = 0.0;
  double apply_time_s = 0.0;
  std::optional<double> measured_vram_mib;  ///< nullopt = no GPU
  std::optional<std::string> warning;
  /// 1.3: true = the placement in force is one planned ahead that fits the budget, put in force at once to release
  /// VRAM first; the daemon's exact plan follows in the background without another reply. nullopt (a daemon older
  /// than 1.3) or false: the plan is the one for the budget.
  std::optional<bool> interim;
  /// `interim` with nullopt read as false.
  bool IsInterim() const { return interim.value_or(false); }
  template <class V>
  void Visit(V& v) {
    v.Req("requested_mib", requested_mib, rules::kNonNeg);
    v.Req("granted_mib", granted_mib, rules::kNonNeg);
    v.Req("applied", applied);
    v.Req("cpu_fallback", cpu_fallback);
    v.Req("plan", plan);
    v.Req("predicted_ttft_s", predicted_ttft_s, rules::kNonNeg);
    v.Req("predicted_tps", predicted_tps, rules::kNonNeg);
    v.Req("apply_time_s", apply_time_s, rules::kNonNeg);
    v.Req("measured_vram_mib", measured_vram_mib, rules::kNonNeg);
    v.Def("warning", warning);
    v.Def("interim", interim);
  }
};

struct FrameStatsRequest {
  IGI_MESSAGE("frame_stats_request", "request", false, false)
  double frame_time_ms = 0.0;
  double target_frame_time_ms = 0.0;
  std::optional<double> free_vram_mib;
  std::optional<double> gpu_busy_pct;
  template <class V>
  void Visit(V& v) {
    v.Req("frame_time_ms", frame_time_ms, rules::kNonNeg);
    v.Req("target_frame_time_ms", target_frame_time_ms, rules::kNonNeg);
    v.Def("free_vram_mib", free_vram_mib, rules::kNonNeg);
    v.Def("gpu_busy_pct", gpu_busy_pct, rules::Range(0.0, 100.0));
  }
};

struct FrameStatsReply {
  IGI_MESSAGE("frame_stats_reply", "reply", false, false)
  Throttle throttle;
  std::optional<std::int64_t> proposed_budget_mib;
  template <class V>
  void Visit(V& v) {
    v.Req("throttle", throttle);
    v.Def("proposed_budget_mib", proposed_budget_mib, rules::kNonNeg);
  }
};

// --- sessions ---------------------------------------------------------------------------------------
/// 1.1: the rules across fields of the session requests (ipc/PROTOCOL.md 7.4): at most one of grammar and
/// json_schema; distinct tool names. Throw DecodeError (invalid_request), naming `path` (the message's field path).
void CheckAtMostOneConstraint(const std::optional<std::string>& grammar, const std::optional<std::string>& json_schema,
                              const std::string& path);
void CheckDistinctToolNames(const std::vector<Tool>& tools, const std::string& path);

struct CreateSessionRequest {
  IGI_MESSAGE("create_session_request", "request", false, false)
  std::string persona;
  std::string system_prompt;
  Sampling sampling;
  std::int64_t priority = 0;
  std::optional<std::string> grammar;      ///< 1.1: default GBNF grammar of the replies
  std::optional<std::string> json_schema;  ///< 1.1: default JSON Schema of the replies (JSON text)
  std::vector<Tool> tools;                 ///< 1.1: tools the NPC may call (at most 32)
  template <class V>
  void Visit(V& v) {
    v.Req("persona", persona, rules::MaxLen(256));
    v.Req("system_prompt", system_prompt, rules::MaxLen(kMaxTextChars));
    v.Def("sampling", sampling);
    v.Def("priority", priority, rules::kPriority);
    v.Def("grammar", grammar, rules::Text(1, kMaxGrammarChars));
    v.Def("json_schema", json_schema, rules::Text(1, kMaxSchemaChars));
    v.Def("tools", tools, rules::MaxLen(kMaxTools));
  }
  /// Run by the decoder after the fields, and by the client before sending (a request the daemon would refuse).
  void Check(const std::string& path) const {
    CheckAtMostOneConstraint(grammar, json_schema, path);
    CheckDistinctToolNames(tools, path);
  }
};

struct CreateSessionReply {
  IGI_MESSAGE("create_session_reply", "reply", false, false)
  std::string session_id;
  template <class V>
  void Visit(V& v) {
    v.Req("session_id", session_id, rules::kSessionId);
  }
};

struct CloseSessionRequest {
  IGI_MESSAGE("close_session_request", "request", true, false)
  template <class V>
  void Visit(V&) {}
};

struct CloseSessionReply {
  IGI_MESSAGE("close_session_reply", "reply", false, false)
  template <class V>
  void Visit(V&) {}
};

struct GenerateRequest {
  IGI_MESSAGE("generate_request", "request", true, false)
  std::string text;  ///< the player's line (user turn)
  std::optional<std::int64_t> max_tokens;  ///< nullopt = session default
  std::optional<Sampling> sampling;
  std::optional<std::int64_t> priority;
  std::optional<std::string> grammar;      ///< 1.1: GBNF grammar of this reply; nullopt = the session's
  std::optional<std::string> json_schema;  ///< 1.1: JSON Schema of this reply (JSON text); nullopt = the session's
  std::optional<std::string> tool_choice;  ///< 1.1: "auto" (nullopt), "none", "required" or a tool name
  std::optional<ToolResult> tool_result;   ///< 1.1: the game's answer to the session's last tool call
  std::optional<Image> image;              ///< 1.1: an image the NPC is shown with this line (igi/image.hpp)
  template <class V>
  void Visit(V& v) {
    v.Req("text", text, rules::MaxLen(kMaxTextChars));
    v.Def("max_tokens", max_tokens, rules::kPositive);
    v.Def("sampling", sampling);
    v.Def("priority", priority, rules::kPriority);
    v.Def("grammar", grammar, rules::Text(1, kMaxGrammarChars));
    v.Def("json_schema", json_schema, rules::Text(1, kMaxSchemaChars));
    v.Def("tool_choice", tool_choice, rules::kToolName);
    v.Def("tool_result", tool_result);
    v.Def("image", image);
  }
  /// Run by the decoder after the fields, and by the client before sending (a request the daemon would refuse).
  void Check(const std::string& path) const { CheckAtMostOneConstraint(grammar, json_schema, path); }
};

struct TokenEvent {
  IGI_MESSAGE("token_event", "event", false, false)
  std::int64_t index = 0;
  std::string text;  ///< may be empty while a UTF-8 sequence is incomplete
  std::int64_t token_id = 0;
  template <class V>
  void Visit(V& v) {
    v.Req("index", index, rules::kNonNeg);
    v.Req("text", text);
    v.Req("token_id", token_id);
  }
};

struct GenerateReply {
  IGI_MESSAGE("generate_reply", "reply", false, false)
  std::string finish_reason;  ///< "stop", "length", "cancelled", "error" or (1.1) "tool_call"
  std::string text;
  Usage usage;
  std::optional<double> ttft_s;
  double tps = 0.0;
  std::int64_t reloads_during = 0;
  std::optional<std::string> json_output;  ///< 1.1: the reply's JSON text, valid against the schema
  std::optional<ToolCall> tool_call;       ///< 1.1: set when finish_reason is "tool_call"
  template <class V>
  void Visit(V& v) {
    v.Req("finish_reason", finish_reason, rules::kFinishReason);
    v.Req("text", text);
    v.Req("usage", usage);
    v.Req("ttft_s", ttft_s, rules::kNonNeg);
    v.Req("tps", tps, rules::kNonNeg);
    v.Def("reloads_during", reloads_during, rules::kNonNeg);
    v.Def("json_output", json_output);
    v.Def("tool_call", tool_call);
  }
};

struct CancelRequest {
  IGI_MESSAGE("cancel_request", "request", false, true)
  std::string target_msg_id;
  template <class V>
  void Visit(V& v) {
    v.Req("target_msg_id", target_msg_id, rules::kMsgId);
  }
};

struct CancelReply {
  IGI_MESSAGE("cancel_reply", "reply", false, false)
  bool cancelled = false;
  template <class V>
  void Visit(V& v) {
    v.Req("cancelled", cancelled);
  }
};

struct SaveSessionRequest {
  IGI_MESSAGE("save_session_request", "request", true, false)
  std::optional<std::string> path;
  template <class V>
  void Visit(V& v) {
    v.Def("path", path);
  }
};

struct SaveSessionReply {
  IGI_MESSAGE("save_session_reply", "reply", false, false)
  std::string path;
  template <class V>
  void Visit(V& v) {
    v.Req("path", path);
  }
};

struct LoadSessionRequest {
  IGI_MESSAGE("load_session_request", "request", false, false)
  std::string path;
  template <class V>
  void Visit(V& v) {
    v.Req("path", path);
  }
};

struct LoadSessionReply {
  IGI_MESSAGE("load_session_reply", "reply", false, false)
  std::string session_id;
  std::int64_t n_turns = 0;
  template <class V>
  void Visit(V& v) {
    v.Req("session_id", session_id, rules::kSessionId);
    v.Req("n_turns", n_turns, rules::kNonNeg);
  }
};

// --- daemon -----------------------------------------------------------------------------------------
struct StatusRequest {
  IGI_MESSAGE("status_request", "request", false, false)
  template <class V>
  void Visit(V&) {}
};

struct StatusReply {
  IGI_MESSAGE("status_reply", "reply", false, false)
  std::optional<ModelInfo> model;
  std::optional<std::int64_t> vram_budget_mib;
  std::optional<Plan> plan;
  std::optional<double> vram_used_mib;
  std::int64_t n_sessions = 0;
  std::int64_t queue_depth = 0;
  CounterMap counters;
  double uptime_s = 0.0;
  template <class V>
  void Visit(V& v) {
    v.Req("model", model);
    v.Req("vram_budget_mib", vram_budget_mib, rules::kNonNeg);
    v.Req("plan", plan);
    v.Req("vram_used_mib", vram_used_mib, rules::kNonNeg);
    v.Req("n_sessions", n_sessions, rules::kNonNeg);
    v.Req("queue_depth", queue_depth, rules::kNonNeg);
    v.Def("counters", counters);
    v.Req("uptime_s", uptime_s, rules::kNonNeg);
  }
};

struct HeartbeatRequest {
  IGI_MESSAGE("heartbeat_request", "request", false, true)
  template <class V>
  void Visit(V&) {}
};

struct HeartbeatReply {
  IGI_MESSAGE("heartbeat_reply", "reply", false, false)
  double uptime_s = 0.0;
  template <class V>
  void Visit(V& v) {
    v.Req("uptime_s", uptime_s, rules::kNonNeg);
  }
};

struct ShutdownRequest {
  IGI_MESSAGE("shutdown_request", "request", false, false)
  template <class V>
  void Visit(V&) {}
};

struct ShutdownReply {
  IGI_MESSAGE("shutdown_reply", "reply", false, false)
  template <class V>
  void Visit(V&) {}
};

/// Terminal reply of any request that failed; turned into a RequestError by the client.
struct ErrorReply {
  IGI_MESSAGE("error_reply", "reply", false, false)
  ErrorCode code = ErrorCode::kInternal;  ///< unknown wire strings decode as kInternal
  std::string message;
  Value detail;  ///< a map with sorted keys, or nil
  bool retryable = false;
  template <class V>
  void Visit(V& v) {
    v.Req("code", code);
    v.Req("message", message);
    v.Def("detail", detail);
    v.Def("retryable", retryable);
  }
};

#undef IGI_MESSAGE

/// Static facts about one message type, for dispatch and conformance.
struct MessageTypeInfo {
  const char* type;
  const char* kind;
  bool requires_session;
  bool priority;
  /// Decodes a content map into the typed struct and re-encodes it canonically (throws DecodeError).
  Value (*canonicalize)(const Value& content);
};

/// The registry entry of a wire type, or nullptr for an unknown type.
const MessageTypeInfo* FindMessageType(const std::string& type);

/// Every message type in spec order.
const std::vector<MessageTypeInfo>& AllMessageTypes();

/// The success reply type of a request type ("" for non-requests); error_reply can end any request.
const char* TerminalReplyType(const std::string& request_type);

}  // namespace igi
