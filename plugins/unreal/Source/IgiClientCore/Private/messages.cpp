// messages.cpp - IgiClientCore, messages layer: the message type registry.
#include "igi/messages.hpp"

#include <set>

#include "igi/errors.hpp"

namespace igi {
namespace {

template <class T>
Value Canonicalize(const Value& content) {
  return StructToValue(StructFromValue<T>(content));
}

template <class T>
MessageTypeInfo Info() {
  return {T::kType, T::kKind, T::kRequiresSession, T::kPriority, &Canonicalize<T>};
}

struct ReplyPair {
  const char* request;
  const char* reply;
};

constexpr ReplyPair kTerminalReplies[] = {
    {"hello_request", "hello_reply"},
    {"load_model_request", "load_model_reply"},
    {"set_budget_request", "budget_ack"},
    {"reclaim_request", "budget_ack"},
    {"frame_stats_request", "frame_stats_reply"},
    {"create_session_request", "create_session_reply"},
    {"close_session_request", "close_session_reply"},
    {"generate_request", "generate_reply"},
    {"cancel_request", "cancel_reply"},
    {"save_session_request", "save_session_reply"},
    {"load_session_request", "load_session_reply"},
    {"status_request", "status_reply"},
    {"heartbeat_request", "heartbeat_reply"},
    {"shutdown_request", "shutdown_reply"},
};

}  // namespace

void CheckAtMostOneConstraint(const std::optional<std::string>& grammar, const std::optional<std::string>& json_schema,
                              const std::string& path) {
  if (grammar && json_schema) {
    throw DecodeError((path.empty() ? std::string() : path + ": ") + "set at most one of grammar and json_schema");
  }
}

void CheckDistinctToolNames(const std::vector<Tool>& tools, const std::string& path) {
  std::set<std::string> seen;
  for (const Tool& tool : tools) {
    if (!seen.insert(tool.name).second) {
      throw DecodeError((path.empty() ? std::string() : path + ".") + "tools: '" + tool.name +
                        "' twice (tool names must be distinct)");
    }
  }
}

const std::vector<MessageTypeInfo>& AllMessageTypes() {
  static const std::vector<MessageTypeInfo> kTypes = {
      Info<HelloRequest>(),        Info<HelloReply>(),         Info<LoadModelRequest>(),
      Info<LoadModelReply>(),      Info<SetBudgetRequest>(),   Info<ReclaimRequest>(),
      Info<BudgetAck>(),           Info<FrameStatsRequest>(),  Info<FrameStatsReply>(),
      Info<CreateSessionRequest>(), Info<CreateSessionReply>(), Info<CloseSessionRequest>(),
      Info<CloseSessionReply>(),   Info<GenerateRequest>(),    Info<TokenEvent>(),
      Info<GenerateReply>(),       Info<CancelRequest>(),      Info<CancelReply>(),
      Info<SaveSessionRequest>(),  Info<SaveSessionReply>(),   Info<LoadSessionRequest>(),
      Info<LoadSessionReply>(),    Info<StatusRequest>(),      Info<StatusReply>(),
      Info<HeartbeatRequest>(),    Info<HeartbeatReply>(),     Info<ShutdownRequest>(),
      Info<ShutdownReply>(),       Info<ErrorReply>(),
  };
  return kTypes;
}

const MessageTypeInfo* FindMessageType(const std::string& type) {
  for (const MessageTypeInfo& info : AllMessageTypes()) {
    if (type == info.type) return &info;
  }
  return nullptr;
}

const char* TerminalReplyType(const std::string& request_type) {
  for (const ReplyPair& p : kTerminalReplies) {
    if (request_type == p.request) return p.reply;
  }
  return "";
}

}  // namespace igi
