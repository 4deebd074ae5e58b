// client_impl.hpp - IgiClientCore, client layer (private): Client::Impl, the I/O thread's state machine.
//
// Shared by client.cpp (I/O loop, correlation, deadlines, heartbeats, Pump) and client_requests.cpp
// (the typed blocking / asynchronous request wrappers).
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "igi/client.hpp"
#include "igi/transport.hpp"

namespace igi {
namespace detail {

inline double SteadyNow() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

inline constexpr double kMaxPollWaitS = 0.05;

/// One outstanding request.
struct Pending {
  std::string type;
  bool internal = false;  // heartbeat: no callbacks
  std::shared_ptr<std::promise<Envelope>> promise;  // blocking call
  std::function<void(const Envelope&)> on_event;     // async token_event (runs in Pump)
  std::function<void(const Envelope&)> on_reply;     // async success reply (runs in Pump)
  ErrorCallback on_error;
  double deadline = 0.0;
  double idle_timeout_s = 0.0;  // > 0: each event pushes the deadline out (streaming)
};

inline void DeliverError(const ErrorCallback& cb, const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const IgiError& e) {
    if (cb) cb(e);
  }
}

inline std::exception_ptr ErrorFromReply(const Envelope& env) {
  ErrorReply reply = StructFromValue<ErrorReply>(env.content);
  // the code exactly as received: an unknown one maps to InternalError but keeps its name in wire_code()
  const Value* raw = env.content.Find("code");
  std::string wire = raw != nullptr && raw->is_str() ? raw->as_str() : ErrorCodeName(reply.code);
  return MakeRequestError(wire, reply.message, reply.detail, reply.retryable);
}

/// Spec 6.6: error_reply{invalid_request, detail: {"duplicate_msg_id": true}} answers a generate_request that
/// reused the msg_id of a generation still running. Its parent_id names that first request, which goes on, so
/// it is not that request's terminal reply.
inline bool IsDuplicateMsgIdError(const Envelope& env) {
  if (env.header.type != ErrorReply::kType) return false;
  const Value* detail = env.content.Find("detail");
  const Value* flag = detail != nullptr ? detail->Find("duplicate_msg_id") : nullptr;
  return flag != nullptr && flag->is_bool() && flag->as_bool();
}

}  // namespace detail

using detail::DeliverError;
using detail::ErrorFromReply;
using detail::IsDuplicateMsgIdError;
using detail::kMaxPollWaitS;
using detail::Pending;
using detail::SteadyNow;

struct Client::Impl {
  ConnectionInfo info;
  std::string connection_file;  ///< the file `info` was read from (FromConnectionFile), else empty
  ClientOptions options;
  DealerTransport transport;

  mutable std::mutex mutex;  // guards everything below
  std::unordered_map<std::string, Pending> pending;
  std::deque<std::pair<std::string, std::function<void()>>> events;  // (msg_id, callback)
  HelloReply hello;
  bool connected = false;
  bool gone = false;  // declared gone after a handshake: new requests fail at once (this client does not reconnect)
  bool running = true;
  ClientCounters counters;
  double heartbeat_interval_s = 2.0;
  double min_heartbeat_interval_s = kMinHeartbeatIntervalS;  // lowered only by tests (ClientTestAccess)
  double client_timeout_s = 10.0;
  std::size_t max_frame_bytes = kDefaultMaxFrameBytes;
  double last_received = 0.0;
  double last_heartbeat_sent = 0.0;
  std::function<void(const IgiError&)> on_disconnected;

  std::thread io_thread;

  // The socket's ZMQ_MAXMSGSIZE starts at 2 x the default max_frame_bytes; Connect() replaces the socket when
  // hello_reply announces a limit that needs another cap (ipc/PROTOCOL.md 1.4).
  Impl(ConnectionInfo i, ClientOptions o)
      : info(std::move(i)),
        options(std::move(o)),
        transport(info.Endpoint(), options.linger_ms, MaxMsgBytesFor(static_cast<std::int64_t>(kDefaultMaxFrameBytes)),
                  info.PlainPassword()) {}

  // Registers a request and posts its frames. Returns the msg_id. Only hello_request may go out before Connect()
  // succeeded (spec 9.4: it is the first message a client sends); anything else throws NotConnectedError unsent.
  std::string Send(const std::string& type, const std::optional<std::string>& session_id, const Value& content,
                   Pending entry, double timeout_s) {
    // A session id the daemon cannot parse makes a header it cannot answer by msg_id: the request would only
    // time out. Refuse it here with the error the daemon would give.
    if (session_id) {
      try {
        CheckRule(*session_id, rules::kSessionId, "session_id");
      } catch (const DecodeError& e) {
        throw InvalidRequestError(ErrorCode::kInvalidRequest, "invalid_request", e.what(), Value());
      }
    }
    Header header = NewHeader(type, std::nullopt, session_id);
    Frames frames = PackFrames(info.key, header, content);
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!running) throw DaemonUnavailableError("client is closed");
      if (gone) throw DaemonUnavailableError("the daemon stopped answering; connect a new client");
      if (!connected && type != HelloRequest::kType) {
        throw NotConnectedError("not connected: call Connect() before sending " + type +
                                " (hello_request must be the first message)");
      }
      entry.type = type;
      entry.deadline = SteadyNow() + timeout_s;
      pending.emplace(header.msg_id, std::move(entry));
    }
    transport.Post(Multipart(frames.begin(), frames.end()));
    return header.msg_id;
  }

  // Fails a removed pending entry; caller holds the mutex.
  void FailLocked(const std::string& id, Pending& p, std::exception_ptr error) {
    if (p.internal) return;
    if (p.promise) {
      p.promise->set_exception(error);
    } else if (p.on_error) {
      events.emplace_back(id, [cb = std::move(p.on_error), error] { DeliverError(cb, error); });
    }
  }

  // Decodes outside the mutex, so a large message does not block Pump() or a request on the game thread; only
  // the I/O thread calls this, so messages are still dispatched in arrival order.
  void HandleIncoming(const Multipart& frames, double now) {
    std::size_t frame_limit;
    {
      std::lock_guard<std::mutex> lock(mutex);
      frame_limit = max_frame_bytes;
    }
    std::optional<Envelope> env = DecodeIncoming(frames, frame_limit);
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.messages_received;
    last_received = now;
    if (!env) {
      ++counters.dropped_invalid;  // spec 2: a client drops failing messages
      return;
    }
    try {
      DispatchLocked(*env, now);
    } catch (const std::exception&) {
      ++counters.dropped_invalid;  // e.g. std::bad_alloc queueing it: one message lost, not the I/O thread
    }
  }

  // Any exception, not only WireError: a std::bad_alloc from one hostile message used to escape to Run() and end
  // the I/O thread for good (the daemon declared gone). Spec 2: a bad message is dropped and the client goes on.
  std::optional<Envelope> DecodeIncoming(const Multipart& frames, std::size_t frame_limit) const {
    try {
      return UnpackFrames(info.key, frames, frame_limit);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  void DispatchLocked(Envelope& env, double now) {
    if (IsDuplicateMsgIdError(env)) {
      ++counters.dropped_duplicate_msg_id;  // spec 6.6: the request named by parent_id goes on
      return;
    }
    auto it = env.header.parent_id ? pending.find(*env.header.parent_id) : pending.end();
    if (it == pending.end()) {
      ++counters.dropped_unmatched;
      return;
    }
    Pending& p = it->second;
    if (env.header.type == TokenEvent::kType) {
      if (p.idle_timeout_s <= 0.0) {
        ++counters.dropped_unmatched;
        return;
      }
      p.deadline = now + p.idle_timeout_s;
      if (p.on_event) events.emplace_back(it->first, [cb = p.on_event, env] { cb(env); });
      return;
    }
    Pending done = std::move(p);
    std::string id = it->first;
    pending.erase(it);
    if (done.internal) return;
    bool is_error = env.header.type == ErrorReply::kType;
    if (!is_error && env.header.type != TerminalReplyType(done.type)) {
      FailLocked(id, done, std::make_exception_ptr(ProtocolError(
                           ErrorCode::kInvalidRequest, done.type + " answered with " + env.header.type)));
      return;
    }
    if (done.promise) {
      done.promise->set_value(std::move(env));
    } else if (is_error) {
      FailLocked(id, done, ErrorFromReply(env));
    } else if (done.on_reply) {
      events.emplace_back(id, [cb = std::move(done.on_reply), env] { cb(env); });
    }
  }

  // Fails every request past its deadline; returns the generations among them (the streams, idle too long), which
  // the daemon may still be running: the caller cancels them once the mutex is released.
  std::vector<std::string> CheckDeadlinesLocked(double now) {
    std::vector<std::string> streams;
    for (auto it = pending.begin(); it != pending.end();) {
      if (now < it->second.deadline) {
        ++it;
        continue;
      }
      Pending p = std::move(it->second);
      std::string id = it->first;
      it = pending.erase(it);
      if (p.idle_timeout_s > 0.0 && !p.internal) streams.push_back(id);
      FailLocked(id, p, std::make_exception_ptr(TimeoutError("no reply to " + p.type + " " + id + " within deadline")));
    }
    return streams;
  }

  // A generation the client gave up on (idle too long) would go on in the daemon and keep its session busy:
  // cancel it there, as the Python and C# clients do. Its reply is dropped (internal).
  void CancelAbandoned(const std::vector<std::string>& generate_ids) {
    for (const std::string& id : generate_ids) {
      Pending cancel;
      cancel.internal = true;
      try {
        Send(CancelRequest::kType, std::nullopt, StructToValue(CancelRequest{id}), std::move(cancel),
             options.request_timeout_s);
      } catch (const std::exception&) {
        return;  // closed or declared gone meanwhile: the daemon ends its generations itself
      }
    }
  }

  void DeclareGoneLocked(const std::string& why) {
    connected = false;
    gone = true;
    auto error = std::make_exception_ptr(DaemonUnavailableError(why));
    for (auto& [id, p] : pending) FailLocked(id, p, error);
    pending.clear();
    if (on_disconnected) events.emplace_back("", [cb = on_disconnected, error] { DeliverError(cb, error); });
  }

  void Heartbeat(double now) {
    bool send = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!connected) return;
      bool outstanding = std::any_of(pending.begin(), pending.end(), [](const auto& kv) { return kv.second.internal; });
      if (outstanding && now - last_received > client_timeout_s) {
        DeclareGoneLocked("daemon silent for " + std::to_string(client_timeout_s) + " s with a heartbeat outstanding");
        return;
      }
      send = now - last_heartbeat_sent >= heartbeat_interval_s;
      if (send) last_heartbeat_sent = now;
    }
    if (!send) return;
    Pending hb;
    hb.internal = true;
    try {
      Send(HeartbeatRequest::kType, std::nullopt, StructToValue(HeartbeatRequest{}), std::move(hb),
           client_timeout_s + heartbeat_interval_s);
    } catch (const std::exception&) {
      return;  // Close() ran since the check above (Send threw "client is closed"): this heartbeat is not sent
    }
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.heartbeats_sent;
  }

  // The I/O thread's body: no exception may leave it (one escaping a std::thread calls std::terminate).
  void Run() {
    try {
      Loop();
    } catch (...) {
      // Not expected (Poll and the heartbeat catch their own); fail what is outstanding rather than abort.
      try {
        std::lock_guard<std::mutex> lock(mutex);
        if (running) DeclareGoneLocked("client I/O thread failure");
        running = false;
      } catch (...) {
      }
    }
  }

  void Loop() {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (!running) return;
      }
      std::vector<Multipart> received;
      try {
        received = transport.Poll(kMaxPollWaitS);
      } catch (const std::exception&) {
        std::lock_guard<std::mutex> lock(mutex);
        DeclareGoneLocked("transport failure");
        running = false;
        return;
      }
      double now = SteadyNow();
      for (const Multipart& frames : received) HandleIncoming(frames, now);
      std::vector<std::string> abandoned;
      {
        std::lock_guard<std::mutex> lock(mutex);
        abandoned = CheckDeadlinesLocked(now);
      }
      CancelAbandoned(abandoned);
      Heartbeat(now);
    }
  }
};

}  // namespace igi
