// test_client_fake.cpp - IgiClientCore tests: the client against an in-process fake daemon (a ZeroMQ ROUTER on
// loopback speaking the real framing), for behaviour the real daemon cannot be made to show on demand: requests
// before the handshake, a duplicate_msg_id error_reply, Close() racing heartbeats, an IPv6 endpoint, throttling.
// No daemon or model needed: these run offline.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <cstdint>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "igi/client.hpp"
#include "igi/connect_task.hpp"
#include "igi/connection_file.hpp"
#include "igi/envelope.hpp"
#include "igi/frame_budget.hpp"
#include "igi/process_liveness.hpp"
#include "igi/signing.hpp"
#include "igi/transport.hpp"
#include "test_alloc.hpp"
#include "test_framework.hpp"
#include "../Source/IgiClientCore/Private/client_impl.hpp"  // ClientTestAccess reaches Client::Impl

namespace igi {

/// Friend of Client (client.hpp). Lowers the heartbeat floor (kMinHeartbeatIntervalS) before Connect(), only so
/// that a test can have a heartbeat due on every loop turn to stress races with Close().
struct ClientTestAccess {
  static void SetMinHeartbeatInterval(Client& client, double interval_s) {
    std::lock_guard<std::mutex> lock(client.impl_->mutex);
    client.impl_->min_heartbeat_interval_s = interval_s;
  }
};

}  // namespace igi

namespace {

/// One message the fake daemon sends back; parent_id defaults to the request's msg_id.
struct FakeReply {
  std::string type;
  igi::Value content;
  std::optional<std::string> parent_id;
  std::string raw_content;  ///< when not empty: the content frame as is (signed), instead of Encode(content)
};

template <class T>
FakeReply Reply(const T& message) {
  return FakeReply{T::kType, igi::StructToValue(message), std::nullopt, ""};
}

/// A reply whose content frame is `content_frame` as is (signed, not checked): for content no Value encodes to.
FakeReply RawReply(const std::string& type, std::string content_frame) {
  return FakeReply{type, igi::Value(), std::nullopt, std::move(content_frame)};
}

FakeReply DuplicateMsgIdError(bool flag) {
  igi::ErrorReply error;
  error.code = igi::ErrorCode::kInvalidRequest;
  error.message = "duplicate msg_id";
  error.detail = igi::Value(igi::ValueMap{{"duplicate_msg_id", flag}});
  return Reply(error);
}

/// How a FakeDaemon listens: loopback TCP, or `ipc_path`; with `plain`, as a ZMQ_PLAIN server that lets in only the
/// credential derived from its key (ipc/PROTOCOL.md 1.5), as the daemon does.
struct Listen {
  std::string ipc_path;
  bool plain = false;
};

/// A ROUTER bound to loopback on an ephemeral port (or an ipc path). It answers hello_request and heartbeat_request
/// itself and every other request with what `handler` returns (nothing by default). I/O runs on its own thread.
class FakeDaemon {
 public:
  using Handler = std::function<std::vector<FakeReply>(const igi::Envelope&)>;

  explicit FakeDaemon(Handler handler = {}, const std::string& host = "127.0.0.1",
                      double heartbeat_interval_s = 2.0, std::int64_t max_frame_bytes = 1048576,
                      double client_timeout_s = 10.0, const Listen& listen = {})
      : handler_(std::move(handler)),
        heartbeat_interval_s_(heartbeat_interval_s),
        max_frame_bytes_(max_frame_bytes),
        client_timeout_s_(client_timeout_s) {
    info_.key = std::string(32, '\x07');
    router_.set(zmq::sockopt::linger, 0);
    if (listen.plain) {
      // the ZAP handler first (RFC 27): libzmq asks it, in this context, whether a PLAIN handshake may complete
      zap_.set(zmq::sockopt::linger, 0);
      zap_.bind("inproc://zeromq.zap.01");
      zap_thread_ = std::thread([this] { ServeZap(); });
      router_.set(zmq::sockopt::zap_domain, "igi");
      router_.set(zmq::sockopt::plain_server, true);
    }
    bool ipv6 = host.find(':') != std::string::npos;
    if (ipv6 && listen.ipc_path.empty()) router_.set(zmq::sockopt::ipv6, true);
    if (listen.ipc_path.empty()) {
      router_.bind("tcp://" + (ipv6 ? "[" + host + "]" : host) + ":*");  // throws zmq::error_t if unavailable
      std::string endpoint = router_.get(zmq::sockopt::last_endpoint);
      info_.transport = "tcp";
      info_.ip = host;
      info_.port = std::stoll(endpoint.substr(endpoint.rfind(':') + 1));
    } else {
      router_.bind("ipc://" + listen.ipc_path);
      info_.transport = "ipc";
      info_.ip = listen.ipc_path;
      info_.port = 0;
    }
    info_.signature_scheme = "hmac-sha256";
    info_.protocol_version = igi::kProtocolVersion;
    info_.zmq_mechanism = listen.plain ? "plain" : "null";
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeDaemon() {
    stop_ = true;
    thread_.join();
    if (zap_thread_.joinable()) zap_thread_.join();
  }
  /// PLAIN handshakes the ZAP handler accepted and refused.
  int zap_accepted() const { return zap_accepted_; }
  int zap_refused() const { return zap_refused_; }
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  const igi::ConnectionInfo& info() const { return info_; }
  /// Types of the requests received so far, in arrival order (heartbeats left out unless asked for).
  std::vector<std::string> Received(bool with_heartbeats = false) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const std::string& t : received_) {
      if (with_heartbeats || t != igi::HeartbeatRequest::kType) out.push_back(t);
    }
    return out;
  }
  std::size_t sent() const { return sent_; }
  /// Answers each hello this much later (a daemon busy starting; its serving thread waits meanwhile).
  void DelayHello(double seconds) { hello_delay_s_ = seconds; }
  /// (type, ROUTER identity of the connection it came on) of every request received so far, heartbeats included.
  std::vector<std::pair<std::string, std::string>> ReceivedWithIdentity() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_with_identity_;
  }

 private:
  void Serve() {
    while (!stop_) {
      zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(5));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      std::vector<std::string> parts;
      zmq::message_t part;
      do {
        if (!router_.recv(part, zmq::recv_flags::none)) break;
        parts.emplace_back(part.to_string());
      } while (part.more());
      if (parts.size() < 2) continue;
      igi::Envelope request;
      try {
        request = igi::UnpackFrames(info_.key, std::vector<std::string>(parts.begin() + 1, parts.end()));
      } catch (const igi::WireError&) {
        std::lock_guard<std::mutex> lock(mutex_);
        received_.push_back("<invalid>");
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        received_.push_back(request.header.type);
        received_with_identity_.emplace_back(request.header.type, parts[0]);
      }
      for (const FakeReply& reply : Answer(request)) Send(parts[0], request, reply);
    }
  }

  void ServeZap() {
    const std::string password = igi::DerivePlainPassword(info_.key);
    while (!stop_) {
      zmq::pollitem_t items[] = {{zap_.handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 1, std::chrono::milliseconds(5));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      std::vector<std::string> request;
      zmq::message_t part;
      do {
        if (!zap_.recv(part, zmq::recv_flags::none)) break;
        request.emplace_back(part.to_string());
      } while (part.more());
      bool ok = request.size() == 8 && request[5] == "PLAIN" && request[6] == igi::kPlainUsername && request[7] == password;
      ++(ok ? zap_accepted_ : zap_refused_);
      std::vector<std::string> reply = {"1.0", request.size() > 1 ? request[1] : "", ok ? "200" : "400",
                                        ok ? "OK" : "refused", ok ? "igi" : "", ""};
      for (std::size_t i = 0; i < reply.size(); ++i) {
        zap_.send(zmq::buffer(reply[i]), i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    }
  }

  std::vector<FakeReply> Answer(const igi::Envelope& request) {
    const std::string& type = request.header.type;
    if (type == igi::HelloRequest::kType) {
      const double delay_s = hello_delay_s_.load();
      if (delay_s > 0.0) std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
      igi::HelloReply hello;
      hello.daemon_version = "fake";
      hello.protocol_version = igi::kProtocolVersion;
      hello.heartbeat_interval_s = heartbeat_interval_s_;
      hello.client_timeout_s = client_timeout_s_;
      hello.limits.max_frame_bytes = max_frame_bytes_;
      hello.limits.priority_ageing_per_s = 2.5;  // protocol 1.4
      return {Reply(hello)};
    }
    if (type == igi::HeartbeatRequest::kType) return {Reply(igi::HeartbeatReply{})};
    return handler_ ? handler_(request) : std::vector<FakeReply>{};
  }

  void Send(const std::string& identity, const igi::Envelope& request, const FakeReply& reply) {
    igi::Header header = igi::NewHeader(reply.type, reply.parent_id.value_or(request.header.msg_id),
                                        request.header.session_id);
    igi::Frames frames = igi::PackFrames(info_.key, header, reply.content);
    if (!reply.raw_content.empty()) {
      frames[3] = reply.raw_content;
      frames[1] = igi::SignHex(info_.key, frames[2], frames[3]);
    }
    router_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    for (std::size_t i = 0; i < frames.size(); ++i) {
      router_.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    ++sent_;
  }

  Handler handler_;
  double heartbeat_interval_s_;
  std::int64_t max_frame_bytes_;
  double client_timeout_s_;
  zmq::context_t context_{1};
  zmq::socket_t router_{context_, zmq::socket_type::router};
  zmq::socket_t zap_{context_, zmq::socket_type::rep};
  igi::ConnectionInfo info_;
  std::thread thread_;
  std::thread zap_thread_;
  std::atomic<int> zap_accepted_{0};
  std::atomic<int> zap_refused_{0};
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> sent_{0};
  std::atomic<double> hello_delay_s_{0.0};
  mutable std::mutex mutex_;
  std::vector<std::string> received_;
  std::vector<std::pair<std::string, std::string>> received_with_identity_;
};

/// Pumps `client` on this thread until `done` is true or `timeout_s` passes.
template <class Pred>
bool PumpUntil(igi::Client& client, Pred done, double timeout_s = 10.0) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (client.Pump() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// Waits (without pumping) until the client has received `n` messages in all.
bool WaitReceived(igi::Client& client, std::uint64_t n, double timeout_s = 10.0) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (client.counters().messages_received < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

igi::StatusReply AStatus(double uptime_s) {
  igi::StatusReply status;
  status.uptime_s = uptime_s;
  return status;
}

igi::TokenEvent Token(std::int64_t index, const std::string& text) {
  igi::TokenEvent token;
  token.index = index;
  token.text = text;
  token.token_id = 100 + index;
  return token;
}

igi::GenerateReply Done(const std::string& text, std::int64_t n_tokens) {
  igi::GenerateReply reply;
  reply.finish_reason = "stop";
  reply.text = text;
  reply.usage.prompt_tokens = 3;
  reply.usage.completion_tokens = n_tokens;
  return reply;
}

const std::string kSomeMsgId = "0123456789abcdef0123456789abcdef";

/// A status_reply whose content frame is a little over `n` bytes (its "pad" makes it unreadable as a status_reply,
/// and, over max_frame_bytes, too large to decode at all).
FakeReply Padded(std::size_t n) {
  return FakeReply{igi::StatusReply::kType, igi::Value(igi::ValueMap{{"pad", igi::Value(std::string(n, 'x'))}}),
                   std::nullopt, ""};
}

}  // namespace

TEST(client_refuses_requests_before_connect_and_sends_hello_first) {
  // Every request is answered, so without the refusal these would go out (and succeed) before hello_request.
  FakeDaemon daemon([](const igi::Envelope& request) -> std::vector<FakeReply> {
    if (request.header.type == igi::CreateSessionRequest::kType) return {Reply(igi::CreateSessionReply{"npc-1"})};
    if (request.header.type == igi::StatusRequest::kType) return {Reply(AStatus(1.0))};
    if (request.header.type == igi::CancelRequest::kType) return {Reply(igi::CancelReply{false})};
    if (request.header.type == igi::GenerateRequest::kType) return {Reply(Done("", 0))};
    return {};
  });
  igi::ClientOptions options;
  options.request_timeout_s = 2.0;
  options.connect_timeout_s = 5.0;
  igi::Client client(daemon.info(), options);
  CHECK(!client.connected());
  CHECK_THROWS_AS(client.CreateSession(igi::CreateSessionRequest{}), igi::NotConnectedError);
  CHECK_THROWS_AS(client.Status(), igi::NotConnectedError);
  CHECK_THROWS_AS(client.CallRaw(igi::StatusRequest::kType, std::nullopt, igi::Value(igi::ValueMap{}), 2.0),
                  igi::NotConnectedError);
  igi::GenerateRequest generate;
  generate.text = "hello?";
  CHECK_THROWS_AS(client.Generate("npc-1", generate, igi::GenerateCallbacks{}), igi::NotConnectedError);
  CHECK_THROWS_AS(client.Cancel(kSomeMsgId), igi::NotConnectedError);
  CHECK_THROWS_AS(client.CreateSessionAsync(igi::CreateSessionRequest{}, {}), igi::NotConnectedError);
  CHECK_THROWS_AS(client.SetBudgetAsync(0, "", {}), igi::NotConnectedError);
  // Levels the daemon would refuse are refused first, unsent, with its invalid_request (protocol 1.3).
  CHECK_THROWS_AS(client.SetBudget(0, "", std::vector<std::int64_t>(igi::kMaxBudgetLevels + 1, 0)),
                  igi::InvalidRequestError);
  CHECK_THROWS_AS(client.SetBudgetAsync(igi::SetBudgetRequest{0, "", std::vector<std::int64_t>{-1}}, {}),
                  igi::InvalidRequestError);
  CHECK_THROWS_AS(client.SetBudget(0, "", std::vector<std::int64_t>{6144, 0}), igi::NotConnectedError);
  try {
    client.Status();
  } catch (const igi::IgiError& e) {
    CHECK_EQ(e.kind(), std::string("not_connected"));  // usable without RTTI (Unreal)
    CHECK(dynamic_cast<const igi::TransportError*>(&e) != nullptr);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_MSG(daemon.Received(true).empty(), "sent before Connect(): " << daemon.Received(true).size() << " messages, first "
                                                                     << daemon.Received(true).front());
  // Connect() sends hello_request, the first message on the wire; then requests go out.
  client.Connect();
  CHECK(client.connected());
  CHECK_EQ(client.Status().uptime_s, 1.0);
  std::vector<std::string> received = daemon.Received();
  REQUIRE(received.size() == 2u);
  CHECK_EQ(received[0], std::string(igi::HelloRequest::kType));
  CHECK_EQ(received[1], std::string(igi::StatusRequest::kType));
  // After Close() a request is refused as closed, not as "not connected".
  client.Close();
  CHECK_THROWS_AS(client.Status(), igi::DaemonUnavailableError);
}

TEST(client_refuses_grammar_with_json_schema_and_a_tool_name_twice_unsent) {
  FakeDaemon daemon([](const igi::Envelope& request) -> std::vector<FakeReply> {
    if (request.header.type == igi::CreateSessionRequest::kType) return {Reply(igi::CreateSessionReply{"npc-1"})};
    if (request.header.type == igi::GenerateRequest::kType) return {Reply(Done("", 0))};
    return {};
  });
  igi::ClientOptions options;
  options.request_timeout_s = 2.0;
  igi::Client client(daemon.info(), options);
  client.Connect();
  igi::GenerateRequest both;
  both.text = "hi";
  both.grammar = std::string("root ::= \"yes\"");
  both.json_schema = std::string("{\"type\": \"boolean\"}");
  CHECK_THROWS_AS(client.Generate("npc-1", both, igi::GenerateCallbacks{}), igi::InvalidRequestError);
  igi::CreateSessionRequest twice;
  igi::Tool give;
  give.name = "give_item";
  twice.tools = {give, give};
  CHECK_THROWS_AS(client.CreateSession(twice), igi::InvalidRequestError);
  CHECK_THROWS_AS(client.CreateSessionAsync(twice, {}), igi::InvalidRequestError);
  igi::CreateSessionRequest session_both;
  session_both.grammar = both.grammar;
  session_both.json_schema = both.json_schema;
  try {
    client.CreateSession(session_both);
    CHECK_MSG(false, "grammar and json_schema together were sent");
  } catch (const igi::IgiError& e) {
    CHECK_EQ(e.kind(), std::string("invalid_request"));
    CHECK(std::string(e.what()).find("at most one of grammar and json_schema") != std::string::npos);
  }
  // None of them reached the daemon; the valid forms do.
  twice.tools.pop_back();
  CHECK_EQ(client.CreateSession(twice).session_id, std::string("npc-1"));
  std::vector<std::string> received = daemon.Received();
  REQUIRE(received.size() == 2u);
  CHECK_EQ(received[0], std::string(igi::HelloRequest::kType));
  CHECK_EQ(received[1], std::string(igi::CreateSessionRequest::kType));
  client.Close();
}

TEST(client_async_requests_time_out_and_forget_drops_their_callbacks) {
  FakeDaemon daemon;  // answers hello and heartbeats only
  igi::ClientOptions options;
  options.request_timeout_s = 0.3;
  igi::Client client(daemon.info(), options);
  client.Connect();
  std::string error, forgotten_error;
  std::string forgotten = client.CreateSessionAsync(igi::CreateSessionRequest{}, {},
                                                    [&](const igi::IgiError& e) { forgotten_error = e.what(); });
  client.Forget(forgotten);  // UIgiNpcComponent::EndPlay: nothing more is delivered for it
  client.CreateSessionAsync(igi::CreateSessionRequest{}, {}, [&](const igi::IgiError& e) { error = e.what(); });
  REQUIRE(PumpUntil(client, [&] { return !error.empty(); }));
  CHECK(error.find("no reply to create_session_request") != std::string::npos);
  client.Pump();
  CHECK(forgotten_error.empty());
  // The calls UIgiSubsystem makes on shutdown exist and fail typed (this daemon does not answer them).
  CHECK_THROWS_AS((client.Call<igi::ShutdownRequest, igi::ShutdownReply>(igi::ShutdownRequest{}, std::nullopt, 0.2)),
                  igi::TimeoutError);
  client.Close();
  CHECK_THROWS_AS(client.Status(), igi::DaemonUnavailableError);
}

TEST(client_cancels_a_generation_it_gave_up_on_in_the_daemon) {
  // The stream went silent past generate_idle_timeout_s: the game hears a TimeoutError, and the daemon, which may
  // still be generating into the request, is told to cancel it (else the NPC's next Say finds its session busy).
  FakeDaemon daemon;  // answers hello and heartbeats only
  igi::ClientOptions options;
  options.generate_idle_timeout_s = 0.2;
  igi::Client client(daemon.info(), options);
  client.Connect();
  std::string error;
  igi::GenerateCallbacks callbacks;
  callbacks.on_error = [&](const igi::IgiError& e) { error = e.kind(); };
  igi::GenerateRequest request;
  request.text = "go";
  client.Generate("npc-1", request, callbacks);
  REQUIRE(PumpUntil(client, [&] { return !error.empty(); }));
  CHECK_EQ(error, std::string("timeout"));
  bool cancelled = false;
  for (int i = 0; i < 200 && !cancelled; ++i) {
    const std::vector<std::string> received = daemon.Received();
    cancelled = std::find(received.begin(), received.end(), "cancel_request") != received.end();
    if (!cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(cancelled);
}

TEST(client_drops_duplicate_msg_id_error_reply_and_the_request_goes_on) {
  // Spec 6.6: an error_reply flagged duplicate_msg_id names (by parent_id) a request that goes on; it must not end it.
  FakeDaemon daemon([](const igi::Envelope& request) -> std::vector<FakeReply> {
    const std::string& type = request.header.type;
    if (type == igi::GenerateRequest::kType) {
      return {Reply(Token(0, "Hel")), DuplicateMsgIdError(true), Reply(Token(1, "lo")), Reply(Done("Hello", 2))};
    }
    if (type == igi::StatusRequest::kType) return {DuplicateMsgIdError(true), Reply(AStatus(42.0))};
    if (type == igi::CloseSessionRequest::kType) return {DuplicateMsgIdError(false)};  // an ordinary error: terminal
    return {};
  });
  igi::ClientOptions options;
  options.request_timeout_s = 5.0;
  igi::Client client(daemon.info(), options);
  client.Connect();
  std::string text, error;
  std::optional<igi::GenerateReply> done;
  igi::GenerateCallbacks callbacks;
  callbacks.on_token = [&](const igi::TokenEvent& t) { text += t.text; };
  callbacks.on_done = [&](const igi::GenerateReply& r) { done = r; };
  callbacks.on_error = [&](const igi::IgiError& e) { error = e.what(); };
  igi::GenerateRequest request;
  request.text = "hi";
  client.Generate("npc-1", request, callbacks);
  REQUIRE(PumpUntil(client, [&] { return done.has_value() || !error.empty(); }));
  CHECK_MSG(error.empty(), "the duplicate_msg_id error_reply ended the generation: " << error);
  REQUIRE(done.has_value());
  CHECK_EQ(done->text, std::string("Hello"));
  CHECK_EQ(text, std::string("Hello"));  // the token after the error_reply was still delivered
  CHECK_EQ(client.counters().dropped_duplicate_msg_id, 1u);
  // A blocking call waits past it for its real reply.
  CHECK_EQ(client.Status().uptime_s, 42.0);
  CHECK_EQ(client.counters().dropped_duplicate_msg_id, 2u);
  CHECK_EQ(client.counters().dropped_unmatched, 0u);
  // An error_reply whose detail.duplicate_msg_id is false is an ordinary terminal error.
  CHECK_THROWS_AS(client.CloseSession("npc-1"), igi::InvalidRequestError);
  CHECK_EQ(client.counters().dropped_duplicate_msg_id, 2u);
}

TEST(client_close_racing_heartbeats_never_terminates_the_process) {
  // A heartbeat due at the instant Close() stops the client used to throw out of the I/O thread
  // (std::terminate). Run Connect/Close against a daemon asking for a heartbeat on every loop turn, in a child
  // process so that an abort is reported instead of killing the test runner.
  std::cout.flush();
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int rc = 0;
    try {
      FakeDaemon daemon([](const igi::Envelope&) { return std::vector<FakeReply>{Reply(AStatus(1.0))}; }, "127.0.0.1",
                        /*heartbeat_interval_s=*/1e-6);
      std::mt19937 random(12345);
      std::uint64_t heartbeats = 0;
      for (int i = 0; i < 300; ++i) {
        igi::Client client(daemon.info());
        igi::ClientTestAccess::SetMinHeartbeatInterval(client, 0.0);  // below the spec's floor, to make the race likely
        client.Connect();
        client.Status();  // its reply wakes the I/O loop: from then on every turn sends a heartbeat
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));
        client.Close();
        heartbeats += client.counters().heartbeats_sent;
      }
      if (heartbeats < 300) rc = 3;  // the race was not exercised
    } catch (...) {
      rc = 2;
    }
    ::_exit(rc);
  }
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  pid_t done = 0;
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    CHECK_MSG(false, "Connect/Close stress did not finish within 120 s");
    return;
  }
  CHECK_MSG(!WIFSIGNALED(status), "the child died of signal " << WTERMSIG(status)
                                                              << " (an exception escaped the I/O thread)");
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "child exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
                                 << " (2: a client call threw, 3: too few heartbeats to exercise the race)");
}

TEST(client_drops_a_message_whose_decoding_runs_out_of_memory_and_keeps_working) {
  // A std::bad_alloc decoding one message used to escape to the I/O thread's Run(): the thread ended and the daemon
  // was declared gone. Here allocations of 1 MiB and more fail while a status_reply holding an array of 65536 nils
  // (64 KiB on the wire, several MiB as Values) is decoded: that message must be dropped like an invalid one.
  std::string nils = "\x81\xa3pad\xdd";
  for (std::uint32_t n = 65536, i = 0; i < 4; ++i) nils += static_cast<char>((n >> (8 * (3 - i))) & 0xff);
  nils.append(65536, static_cast<char>(0xc0));
  std::atomic<int> statuses{0};
  FakeDaemon daemon(
      [&](const igi::Envelope& request) -> std::vector<FakeReply> {
        if (request.header.type != igi::StatusRequest::kType) return {};
        if (statuses++ == 0) return {RawReply(igi::StatusReply::kType, nils), Reply(AStatus(1.0))};
        return {Reply(AStatus(2.0))};
      },
      "127.0.0.1", /*heartbeat_interval_s=*/1000.0);
  igi::ClientOptions options;
  options.request_timeout_s = 10.0;
  igi::Client client(daemon.info(), options);
  client.Connect();
  std::string disconnected;
  client.SetOnDisconnected([&](const igi::IgiError& e) { disconnected = e.what(); });
  {
    igi_test::FailAllocationsFrom exhausted(1u << 20);
    try {
      CHECK_EQ(client.Status().uptime_s, 1.0);  // the reply after the dropped one
    } catch (const igi::IgiError& e) {
      CHECK_MSG(false, "Status() threw " << e.kind() << ": " << e.what());
    }
  }
  CHECK_EQ(client.counters().dropped_invalid, 1u);
  CHECK(client.connected());
  CHECK_EQ(client.Status().uptime_s, 2.0);
  client.Pump();
  CHECK_MSG(disconnected.empty(), "declared gone: " << disconnected);
}

TEST(client_sends_heartbeats_at_most_every_0_1_s_whatever_the_daemon_announces) {
  // ipc/PROTOCOL.md 11: a heartbeat_interval_s under 0.1 s (0 included) is read as 0.1 s. Announced 1e-6, the client
  // sent one on every turn of its I/O loop (each reply woke it for the next): thousands a second. Announced 0, it
  // fell back to the 2 s default. The bounds are loose: the loop checks every 50 ms at most.
  for (double announced : {1e-6, 0.0}) {
    FakeDaemon daemon({}, "127.0.0.1", announced);
    igi::Client client(daemon.info());
    auto start = std::chrono::steady_clock::now();
    client.Connect();
    auto three = [&] { return client.counters().heartbeats_sent >= 3; };
    CHECK_MSG(PumpUntil(client, three, 1.5), "announced " << announced << ": fewer than 3 heartbeats within 1.5 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    std::uint64_t sent = client.counters().heartbeats_sent;
    double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double most = elapsed_s / igi::kMinHeartbeatIntervalS + 2;
    CHECK_MSG(sent <= most, "announced " << announced << ": " << sent << " heartbeats in " << elapsed_s << " s");
  }
}

TEST(client_handshakes_again_on_a_socket_capped_at_twice_the_announced_max_frame_bytes) {
  // ipc/PROTOCOL.md 1.4 / 10: replies are decoded with hello_reply.limits.max_frame_bytes and the socket's
  // ZMQ_MAXMSGSIZE is twice it. libzmq applies that option only to later connections, so a daemon announcing 4096
  // gets a second hello on a fresh socket capped at 8192.
  std::atomic<int> statuses{0};
  FakeDaemon daemon(
      [&](const igi::Envelope& request) -> std::vector<FakeReply> {
        if (request.header.type != igi::StatusRequest::kType) return {};
        // First: over max_frame_bytes but under the cap (the decoder drops it), then a readable reply.
        if (statuses++ == 0) return {Padded(5000), Reply(AStatus(1.0))};
        return {Padded(3 * 4096)};  // over the cap: libzmq drops the connection
      },
      "127.0.0.1", /*heartbeat_interval_s=*/0.05, /*max_frame_bytes=*/4096, /*client_timeout_s=*/1.0);
  igi::ClientOptions options;
  options.request_timeout_s = 30.0;
  igi::Client client(daemon.info(), options);
  CHECK_EQ(client.max_msg_bytes(), 2 * 1048576);  // before the handshake: 2 x the default limit
  igi::HelloReply hello = client.Connect();
  CHECK_EQ(hello.limits.max_frame_bytes, 4096);
  CHECK_EQ(hello.limits.priority_ageing_per_s, 2.5);
  CHECK_EQ(client.hello().limits.priority_ageing_per_s, 2.5);
  CHECK_EQ(client.max_msg_bytes(), 8192);
  std::vector<std::pair<std::string, std::string>> hellos;
  for (const auto& entry : daemon.ReceivedWithIdentity()) {
    if (entry.first == igi::HelloRequest::kType) hellos.push_back(entry);
  }
  REQUIRE(hellos.size() == 2u);  // the first handshake, then one on the socket with the announced cap
  CHECK_MSG(hellos[0].second != hellos[1].second, "the second hello_request came on the same connection");
  // Under the cap: delivered, and the 5000-byte frame dropped by the decoder; the connection stays up.
  CHECK_EQ(client.Status().uptime_s, 1.0);
  CHECK_EQ(client.counters().dropped_invalid, 1u);
  for (const auto& entry : daemon.ReceivedWithIdentity()) {
    if (entry.first == igi::StatusRequest::kType) CHECK(entry.second == hellos[1].second);
  }
  // Over the cap: libzmq cuts the connection for good (a protocol error is not reconnected); the frame never reaches
  // the client, whose heartbeats can no longer go out: the daemon is declared gone after client_timeout_s (1 s),
  // long before the request's own 30 s timeout, and no send blocks the I/O thread.
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.Status(), igi::DaemonUnavailableError);
  double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_MSG(waited_s < 10.0, "declared gone after " << waited_s << " s");
  CHECK_EQ(client.counters().dropped_invalid, 1u);  // the frame over the cap was never decoded
  client.Close();  // returns: the I/O thread is not stuck in a send to the lost daemon
  CHECK_EQ(igi::MaxMsgBytesFor(1048576), 2 * 1048576);
  CHECK_EQ(igi::MaxMsgBytesFor(INT64_MAX), -1);
}

TEST(client_reaches_a_daemon_bound_on_ipv6_loopback) {
  CHECK(igi::EndpointNeedsIpv6("tcp://[::1]:5555"));
  CHECK(!igi::EndpointNeedsIpv6("tcp://127.0.0.1:5555"));
  CHECK(!igi::EndpointNeedsIpv6("tcp://localhost:5555"));
  CHECK(!igi::EndpointNeedsIpv6("ipc:///tmp/igi:1.sock"));
  igi::ConnectionInfo info;
  info.transport = "tcp";
  info.port = 5555;
  for (const char* ip : {"::1", "[::1]"}) {
    info.ip = ip;
    CHECK_EQ(info.Endpoint(), std::string("tcp://[::1]:5555"));
  }
  std::unique_ptr<FakeDaemon> daemon;
  try {
    daemon = std::make_unique<FakeDaemon>(FakeDaemon::Handler{}, "::1");
  } catch (const zmq::error_t& e) {
    std::cout << "    IPv6 loopback unavailable on this machine (" << e.what() << "): connection not tried"
              << std::endl;
    return;
  }
  igi::ClientOptions options;
  options.connect_timeout_s = 3.0;
  igi::Client client(daemon->info(), options);  // info.ip is "::1", as the daemon writes it
  CHECK_EQ(client.connection().Endpoint().rfind("tcp://[::1]:", 0), 0u);
  client.Connect();  // without ZMQ_IPV6 on the DEALER this times out
  CHECK(client.connected());
}

TEST(client_presents_the_plain_credential_the_connection_file_names_over_tcp_and_ipc) {
  // ipc/PROTOCOL.md 1.5: a daemon whose file says "zmq_mechanism": "plain" lets in only the derived credential.
  char dir_template[] = "/tmp/igi-cpp-XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string ipc_path = std::string(dir_template) + "/daemon.sock";
  for (const std::string& where : {std::string(), ipc_path}) {
    FakeDaemon daemon(FakeDaemon::Handler{}, "127.0.0.1", 2.0, 1048576, 10.0, Listen{where, true});
    CHECK_EQ(daemon.info().zmq_mechanism, std::string("plain"));
    CHECK_EQ(daemon.info().Endpoint().rfind(where.empty() ? "tcp://127.0.0.1:" : "ipc:///tmp/igi-cpp-", 0), 0u);
    igi::ClientOptions options;
    options.connect_timeout_s = 5.0;
    igi::Client client(daemon.info(), options);
    client.Connect();
    CHECK(client.connected());
    CHECK_EQ(daemon.zap_accepted(), 1);
    // The same daemon reached without the credential (a file without the field, from a daemon before 1.2): the
    // PLAIN server never completes the handshake, so the hello is not even read.
    igi::ConnectionInfo without = daemon.info();
    without.zmq_mechanism = "null";
    options.connect_timeout_s = 0.5;
    igi::Client old(without, options);
    CHECK_THROWS_AS(old.Connect(), igi::TimeoutError);
    igi::ConnectionInfo forged = daemon.info();
    forged.key = std::string(32, '\x5a');  // another launch's key: another credential
    igi::Client intruder(forged, options);
    CHECK_THROWS_AS(intruder.Connect(), igi::TimeoutError);
    CHECK(daemon.zap_refused() >= 1);
    CHECK(daemon.Received() == std::vector<std::string>{igi::HelloRequest::kType});
  }
  ::unlink(ipc_path.c_str());
  ::rmdir(dir_template);
}

namespace {

std::int64_t NoSuchPid() {
  std::ifstream pid_max("/proc/sys/kernel/pid_max");
  std::int64_t above = 0;
  pid_max >> above;
  return above + 1;  // above pid_max: never a process
}

std::string WriteConnectionFile(const igi::ConnectionInfo& info, std::int64_t pid, std::int64_t start_ticks) {
  char path[] = "/tmp/igi-stale-XXXXXX";
  int fd = mkstemp(path);  // mode 0600
  std::string key_hex;
  for (unsigned char c : info.key) {
    static const char* digits = "0123456789abcdef";
    key_hex += digits[c >> 4];
    key_hex += digits[c & 15];
  }
  std::string text = "{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", \"port\": " + std::to_string(info.port) +
                     ", \"key\": \"" + key_hex + "\", \"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.2\", " +
                     "\"pid\": " + std::to_string(pid) + ", \"zmq_mechanism\": \"null\", \"pid_start_ticks\": " +
                     std::to_string(start_ticks) + "}";
  REQUIRE(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  ::close(fd);
  return path;
}

}  // namespace

TEST(client_connect_to_a_stale_connection_file_fails_after_a_short_handshake) {
  // A daemon killed with SIGKILL leaves its file: its pid is gone (or went to another process) and nobody answers.
  igi::ConnectionInfo nobody;
  nobody.key = std::string(32, '\x07');
  {
    FakeDaemon closed;  // a port that was bound, then closed
    nobody.port = closed.info().port;
  }
  const std::int64_t me = ::getpid();
  const std::optional<std::int64_t> start = igi::ProcessStartTicks(me);
  REQUIRE(start.has_value());
  for (auto [pid, ticks] : {std::pair<std::int64_t, std::int64_t>{NoSuchPid(), 1}, {me, *start + 1}}) {
    const std::string path = WriteConnectionFile(nobody, pid, ticks);
    igi::ClientOptions options;
    options.connect_timeout_s = 10.0;
    options.stale_connect_timeout_s = 0.3;
    auto client = igi::Client::FromConnectionFile(path, options);
    const auto began = std::chrono::steady_clock::now();
    try {
      client->Connect();
      CHECK(false);  // must not connect
    } catch (const igi::StaleConnectionFileError& e) {
      CHECK_EQ(e.pid(), pid);
      CHECK_EQ(e.kind(), std::string("stale_connection_file"));
      CHECK(std::string(e.what()).find(path) != std::string::npos);
      CHECK(std::string(e.what()).find("no longer running") != std::string::npos);
    }
    const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    CHECK(took_s < options.connect_timeout_s / 2);  // the short handshake, not connect_timeout_s
    std::remove(path.c_str());
  }
}

TEST(client_connects_through_a_gone_pid_whose_daemon_answers) {
  // The pid may be of another pid namespace (a daemon in a container): the short handshake decides.
  FakeDaemon daemon;
  const std::string path = WriteConnectionFile(daemon.info(), NoSuchPid(), 1);
  igi::ClientOptions options;
  options.stale_connect_timeout_s = 5.0;
  auto client = igi::Client::FromConnectionFile(path, options);
  client->Connect();
  CHECK(client->connected());
  std::remove(path.c_str());
}

TEST(frame_budget_pump_budget_caps_callbacks_only_when_advised) {
  igi::FrameBudget budget;
  CHECK_EQ(budget.PumpBudget(), SIZE_MAX);  // no advice yet: no cap
  igi::FrameStatsReply advice;
  advice.throttle.tokens_per_frame = 2;
  budget.ApplyAdvice(advice);
  CHECK_EQ(budget.PumpBudget(), 2u);
  advice.throttle.tokens_per_frame = 0;
  budget.ApplyAdvice(advice);
  CHECK_EQ(budget.PumpBudget(), SIZE_MAX);
  advice.throttle.tokens_per_frame = std::nullopt;  // nil = unlimited
  budget.ApplyAdvice(advice);
  CHECK_EQ(budget.PumpBudget(), SIZE_MAX);

  // Through a client: 5 token_events + generate_reply queued; Pump(PumpBudget()) runs them all without a cap,
  // and at most tokens_per_frame per frame with one.
  FakeDaemon daemon([](const igi::Envelope& request) -> std::vector<FakeReply> {
    if (request.header.type != igi::GenerateRequest::kType) return {};
    std::vector<FakeReply> replies;
    for (int i = 0; i < 5; ++i) replies.push_back(Reply(Token(i, "x")));
    replies.push_back(Reply(Done("xxxxx", 5)));
    return replies;
  }, "127.0.0.1", /*heartbeat_interval_s=*/1000.0);  // no heartbeat reply among the counted messages
  igi::Client client(daemon.info());
  client.Connect();
  std::uint64_t received = client.counters().messages_received;
  int tokens = 0, finished = 0;
  igi::GenerateCallbacks callbacks;
  callbacks.on_token = [&](const igi::TokenEvent&) { ++tokens; };
  callbacks.on_done = [&](const igi::GenerateReply&) { ++finished; };
  igi::GenerateRequest request;
  request.text = "go";
  budget = igi::FrameBudget();
  client.Generate("npc-1", request, callbacks);
  REQUIRE(WaitReceived(client, received + 6));
  CHECK_EQ(client.Pump(budget.PumpBudget()), 6u);
  CHECK_EQ(tokens, 5);
  CHECK_EQ(finished, 1);

  advice.throttle.tokens_per_frame = 2;
  budget.ApplyAdvice(advice);
  client.Generate("npc-1", request, callbacks);
  REQUIRE(WaitReceived(client, received + 12));
  CHECK_EQ(client.Pump(budget.PumpBudget()), 2u);
  CHECK_EQ(client.Pump(budget.PumpBudget()), 2u);
  CHECK_EQ(client.Pump(budget.PumpBudget()), 2u);
  CHECK_EQ(client.Pump(budget.PumpBudget()), 0u);
  CHECK_EQ(tokens, 10);
  CHECK_EQ(finished, 2);
}

TEST(frame_budget_driver_sends_the_budget_and_levels_again_to_a_restarted_daemon) {
  // A restarted daemon knows nothing of the game: a driver made for the new client sends it the budget override and
  // the declared levels again, though neither changed since the first daemon had them.
  std::mutex mutex;
  std::vector<igi::SetBudgetRequest> first, second;
  auto recorder = [&](std::vector<igi::SetBudgetRequest>& into) {
    return [&mutex, &into](const igi::Envelope& request) -> std::vector<FakeReply> {
      if (request.header.type != igi::SetBudgetRequest::kType) return {};
      std::lock_guard<std::mutex> lock(mutex);
      into.push_back(igi::StructFromValue<igi::SetBudgetRequest>(request.content));
      return {};
    };
  };
  auto sent = [&](const std::vector<igi::SetBudgetRequest>& requests) {
    std::lock_guard<std::mutex> lock(mutex);
    return requests;
  };
  igi::FrameBudget budget;
  budget.SetBudgetOverride(2048);
  budget.DeclareBudgetLevels({6144, 2048, 0});
  {
    FakeDaemon daemon(recorder(first));
    igi::Client client(daemon.info());
    client.Connect();
    igi::FrameBudgetDriver driver(client, budget);
    driver.Tick(16.0, 1.0);
    for (int i = 0; i < 200 && sent(first).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }  // the first daemon goes (unanswered: the driver forgets its request)
  FakeDaemon restarted(recorder(second));
  igi::Client client(restarted.info());
  client.Connect();
  igi::FrameBudgetDriver driver(client, budget);
  driver.Tick(16.0, 2.0);
  for (int i = 0; i < 200 && sent(second).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::vector<std::int64_t> levels{6144, 2048, 0};
  REQUIRE(sent(first).size() == 1u);
  CHECK_EQ(sent(first)[0].vram_budget_mib, 2048);
  CHECK(sent(first)[0].levels_mib == std::optional<std::vector<std::int64_t>>(levels));
  REQUIRE(sent(second).size() == 1u);
  CHECK_EQ(sent(second)[0].vram_budget_mib, 2048);
  CHECK(sent(second)[0].levels_mib == std::optional<std::vector<std::int64_t>>(levels));
}

namespace {

/// A daemon that refuses the first set_budget_request and acknowledges the rest, with a driver ticked against it.
struct FailFirstBudget {
  std::mutex mutex;
  std::vector<igi::SetBudgetRequest> sent;
  FakeDaemon daemon{[this](const igi::Envelope& request) -> std::vector<FakeReply> {
    if (request.header.type != igi::SetBudgetRequest::kType) return {};
    std::lock_guard<std::mutex> lock(mutex);
    sent.push_back(igi::StructFromValue<igi::SetBudgetRequest>(request.content));
    if (sent.size() == 1) {
      igi::ErrorReply error;
      error.code = igi::ErrorCode::kInternal;
      error.message = "not now";
      return {Reply(error)};
    }
    igi::BudgetAck ack;
    ack.requested_mib = ack.granted_mib = sent.back().vram_budget_mib;
    return {Reply(ack)};
  }};
  igi::Client client{daemon.info()};
  igi::FrameBudget budget;
  std::optional<igi::FrameBudgetDriver> driver;
  int errors = 0, acks = 0;

  /// Connects and makes the driver (set the budget's override and levels before).
  void Start() {
    client.Connect();
    driver.emplace(client, budget);
    driver->SetOnError([this](const igi::IgiError&) { ++errors; });
    driver->SetOnBudgetAck([this](const igi::BudgetAck&) { ++acks; });
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return sent.size();
  }
  /// Ticks at `now_s` (a frame of 16 ms), pumping the client, until `done` or 400 ticks.
  void TickUntil(double now_s, const std::function<bool()>& done) {
    for (int i = 0; i < 400 && !done(); ++i) {
      driver->Tick(16.0, now_s);
      client.Pump();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
};

}  // namespace

TEST(frame_budget_driver_sends_a_failed_budget_request_again) {
  // The daemon refuses the first set_budget_request and acknowledges the next: the driver sends the budget (with its
  // levels) again after report_interval_s, and once it is acknowledged, no more.
  FailFirstBudget f;
  f.budget.DeclareBudgetLevels({2048, 0});
  f.budget.SetBudgetOverride(2048);
  f.Start();
  f.TickUntil(1.0, [&] { return f.errors == 1; });
  REQUIRE(f.errors == 1);
  f.TickUntil(1.2, [&] { return f.count() > 1; });  // within report_interval_s of the failure: not yet
  CHECK_EQ(f.count(), 1u);
  f.TickUntil(1.6, [&] { return f.acks == 1; });
  REQUIRE(f.count() == 2u);
  CHECK_EQ(f.sent[1].vram_budget_mib, 2048);
  CHECK(f.sent[1].levels_mib == std::optional<std::vector<std::int64_t>>(std::vector<std::int64_t>{2048, 0}));
  f.TickUntil(3.0, [&] { return f.count() > 2; });
  CHECK_EQ(f.count(), 2u);
  // Levels refused unsent (more than 16): reported, and the budget goes at the next tick without them.
  f.budget.DeclareBudgetLevels(std::vector<std::int64_t>(igi::kMaxBudgetLevels + 1, 0));
  f.budget.SetBudgetOverride(1024);
  f.driver->Tick(16.0, 4.0);
  CHECK_EQ(f.errors, 2);
  f.TickUntil(4.0, [&] { return f.acks == 2; });
  REQUIRE(f.count() == 3u);
  CHECK_EQ(f.sent[2].vram_budget_mib, 1024);
  CHECK(!f.sent[2].levels_mib.has_value());
}

TEST(frame_budget_driver_sends_a_newer_budget_during_the_wait_after_a_failure) {
  // The wait after a failed request holds back only the budget that failed: a reclaim to 0 the game asks for
  // meanwhile goes at once.
  FailFirstBudget f;
  f.budget.SetBudgetOverride(2048);
  f.Start();
  f.TickUntil(1.0, [&] { return f.errors == 1; });
  REQUIRE(f.errors == 1);
  f.budget.SetBudgetOverride(0);
  f.TickUntil(1.1, [&] { return f.acks == 1; });  // within report_interval_s of the failure
  REQUIRE(f.count() == 2u);
  CHECK_EQ(f.sent[1].vram_budget_mib, 0);
}

namespace {

/// Polls `task` on this thread as a game would once per frame, until it hands its outcome over (the longest single
/// Poll is recorded in `longest_poll_s`).
std::optional<igi::ConnectOutcome> PollUntilDone(igi::ConnectTask& task, double timeout_s, double& longest_poll_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  longest_poll_s = 0.0;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto began = std::chrono::steady_clock::now();
    std::optional<igi::ConnectOutcome> outcome = task.Poll();
    const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    if (took_s > longest_poll_s) longest_poll_s = took_s;
    if (outcome) return outcome;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

/// A connection file naming this process, as a daemon that is running would.
std::string LiveConnectionFile(const igi::ConnectionInfo& info) {
  const std::int64_t me = ::getpid();
  return WriteConnectionFile(info, me, igi::ProcessStartTicks(me).value_or(0));
}

std::string ErrorKind(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const igi::IgiError& e) {
    return e.kind();
  }
}

}  // namespace

TEST(connect_task_connects_off_the_polling_thread) {
  // The daemon answers its hello 0.5 s late: every Poll returns at once meanwhile, then hands over a connected client.
  FakeDaemon daemon;
  daemon.DelayHello(0.5);
  const std::string path = LiveConnectionFile(daemon.info());
  igi::ConnectTask task(path);
  double longest_poll_s = 0.0;
  std::optional<igi::ConnectOutcome> outcome = PollUntilDone(task, 10.0, longest_poll_s);
  REQUIRE(outcome.has_value());
  CHECK(!outcome->error);
  REQUIRE(outcome->client != nullptr);
  CHECK(outcome->client->connected());
  CHECK(longest_poll_s < 0.05);
  CHECK(!task.Poll().has_value());  // handed over once
  std::remove(path.c_str());
}

TEST(connect_task_abort_ends_a_handshake_at_once) {
  FakeDaemon daemon;
  daemon.DelayHello(3.0);
  const std::string path = LiveConnectionFile(daemon.info());
  igi::ConnectTask task(path);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the handshake is under way
  const auto began = std::chrono::steady_clock::now();
  task.Abort();
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  CHECK(took_s < 1.0);
  CHECK(!task.Poll().has_value());
  std::remove(path.c_str());
}

TEST(connect_task_reports_a_stale_connection_file) {
  FakeDaemon daemon;  // listening, but the file names a process that is gone: the short handshake is tried
  daemon.DelayHello(5.0);
  const std::string path = WriteConnectionFile(daemon.info(), NoSuchPid(), 1);
  igi::ClientOptions options;
  options.stale_connect_timeout_s = 0.3;
  igi::ConnectTask task(path, options);
  double longest_poll_s = 0.0;
  std::optional<igi::ConnectOutcome> outcome = PollUntilDone(task, 10.0, longest_poll_s);
  REQUIRE(outcome.has_value());
  CHECK(outcome->client == nullptr);
  REQUIRE(static_cast<bool>(outcome->error));
  CHECK_EQ(ErrorKind(outcome->error), std::string("stale_connection_file"));
  CHECK(longest_poll_s < 0.05);
  std::remove(path.c_str());
}

TEST(connect_task_reopens_the_saved_sessions_before_handing_the_client_over) {
  FakeDaemon daemon([](const igi::Envelope& request) -> std::vector<FakeReply> {
    if (request.header.type != igi::LoadSessionRequest::kType) return {};
    igi::LoadSessionReply reply;
    reply.session_id = "restored-1";
    return {Reply(reply)};
  });
  const std::string path = LiveConnectionFile(daemon.info());
  igi::SessionSaveBook book;
  book.Record("blacksmith", "/saves/blacksmith.igisession");
  igi::ConnectTask task(path, {}, &book);
  double longest_poll_s = 0.0;
  std::optional<igi::ConnectOutcome> outcome = PollUntilDone(task, 10.0, longest_poll_s);
  REQUIRE(outcome.has_value() && outcome->client != nullptr);
  REQUIRE(outcome->restored.restored.count("blacksmith") == 1u);
  CHECK_EQ(outcome->restored.restored.at("blacksmith").session_id, std::string("restored-1"));
  CHECK(outcome->restored.failed.empty());
  std::remove(path.c_str());
}
