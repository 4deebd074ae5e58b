// test_helpers.cpp - IgiClientCore tests: connection file, typed messages, errors and the frame budget helper
// (no daemon needed).
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <chrono>

#include "igi/connection_file.hpp"
#include "igi/envelope.hpp"
#include "igi/errors.hpp"
#include "igi/frame_budget.hpp"
#include "test_framework.hpp"

namespace {

const char* kGoodFile =
    "{\"transport\": \"tcp\", \"ip\": \"127.0.0.1\", \"port\": 53117,\n"
    " \"key\": \"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\",\n"
    " \"signature_scheme\": \"hmac-sha256\", \"protocol_version\": \"1.0\", \"pid\": 4242, \"extra\": [1, 2.5, null]}";

std::string WriteTemp(const std::string& text, mode_t mode) {
  char path[] = "/tmp/igi-conn-XXXXXX";
  int fd = mkstemp(path);
  std::FILE* f = fdopen(fd, "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  chmod(path, mode);
  return path;
}

}  // namespace

TEST(connection_file_parses_fields_and_ignores_unknown_ones) {
  std::string path = WriteTemp(kGoodFile, 0600);
  igi::ConnectionInfo info = igi::ReadConnectionFile(path);
  std::remove(path.c_str());
  CHECK_EQ(info.Endpoint(), std::string("tcp://127.0.0.1:53117"));
  CHECK_EQ(info.key.size(), 32u);
  CHECK_EQ(static_cast<int>(info.key[31]), 0x1f);
  CHECK_EQ(info.pid, 4242);
}

TEST(connection_file_refusals) {
  std::string loose = WriteTemp(kGoodFile, 0644);
  CHECK_THROWS_AS(igi::ReadConnectionFile(loose), igi::ConnectionFileError);  // readable by others
  std::remove(loose.c_str());
  CHECK_THROWS_AS(igi::ReadConnectionFile("/nonexistent/igi.json"), igi::ConnectionFileError);
  std::string text = kGoodFile;
  CHECK_THROWS_AS(igi::ParseConnectionInfo(text.substr(0, text.size() - 1)), igi::ConnectionFileError);
  std::string other_scheme = text;
  other_scheme.replace(other_scheme.find("hmac-sha256"), 11, "none");
  CHECK_THROWS_AS(igi::ParseConnectionInfo(other_scheme), igi::ConnectionFileError);
  CHECK_THROWS_AS(igi::ParseConnectionInfo("{\"transport\": \"tcp\"}"), igi::ConnectionFileError);
  igi::Value doc = igi::ParseJson("{\"s\": \"a\\u00e9\\ud83c\\udfae\\n\", \"n\": -1.5e2, \"b\": [true, false]}");
  CHECK_EQ(doc.Find("s")->as_str(), std::string("a\xc3\xa9\xf0\x9f\x8e\xae\n"));
  CHECK_EQ(doc.Find("n")->as_float(), -150.0);
}

TEST(typed_messages_reject_out_of_range_and_mistyped_fields) {
  igi::Value ok = igi::StructToValue(igi::SetBudgetRequest{512, "combat"});
  CHECK_EQ(igi::StructFromValue<igi::SetBudgetRequest>(ok).vram_budget_mib, 512);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(igi::Value(igi::ValueMap{{"vram_budget_mib", -1}})),
                  igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(igi::Value(igi::ValueMap{{"vram_budget_mib", 1.0}})),
                  igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(igi::Value(igi::ValueMap{{"reason", "x"}})),
                  igi::DecodeError);
  // Defaults fill absent keys; nested sampling keeps spec order and defaults.
  igi::CreateSessionRequest session = igi::StructFromValue<igi::CreateSessionRequest>(
      igi::Value(igi::ValueMap{{"persona", "Smith"}, {"system_prompt", ""}, {"sampling", igi::ValueMap{{"top_k", 5}}}}));
  CHECK_EQ(session.sampling.top_k, 5);
  CHECK_EQ(session.sampling.temperature, 0.7);
  // Length limits count code points: 256 two-byte characters fit in persona (<= 256 chars).
  std::string persona;
  for (int i = 0; i < 256; ++i) persona += "\xc3\xa9";
  CHECK_EQ(igi::StructFromValue<igi::CreateSessionRequest>(
               igi::Value(igi::ValueMap{{"persona", persona}, {"system_prompt", ""}}))
               .persona.size(),
           512u);
}

TEST(error_codes_map_to_typed_errors_in_one_place) {
  for (int c = 0; c <= static_cast<int>(igi::ErrorCode::kInternal); ++c) {
    auto code = static_cast<igi::ErrorCode>(c);
    CHECK(igi::ParseErrorCode(igi::ErrorCodeName(code)) == code);
    try {
      igi::ThrowRequestError(igi::ErrorCodeName(code), "m", igi::Value());
    } catch (const igi::RequestError& e) {
      CHECK(e.code() == code);
      CHECK(std::string(e.what()).find(igi::ErrorCodeName(code)) == 0);
    }
  }
  CHECK_THROWS_AS(igi::ThrowRequestError("busy", "queue full", igi::Value(), true), igi::BusyError);
  CHECK_THROWS_AS(igi::ThrowRequestError("budget_infeasible", "", igi::Value()), igi::BudgetInfeasibleError);
  CHECK_THROWS_AS(igi::ThrowRequestError("quota_exceeded", "", igi::Value()), igi::InternalError);  // spec 5.8
  try {
    igi::ThrowRequestError("quota_exceeded", "", igi::Value());
  } catch (const igi::IgiError& e) {
    CHECK_EQ(e.kind(), std::string("internal"));  // kind() works without RTTI (Unreal)
  }
  CHECK_EQ(igi::TimeoutError("t").kind(), std::string("timeout"));
  CHECK_EQ(igi::BadSignatureError("s").kind(), std::string("bad_signature"));
  CHECK(igi::RetryableByDefault(igi::ErrorCode::kBusy));
  CHECK(!igi::RetryableByDefault(igi::ErrorCode::kInvalidRequest));
}

TEST(pack_and_unpack_frames_round_trip) {
  std::string key(32, '\x01');
  igi::Header header = igi::NewHeader(igi::GenerateRequest::kType, std::nullopt, std::string("npc-1"));
  CHECK_EQ(header.msg_id.size(), 32u);
  CHECK_EQ(header.msg_id[12], '4');  // uuid4 version nibble
  igi::GenerateRequest request;
  request.text = "hello";
  igi::Frames frames = igi::PackMessage(key, header, request);
  igi::Envelope env = igi::UnpackFrames(key, std::vector<std::string>(frames.begin(), frames.end()));
  CHECK_EQ(env.header.session_id.value_or(""), std::string("npc-1"));
  CHECK_EQ(igi::StructFromValue<igi::GenerateRequest>(env.content).text, std::string("hello"));
  // The same request without a session_id is invalid_request (spec 2, check 6).
  igi::Frames no_session = igi::PackMessage(key, igi::NewHeader(igi::GenerateRequest::kType), request);
  try {
    igi::UnpackFrames(key, std::vector<std::string>(no_session.begin(), no_session.end()));
    CHECK(false);
  } catch (const igi::WireError& e) {
    CHECK_EQ(e.classification(), std::string("invalid_request"));
  }
}

TEST(frame_budget_reports_at_its_rate_and_applies_advice) {
  igi::FrameBudgetOptions options;
  options.report_interval_s = 0.5;
  options.window_frames = 4;
  igi::FrameBudget budget(options);
  CHECK(!budget.PollReport(0.0).has_value());  // no frames yet
  for (double ms : {10.0, 20.0, 30.0, 40.0, 50.0}) budget.AddFrame(ms);
  std::optional<igi::FrameStatsRequest> report = budget.PollReport(1.0);
  REQUIRE(report.has_value());
  CHECK_EQ(report->frame_time_ms, 35.0);  // mean of the last 4
  CHECK(!budget.PollReport(1.2).has_value());
  CHECK(budget.PollReport(1.5).has_value());
  // Advice: throttle and a proposed budget, followed when no override is set.
  igi::FrameStatsReply reply;
  reply.throttle.tokens_per_frame = 2;
  reply.proposed_budget_mib = 768;
  budget.ApplyAdvice(reply);
  CHECK_EQ(budget.TokensPerFrame(), 2u);
  CHECK(budget.TakeBudgetChange() == std::optional<std::int64_t>(768));
  CHECK(!budget.TakeBudgetChange().has_value());  // already requested
  budget.SetBudgetOverride(256);  // explicit override wins
  CHECK(budget.TakeBudgetChange() == std::optional<std::int64_t>(256));
  budget.SetBudgetOverride(std::nullopt);
  CHECK(budget.TakeBudgetChange() == std::optional<std::int64_t>(768));
}

TEST(client_without_daemon_times_out_and_fails_async_requests) {
  igi::ConnectionInfo info;
  info.transport = "tcp";
  info.ip = "127.0.0.1";
  info.port = 1;  // nothing listens there
  info.key = std::string(32, '\0');
  igi::ClientOptions options;
  options.connect_timeout_s = 0.3;
  options.request_timeout_s = 0.3;
  igi::Client client(info, options);
  CHECK_THROWS_AS(client.Connect(), igi::TimeoutError);
  std::string error, forgotten_error;
  std::string forgotten = client.CreateSessionAsync(igi::CreateSessionRequest{}, {},
                                                    [&](const igi::IgiError& e) { forgotten_error = e.what(); });
  client.Forget(forgotten);  // UIgiNpcComponent::EndPlay: nothing more is delivered for it
  client.CreateSessionAsync(igi::CreateSessionRequest{}, {}, [&](const igi::IgiError& e) { error = e.what(); });
  for (int i = 0; i < 200 && error.empty(); ++i) {
    client.Pump();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(error.find("no reply to create_session_request") != std::string::npos);
  client.Pump();
  CHECK(forgotten_error.empty());
  // The calls UIgiSubsystem makes on shutdown exist and fail typed (no daemon here).
  CHECK_THROWS_AS((client.Call<igi::ShutdownRequest, igi::ShutdownReply>(igi::ShutdownRequest{}, std::nullopt, 0.2)),
                  igi::TimeoutError);
  client.Close();
  CHECK_THROWS_AS(client.Status(), igi::DaemonUnavailableError);
}
