// client_requests.cpp - IgiClientCore, client layer: typed blocking and asynchronous requests.
#include "igi/client.hpp"

#include <algorithm>

#include "client_impl.hpp"
#include "igi/process_liveness.hpp"

namespace igi {

using detail::SteadyNow;

namespace {
// Handshakes per Connect() at most: the first, one on a socket with the announced cap, and one more should the
// daemon announce yet another limit in between (e.g. it restarted); that last one is kept whatever it announces.
constexpr int kMaxHandshakes = 3;
static_assert(kDefaultMaxMsgBytes == 2 * static_cast<std::int64_t>(kDefaultMaxFrameBytes));
}  // namespace

HelloReply Client::Connect() {
  HelloRequest request;
  request.client_name = impl_->options.client_name;
  request.client_version = impl_->options.client_version;
  request.capabilities = impl_->options.capabilities;
  HelloReply reply;
  const ConnectionInfo& info = impl_->info;
  const bool gone = ProcessRunning(info.pid, info.pid_start_ticks) == std::optional<bool>(false);
  for (int handshake = 1;; ++handshake) {
    if (handshake == 1 && gone) {
      try {
        reply = Call<HelloRequest, HelloReply>(
            request, std::nullopt, std::min(impl_->options.connect_timeout_s, impl_->options.stale_connect_timeout_s));
      } catch (const TimeoutError&) {
        const std::string& path = impl_->connection_file;
        const std::string file = path.empty() ? "the connection file" : "connection file " + path;
        throw StaleConnectionFileError(file + " names daemon pid " + std::to_string(info.pid) +
                                           ", which is no longer running (a daemon killed without removing its file); "
                                           "start the daemon, which replaces it",
                                       info.pid);
      }
    } else {
      reply = Call<HelloRequest, HelloReply>(request, std::nullopt, impl_->options.connect_timeout_s);
    }
    if (!SameMajor(reply.protocol_version, kProtocolVersion)) {
      throw UnsupportedVersionError(ErrorCode::kUnsupportedVersion, "unsupported_version",
                                    "daemon speaks protocol " + reply.protocol_version + ", client " + kProtocolVersion,
                                    Value());
    }
    // ipc/PROTOCOL.md 1.4: ZMQ_MAXMSGSIZE = 2 x the announced max_frame_bytes. libzmq applies it only to connections
    // made after it is set, so another cap means a fresh socket, and the handshake again on it.
    std::int64_t wanted = MaxMsgBytesFor(reply.limits.max_frame_bytes);
    if (wanted == impl_->transport.max_msg_bytes() || handshake >= kMaxHandshakes) break;
    impl_->transport.Reconnect(wanted);
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->hello = reply;
  impl_->connected = true;
  impl_->heartbeat_interval_s = std::max(reply.heartbeat_interval_s, impl_->min_heartbeat_interval_s);
  impl_->client_timeout_s = reply.client_timeout_s > 0 ? reply.client_timeout_s : 10.0;
  impl_->max_frame_bytes = static_cast<std::size_t>(reply.limits.max_frame_bytes);
  impl_->last_received = SteadyNow();
  impl_->last_heartbeat_sent = impl_->last_received;
  return reply;
}

namespace {

// A request the daemon would answer invalid_request for its fields together (grammar and json_schema both set,
// a tool name twice) is refused here with that error, unsent.
template <class Req>
void RefuseInvalid(const Req& request) {
  try {
    request.Check(Req::kType);
  } catch (const DecodeError& e) {
    throw InvalidRequestError(ErrorCode::kInvalidRequest, "invalid_request", e.what(), Value());
  }
}

// A request with a field the daemon would refuse (a budget level out of range, too many levels) is refused here with
// the daemon's invalid_request, unsent: the field rules are the decoder's, so the request is read back through them.
template <class Req>
void RefuseOutOfRange(const Req& request) {
  try {
    StructFromValue<Req>(StructToValue(request));
  } catch (const DecodeError& e) {
    throw InvalidRequestError(ErrorCode::kInvalidRequest, "invalid_request", e.what(), Value());
  }
}

}  // namespace

CreateSessionReply Client::CreateSession(const CreateSessionRequest& request) {
  RefuseInvalid(request);
  return Call<CreateSessionRequest, CreateSessionReply>(request, std::nullopt, impl_->options.request_timeout_s);
}

void Client::CloseSession(const std::string& session_id) {
  Call<CloseSessionRequest, CloseSessionReply>(CloseSessionRequest{}, session_id, impl_->options.request_timeout_s);
}

BudgetAck Client::SetBudget(std::int64_t vram_budget_mib, const std::string& reason,
                             std::optional<std::vector<std::int64_t>> levels_mib) {
  return SetBudget(SetBudgetRequest{vram_budget_mib, reason, std::move(levels_mib)});
}

BudgetAck Client::SetBudget(const SetBudgetRequest& request) {
  RefuseOutOfRange(request);
  return Call<SetBudgetRequest, BudgetAck>(request, std::nullopt, impl_->options.budget_timeout_s);
}

BudgetAck Client::Reclaim(std::int64_t vram_budget_mib, double deadline_s) {
  ReclaimRequest request{vram_budget_mib, deadline_s};
  return Call<ReclaimRequest, BudgetAck>(request, std::nullopt, impl_->options.budget_timeout_s);
}

FrameStatsReply Client::SendFrameStats(const FrameStatsRequest& request) {
  return Call<FrameStatsRequest, FrameStatsReply>(request, std::nullopt, impl_->options.request_timeout_s);
}

StatusReply Client::Status() {
  return Call<StatusRequest, StatusReply>(StatusRequest{}, std::nullopt, impl_->options.request_timeout_s);
}

LoadModelReply Client::LoadModel(const LoadModelRequest& request) {
  return Call<LoadModelRequest, LoadModelReply>(request, std::nullopt, impl_->options.budget_timeout_s);
}

namespace {

template <class Reply>
Pending AsyncEntry(std::function<void(const Reply&)> on_reply, ErrorCallback on_error) {
  Pending p;
  if (on_reply) {
    p.on_reply = [cb = std::move(on_reply)](const Envelope& env) { cb(StructFromValue<Reply>(env.content)); };
  }
  p.on_error = std::move(on_error);
  return p;
}

}  // namespace

std::string Client::Generate(const std::string& session_id, const GenerateRequest& request,
                             GenerateCallbacks callbacks) {
  RefuseInvalid(request);
  Pending p = AsyncEntry<GenerateReply>(std::move(callbacks.on_done), std::move(callbacks.on_error));
  if (callbacks.on_token) {
    p.on_event = [cb = std::move(callbacks.on_token)](const Envelope& env) {
      cb(StructFromValue<TokenEvent>(env.content));
    };
  }
  p.idle_timeout_s = impl_->options.generate_idle_timeout_s;
  return impl_->Send(GenerateRequest::kType, session_id, StructToValue(request), std::move(p),
                     impl_->options.generate_idle_timeout_s);
}

std::string Client::Cancel(const std::string& generate_msg_id, std::function<void(const CancelReply&)> on_reply,
                           ErrorCallback on_error) {
  CancelRequest request{generate_msg_id};
  return impl_->Send(CancelRequest::kType, std::nullopt, StructToValue(request),
                     AsyncEntry<CancelReply>(std::move(on_reply), std::move(on_error)), impl_->options.request_timeout_s);
}

std::string Client::SetBudgetAsync(std::int64_t vram_budget_mib, const std::string& reason,
                                   std::function<void(const BudgetAck&)> on_ack, ErrorCallback on_error) {
  return SetBudgetAsync(SetBudgetRequest{vram_budget_mib, reason, std::nullopt}, std::move(on_ack), std::move(on_error));
}

std::string Client::SetBudgetAsync(const SetBudgetRequest& request, std::function<void(const BudgetAck&)> on_ack,
                                   ErrorCallback on_error) {
  RefuseOutOfRange(request);
  return impl_->Send(SetBudgetRequest::kType, std::nullopt, StructToValue(request),
                     AsyncEntry<BudgetAck>(std::move(on_ack), std::move(on_error)), impl_->options.budget_timeout_s);
}

std::string Client::FrameStatsAsync(const FrameStatsRequest& request,
                                    std::function<void(const FrameStatsReply&)> on_reply, ErrorCallback on_error) {
  return impl_->Send(FrameStatsRequest::kType, std::nullopt, StructToValue(request),
                     AsyncEntry<FrameStatsReply>(std::move(on_reply), std::move(on_error)),
                     impl_->options.request_timeout_s);
}

std::string Client::CreateSessionAsync(const CreateSessionRequest& request,
                                       std::function<void(const CreateSessionReply&)> on_reply,
                                       ErrorCallback on_error) {
  RefuseInvalid(request);
  return impl_->Send(CreateSessionRequest::kType, std::nullopt, StructToValue(request),
                     AsyncEntry<CreateSessionReply>(std::move(on_reply), std::move(on_error)),
                     impl_->options.request_timeout_s);
}

std::string Client::CloseSessionAsync(const std::string& session_id, std::function<void()> on_closed,
                                      ErrorCallback on_error) {
  std::function<void(const CloseSessionReply&)> wrapped;
  if (on_closed) wrapped = [cb = std::move(on_closed)](const CloseSessionReply&) { cb(); };
  return impl_->Send(CloseSessionRequest::kType, session_id, StructToValue(CloseSessionRequest{}),
                     AsyncEntry<CloseSessionReply>(std::move(wrapped), std::move(on_error)),
                     impl_->options.request_timeout_s);
}

}  // namespace igi
