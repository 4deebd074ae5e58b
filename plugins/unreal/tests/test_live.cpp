// test_live.cpp - IgiClientCore tests: live tests against a running daemon (real sockets, real model).
//
// Given --connection-file (or IGI_CONNECTION_FILE); skipped with a message otherwise.
#include <signal.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "igi/client.hpp"
#include "igi/frame_budget.hpp"
#include "test_framework.hpp"

namespace {

std::unique_ptr<igi::Client> ConnectedClient(igi::ClientOptions options = {}) {
  const std::string& path = igi_test::GetOptions().connection_file;
  if (path.empty()) SKIP("no connection file given (--connection-file PATH or IGI_CONNECTION_FILE)");
  options.client_name = "unreal-plugin-tests";
  auto client = igi::Client::FromConnectionFile(path, options);
  client->Connect();
  return client;
}

igi::CreateSessionRequest GreedySession(std::int64_t max_tokens) {
  igi::CreateSessionRequest request;
  request.persona = "Blacksmith";
  request.system_prompt = "You are a terse blacksmith in a fantasy village.";
  request.sampling.temperature = 0.0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.seed = 7;
  return request;
}

/// Pumps `client` on this thread until `done` is true or `timeout_s` passes.
template <class Pred>
bool PumpUntil(igi::Client& client, Pred done, double timeout_s = 120.0) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (client.Pump() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

struct Stream {
  std::vector<igi::TokenEvent> tokens;
  std::optional<igi::GenerateReply> reply;
  std::string error;
  bool finished = false;
  std::thread::id callback_thread;

  igi::GenerateCallbacks Callbacks() {
    igi::GenerateCallbacks cb;
    cb.on_token = [this](const igi::TokenEvent& t) {
      tokens.push_back(t);
      callback_thread = std::this_thread::get_id();
    };
    cb.on_done = [this](const igi::GenerateReply& r) {
      reply = r;
      finished = true;
    };
    cb.on_error = [this](const igi::IgiError& e) {
      error = e.what();
      finished = true;
    };
    return cb;
  }
};

}  // namespace

TEST(live_handshake_reports_protocol_and_limits) {
  auto client = ConnectedClient();
  igi::HelloReply hello = client->hello();
  CHECK_EQ(hello.protocol_version.substr(0, 2), std::string("1."));
  CHECK(hello.heartbeat_interval_s > 0.0);
  CHECK(hello.client_timeout_s > hello.heartbeat_interval_s);
  CHECK(hello.limits.max_frame_bytes >= 1024);
  CHECK(client->connected());
}

TEST(live_greedy_streaming_generate_is_deterministic) {
  auto client = ConnectedClient();
  std::string texts[2];
  for (std::string& text : texts) {
    igi::CreateSessionReply session = client->CreateSession(GreedySession(12));
    REQUIRE(!session.session_id.empty());
    Stream stream;
    igi::GenerateRequest request;
    request.text = "Can you repair my sword?";
    client->Generate(session.session_id, request, stream.Callbacks());
    REQUIRE(PumpUntil(*client, [&] { return stream.finished; }));
    CHECK_MSG(stream.error.empty(), stream.error);
    REQUIRE(stream.reply.has_value());
    CHECK(stream.callback_thread == std::this_thread::get_id());  // callbacks only inside Pump()
    CHECK(!stream.tokens.empty());
    std::string joined;
    for (std::size_t i = 0; i < stream.tokens.size(); ++i) {
      CHECK_EQ(stream.tokens[i].index, static_cast<std::int64_t>(i));
      joined += stream.tokens[i].text;
    }
    CHECK_EQ(joined, stream.reply->text);
    CHECK(stream.reply->finish_reason == "stop" || stream.reply->finish_reason == "length");
    CHECK_EQ(stream.reply->usage.completion_tokens, static_cast<std::int64_t>(stream.tokens.size()));
    CHECK(stream.reply->usage.completion_tokens <= 12);
    CHECK(stream.reply->usage.prompt_tokens > 0);
    text = stream.reply->text;
    client->CloseSession(session.session_id);
  }
  CHECK_EQ(texts[0], texts[1]);  // temperature 0: same prompt, same completion
}

TEST(live_cancel_mid_stream_finishes_cancelled) {
  auto client = ConnectedClient();
  igi::CreateSessionReply session = client->CreateSession(GreedySession(200));
  Stream stream;
  std::optional<igi::CancelReply> cancel_reply;
  std::string generate_id;
  igi::GenerateCallbacks cb = stream.Callbacks();
  auto on_token = cb.on_token;
  cb.on_token = [&](const igi::TokenEvent& t) {
    on_token(t);
    if (t.index == 0) {
      client->Cancel(generate_id, [&](const igi::CancelReply& r) { cancel_reply = r; },
                     [&](const igi::IgiError& e) { stream.error = e.what(); });
    }
  };
  igi::GenerateRequest request;
  request.text = "Tell me a very long story about your forge, your family and the war.";
  generate_id = client->Generate(session.session_id, request, cb);
  REQUIRE(PumpUntil(*client, [&] { return stream.finished && cancel_reply.has_value(); }));
  CHECK_MSG(stream.error.empty(), stream.error);
  REQUIRE(stream.reply.has_value());
  CHECK_EQ(stream.reply->finish_reason, std::string("cancelled"));
  CHECK(cancel_reply->cancelled);
  CHECK(stream.reply->usage.completion_tokens < 200);
  // The asynchronous close UIgiNpcComponent::EndPlay uses; a second close is not_found.
  bool closed = false;
  client->CloseSessionAsync(session.session_id, [&] { closed = true; });
  REQUIRE(PumpUntil(*client, [&] { return closed; }, 30.0));
  std::string kind;
  client->CloseSessionAsync(session.session_id, {}, [&](const igi::IgiError& e) { kind = e.kind(); });
  REQUIRE(PumpUntil(*client, [&] { return !kind.empty(); }, 30.0));
  CHECK_EQ(kind, std::string("not_found"));
}

TEST(live_set_budget_returns_budget_ack) {
  auto client = ConnectedClient();
  igi::BudgetAck ack = client->SetBudget(0, "unreal plugin test: CPU only");
  CHECK_EQ(ack.requested_mib, 0);
  CHECK(ack.granted_mib <= ack.requested_mib);
  CHECK(ack.cpu_fallback);
  CHECK(!ack.plan.strategy.empty());
  igi::BudgetAck reclaimed = client->Reclaim(0, 5.0);  // priority path
  CHECK_EQ(reclaimed.requested_mib, 0);
  CHECK(reclaimed.granted_mib <= reclaimed.requested_mib);
  // The asynchronous variant delivers the same reply through Pump().
  std::optional<igi::BudgetAck> async_ack;
  client->SetBudgetAsync(0, "again", [&](const igi::BudgetAck& a) { async_ack = a; });
  REQUIRE(PumpUntil(*client, [&] { return async_ack.has_value(); }));
  CHECK_EQ(async_ack->requested_mib, 0);
}

TEST(live_unknown_type_gets_error_reply) {
  auto client = ConnectedClient();
  CHECK_THROWS_AS(client->CallRaw("teleport_request", std::nullopt, igi::Value(igi::ValueMap{}), 10.0),
                  igi::UnknownTypeError);
}

TEST(live_unknown_session_maps_to_not_found) {
  auto client = ConnectedClient();
  CHECK_THROWS_AS(client->CloseSession("no-such-session"), igi::NotFoundError);
  // The error reaches async callers as a typed error too.
  std::string error_code;
  igi::GenerateCallbacks cb;
  cb.on_error = [&](const igi::IgiError& e) {
    auto* req = dynamic_cast<const igi::RequestError*>(&e);
    error_code = req ? igi::ErrorCodeName(req->code()) : "not a RequestError";
  };
  igi::GenerateRequest request;
  request.text = "hello?";
  client->Generate("no-such-session", request, cb);
  REQUIRE(PumpUntil(*client, [&] { return !error_code.empty(); }, 30.0));
  CHECK_EQ(error_code, std::string("not_found"));
}

TEST(live_malformed_session_id_is_refused_before_sending) {
  auto client = ConnectedClient();
  // The daemon could not answer such a header by msg_id: the request would only time out.
  CHECK_THROWS_AS(client->CloseSession("has space"), igi::InvalidRequestError);
  CHECK_THROWS_AS(client->CloseSession(std::string(65, 'a')), igi::InvalidRequestError);
  CHECK_THROWS_AS(client->CloseSession(""), igi::InvalidRequestError);
  igi::GenerateRequest request;
  request.text = "hello?";
  CHECK_THROWS_AS(client->Generate("a/b", request, igi::GenerateCallbacks{}), igi::InvalidRequestError);
  CHECK(client->connected());
  CHECK_EQ(client->counters().dropped_unmatched, 0u);
}

TEST(live_requests_after_the_daemon_is_declared_gone_fail_at_once) {
  auto client = ConnectedClient();
  bool disconnected = false;
  client->SetOnDisconnected([&](const igi::IgiError&) { disconnected = true; });
  const auto pid = static_cast<pid_t>(client->connection().pid);
  REQUIRE(pid > 0);
  // Silence the daemon (SIGSTOP) until the client declares it gone, then let it run again.
  ::kill(pid, SIGSTOP);
  bool declared = PumpUntil(*client, [&] { return disconnected; }, client->hello().client_timeout_s + 10.0);
  ::kill(pid, SIGCONT);
  REQUIRE(declared);
  CHECK(!client->connected());
  // Without the 'gone' state this blocked for the request timeout and then threw TimeoutError.
  CHECK_THROWS_AS(client->Status(), igi::DaemonUnavailableError);
  igi::GenerateRequest request;
  request.text = "hello?";
  CHECK_THROWS_AS(client->Generate("abc", request, igi::GenerateCallbacks{}), igi::DaemonUnavailableError);
}

TEST(live_status_and_frame_stats) {
  auto client = ConnectedClient();
  igi::StatusReply status = client->Status();
  CHECK(status.uptime_s > 0.0);
  CHECK(status.model.has_value());
  igi::FrameStatsRequest stats;
  stats.frame_time_ms = 20.0;
  stats.target_frame_time_ms = 16.6;
  igi::FrameStatsReply reply = client->SendFrameStats(stats);
  CHECK(reply.throttle.sleep_ms_between_tokens >= 0.0);
  // The frame budget helper sends a report through the client and stores the advice.
  igi::FrameBudgetOptions options;
  options.accept_proposals = false;
  igi::FrameBudget budget(options);
  igi::FrameBudgetDriver driver(*client, budget);
  std::string error;
  driver.SetOnError([&](const igi::IgiError& e) { error = e.what(); });
  budget.SetBudgetOverride(0);
  std::optional<igi::BudgetAck> ack;
  driver.SetOnBudgetAck([&](const igi::BudgetAck& a) { ack = a; });
  driver.Tick(18.0, 100.0);
  REQUIRE(PumpUntil(*client, [&] { return ack.has_value() || !error.empty(); }));
  CHECK_MSG(error.empty(), error);
  CHECK(budget.granted_budget_mib() == std::optional<std::int64_t>(0));
  CHECK(!budget.TakeBudgetChange().has_value());  // already requested
}

TEST(live_heartbeats_keep_connection_and_bad_key_times_out) {
  auto client = ConnectedClient();
  bool disconnected = false;
  client->SetOnDisconnected([&](const igi::IgiError&) { disconnected = true; });
  double interval_s = client->hello().heartbeat_interval_s;
  std::this_thread::sleep_for(std::chrono::duration<double>(interval_s * 1.5 + 0.2));
  client->Pump();
  CHECK(client->counters().heartbeats_sent >= 1);
  CHECK(client->connected());
  CHECK_EQ(client->counters().dropped_invalid, 0u);
  CHECK(!disconnected);
  // A client with the wrong key presents another launch's handshake credential: refused before its hello is read.
  igi::ConnectionInfo forged = client->connection();
  forged.key = std::string(32, '\x5a');
  igi::ClientOptions options;
  options.connect_timeout_s = 1.0;
  igi::Client intruder(forged, options);
  CHECK_THROWS_AS(intruder.Connect(), igi::TimeoutError);
}

TEST(live_a_peer_without_the_handshake_credential_is_not_answered) {
  // ipc/PROTOCOL.md 1.5: what a client older than 1.2 sees. Its hello carries the right HMAC, but without the PLAIN
  // credential the daemon's socket never completes the handshake, so nothing is read or answered.
  auto client = ConnectedClient();
  CHECK_EQ(client->connection().zmq_mechanism, std::string("plain"));
  igi::ConnectionInfo old = client->connection();
  old.zmq_mechanism = "null";
  igi::ClientOptions options;
  options.connect_timeout_s = 1.5;
  igi::Client without(old, options);
  CHECK_THROWS_AS(without.Connect(), igi::TimeoutError);
  CHECK(client->connected());
}
