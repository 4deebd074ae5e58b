// test_helpers.cpp - IgiClientCore tests: connection file, typed messages, errors and the frame budget helper
// (no daemon needed).
#include <cmath>
#include <cstdio>
#include <limits>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <optional>
#include <thread>
#include <chrono>
#include <exception>
#include <typeinfo>
#include <vector>

#include "igi/connection_file.hpp"
#include "igi/envelope.hpp"
#include "igi/errors.hpp"
#include "igi/frame_budget.hpp"
#include "igi/process_liveness.hpp"
#include "test_framework.hpp"
#include "../Source/IgiClientCore/Private/client_impl.hpp"  // ErrorFromReply: how an error_reply becomes an exception

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
  // An ipc file names the socket path in "ip" and has port 0 (spec 13); another port is refused.
  std::string ipc = text;
  ipc.replace(ipc.find("\"tcp\""), 5, "\"ipc\"");
  ipc.replace(ipc.find("127.0.0.1"), 9, "/tmp/igi.sock");
  CHECK_THROWS_AS(igi::ParseConnectionInfo(ipc), igi::ConnectionFileError);  // still port 53117
  std::string ipc_port0 = ipc;
  ipc_port0.replace(ipc_port0.find("53117"), 5, "0");
  CHECK_EQ(igi::ParseConnectionInfo(ipc_port0).Endpoint(), std::string("ipc:///tmp/igi.sock"));
  igi::Value doc = igi::ParseJson("{\"s\": \"a\\u00e9\\ud83c\\udfae\\n\", \"n\": -1.5e2, \"b\": [true, false]}");
  CHECK_EQ(doc.Find("s")->as_str(), std::string("a\xc3\xa9\xf0\x9f\x8e\xae\n"));
  CHECK_EQ(doc.Find("n")->as_float(), -150.0);
}

TEST(connection_file_pid_start_ticks_is_optional_and_checked) {
  std::string text = kGoodFile;
  const std::string with = text.substr(0, text.size() - 1) + ", \"pid_start_ticks\": ";
  CHECK_EQ(*igi::ParseConnectionInfo(with + "8123456}").pid_start_ticks, 8123456);
  CHECK(!igi::ParseConnectionInfo(text).pid_start_ticks.has_value());  // absent: not known
  CHECK(!igi::ParseConnectionInfo(with + "null}").pid_start_ticks.has_value());
  for (const char* bad : {"-1", "\"8123456\"", "1.5", "true"}) {
    CHECK_THROWS_AS(igi::ParseConnectionInfo(with + bad + "}"), igi::ConnectionFileError);
  }
}

TEST(process_liveness_tells_dead_and_reused_pids_from_running_ones) {
  const std::int64_t me = ::getpid();
  const std::optional<std::int64_t> start = igi::ProcessStartTicks(me);
  REQUIRE(start.has_value());
  CHECK(igi::ProcessRunning(me, start) == std::optional<bool>(true));
  CHECK(igi::ProcessRunning(me, std::nullopt) == std::optional<bool>(true));  // no start time recorded: the pid decides
  CHECK(igi::ProcessRunning(me, *start + 1) == std::optional<bool>(false));   // this pid, another start time: reused
  std::ifstream pid_max("/proc/sys/kernel/pid_max");
  std::int64_t above = 0;
  REQUIRE(static_cast<bool>(pid_max >> above));
  CHECK(igi::ProcessRunning(above + 1, 1) == std::optional<bool>(false));  // above pid_max: never a process
  CHECK(!igi::ProcessRunning(0, std::nullopt).has_value());
}

TEST(typed_messages_reject_out_of_range_and_mistyped_fields) {
  igi::Value ok = igi::StructToValue(igi::SetBudgetRequest{512, "combat", std::nullopt});
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

namespace {

// The expected code -> exception mapping, written out independently of errors.cpp: one row per stable
// wire code of ipc/PROTOCOL.md section 8, each naming the exact class the client must raise.
struct ExpectedError {
  const char* wire;
  igi::ErrorCode code;
  bool retryable;                                // the spec's default
  const std::type_info& type;                    // exact dynamic type expected
  const char* type_name;                         // for failure messages
  bool (*is_a)(const igi::RequestError&);        // "is this error (or derives from) this row's class?"
};

template <typename E>
bool IsA(const igi::RequestError& e) {
  return dynamic_cast<const E*>(&e) != nullptr;
}

#define IGI_EXPECT(wire, Code, retryable, Class) \
  ExpectedError { wire, igi::ErrorCode::Code, retryable, typeid(igi::Class), #Class, &IsA<igi::Class> }
const ExpectedError kExpectedErrors[] = {
    IGI_EXPECT("invalid_request", kInvalidRequest, false, InvalidRequestError),
    IGI_EXPECT("unknown_type", kUnknownType, false, UnknownTypeError),
    IGI_EXPECT("unsupported_version", kUnsupportedVersion, false, UnsupportedVersionError),
    IGI_EXPECT("too_large", kTooLarge, false, TooLargeError),
    IGI_EXPECT("busy", kBusy, true, BusyError),
    IGI_EXPECT("not_found", kNotFound, false, NotFoundError),
    IGI_EXPECT("no_model", kNoModel, true, NoModelError),
    IGI_EXPECT("model_not_found", kModelNotFound, false, ModelNotFoundError),
    IGI_EXPECT("model_invalid", kModelInvalid, false, ModelInvalidError),
    IGI_EXPECT("budget_infeasible", kBudgetInfeasible, false, BudgetInfeasibleError),
    IGI_EXPECT("engine_failure", kEngineFailure, true, EngineFailureError),
    IGI_EXPECT("cancelled", kCancelled, false, CancelledError),
    IGI_EXPECT("timeout", kTimeout, true, DaemonTimeoutError),
    IGI_EXPECT("shutting_down", kShuttingDown, false, ShuttingDownError),
    IGI_EXPECT("internal", kInternal, false, InternalError),
    IGI_EXPECT("invalid_grammar", kInvalidGrammar, false, InvalidGrammarError),
    IGI_EXPECT("invalid_schema", kInvalidSchema, false, InvalidSchemaError),
    IGI_EXPECT("unknown_tool", kUnknownTool, false, UnknownToolError),
    IGI_EXPECT("invalid_tool_arguments", kInvalidToolArguments, true, InvalidToolArgumentsError),
    IGI_EXPECT("invalid_output", kInvalidOutput, true, InvalidOutputError),
    IGI_EXPECT("invalid_image", kInvalidImage, false, InvalidImageError),
    IGI_EXPECT("replayed", kReplayed, false, ReplayedError),
};
#undef IGI_EXPECT

std::string TypeName(const std::type_info& type) {
  for (const ExpectedError& row : kExpectedErrors) {
    if (row.type == type) return row.type_name;
  }
  if (type == typeid(igi::RequestError)) return "RequestError";
  return type.name();
}

// Checks one thrown error against `want`: exact dynamic type, no wrong class in its ancestry, and the
// carried code, wire code, message, detail and retryable flag.
void CheckThrownError(const igi::RequestError& e, const ExpectedError& want, const std::string& wire,
                      bool retryable, const char* path) {
  CHECK_MSG(typeid(e) == want.type, path << "(\"" << wire << "\") threw " << TypeName(typeid(e)) << ", expected "
                                         << want.type_name);
  for (const ExpectedError& other : kExpectedErrors) {
    bool expected_is_a = &other == &want;
    CHECK_MSG(other.is_a(e) == expected_is_a, path << "(\"" << wire << "\"): dynamic_cast to " << other.type_name
                                                   << " gave " << other.is_a(e) << ", expected " << expected_is_a);
  }
  CHECK_MSG(e.code() == want.code, path << "(\"" << wire << "\") code " << igi::ErrorCodeName(e.code()));
  CHECK_EQ(e.wire_code(), wire);
  CHECK_EQ(e.kind(), std::string(want.wire));
  CHECK_EQ(std::string(e.what()), wire + ": the message");
  CHECK_EQ(e.retryable(), retryable);
  const igi::Value* limit = e.detail().Find("limit");
  CHECK_MSG(limit != nullptr && limit->as_str() == "max_sessions", path << "(\"" << wire << "\") lost detail");
}

// Throws through ThrowRequestError and through MakeRequestError (the path of error replies, see
// client_impl.hpp ErrorFromReply) and checks both; a call that throws nothing or a non-RequestError fails.
void CheckMapping(const std::string& wire, const ExpectedError& want) {
  igi::Value detail(igi::ValueMap{{"limit", "max_sessions"}});
  for (bool retryable : {false, true}) {
    bool caught = false;
    try {
      igi::ThrowRequestError(wire, "the message", detail, retryable);
    } catch (const igi::RequestError& e) {
      caught = true;
      CheckThrownError(e, want, wire, retryable, "ThrowRequestError");
    } catch (const std::exception& e) {
      caught = true;
      CHECK_MSG(false, "ThrowRequestError(\"" << wire << "\") threw a non-RequestError: " << e.what());
    } catch (...) {
      caught = true;
      CHECK_MSG(false, "ThrowRequestError(\"" << wire << "\") threw a non-std exception");
    }
    CHECK_MSG(caught, "ThrowRequestError(\"" << wire << "\") threw nothing");

    std::exception_ptr made = igi::MakeRequestError(wire, "the message", detail, retryable);
    CHECK_MSG(made != nullptr, "MakeRequestError(\"" << wire << "\") returned a null exception_ptr");
    if (made == nullptr) continue;
    try {
      std::rethrow_exception(made);
    } catch (const igi::RequestError& e) {
      CheckThrownError(e, want, wire, retryable, "MakeRequestError");
    } catch (...) {
      CHECK_MSG(false, "MakeRequestError(\"" << wire << "\") holds a non-RequestError");
    }
  }
}

const ExpectedError& ExpectedFor(igi::ErrorCode code) {
  for (const ExpectedError& row : kExpectedErrors) {
    if (row.code == code) return row;
  }
  igi_test::RecordFailure(__FILE__, __LINE__,
                          "no expected row for ErrorCode " + std::to_string(static_cast<int>(code)));
  throw igi_test::Failure{};
}

std::string SpecPath() {
  std::string dir = igi_test::GetOptions().vectors_dir;
#ifdef IGI_DEFAULT_VECTORS_DIR
  if (dir.empty()) dir = IGI_DEFAULT_VECTORS_DIR;
#endif
  return dir + "/../PROTOCOL.md";
}

}  // namespace

TEST(error_codes_map_to_typed_errors_in_one_place) {
  // Every stable code maps to exactly its own class, carrying code, wire code, message, detail, retryable.
  for (const ExpectedError& row : kExpectedErrors) {
    CHECK(igi::ParseErrorCode(row.wire) == row.code);
    CHECK_EQ(std::string(igi::ErrorCodeName(row.code)), std::string(row.wire));
    CHECK_MSG(igi::RetryableByDefault(row.code) == row.retryable, row.wire << ": wrong default retryable");
    CheckMapping(row.wire, row);
  }
  // The table covers every value of the enum exactly once (kReplayed is the last one).
  constexpr int kEnumSize = static_cast<int>(igi::ErrorCode::kReplayed) + 1;
  CHECK_EQ(sizeof(kExpectedErrors) / sizeof(kExpectedErrors[0]), static_cast<std::size_t>(kEnumSize));
  for (int c = 0; c < kEnumSize; ++c) {
    int rows = 0;
    for (const ExpectedError& row : kExpectedErrors) rows += static_cast<int>(row.code) == c;
    CHECK_MSG(rows == 1, "ErrorCode " << c << " has " << rows << " expected rows");
  }
  // An unknown code from a newer minor is treated as `internal` (spec 5.8; Python parse_error_code): it is
  // an InternalError, still caught as the base RequestError, and keeps the code exactly as received.
  for (const char* unknown : {"quota_exceeded", "", "BUSY", "busy "}) {
    CHECK(igi::ParseErrorCode(unknown) == igi::ErrorCode::kInternal);
    CheckMapping(unknown, ExpectedFor(igi::ErrorCode::kInternal));
  }
  CHECK_THROWS_AS(igi::ThrowRequestError("quota_exceeded", "", igi::Value()), igi::RequestError);
  try {
    igi::ThrowRequestError("quota_exceeded", "", igi::Value());
  } catch (const igi::IgiError& e) {
    CHECK_EQ(e.kind(), std::string("internal"));  // kind() works without RTTI (Unreal)
  }
  CHECK_EQ(igi::TimeoutError("t").kind(), std::string("timeout"));
  CHECK_EQ(igi::BadSignatureError("s").kind(), std::string("bad_signature"));
}

TEST(error_code_table_matches_every_code_of_the_spec) {
  // The expected table above lists exactly the codes of ipc/PROTOCOL.md section 8 ("| `code` | ... |" rows).
  std::string path = SpecPath();
  std::ifstream in(path);
  if (!in) {
    igi_test::RecordFailure(__FILE__, __LINE__, "cannot open " + path + " (pass --vectors DIR)");
    throw igi_test::Failure{};
  }
  std::vector<std::string> spec_codes;
  bool in_section = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) in_section = line.rfind("## 8. Error codes", 0) == 0;
    if (!in_section || line.rfind("| `", 0) != 0) continue;
    std::size_t close = line.find('`', 3);
    if (close != std::string::npos) spec_codes.push_back(line.substr(3, close - 3));
  }
  CHECK_EQ(spec_codes.size(), sizeof(kExpectedErrors) / sizeof(kExpectedErrors[0]));
  for (const std::string& code : spec_codes) {
    bool found = false;
    for (const ExpectedError& row : kExpectedErrors) found = found || code == row.wire;
    CHECK_MSG(found, "spec error code `" << code << "` has no row in kExpectedErrors");
  }
}

TEST(error_reply_keeps_the_code_exactly_as_received) {
  for (const std::string wire : {"busy", "quota_exceeded"}) {
    igi::Envelope env;
    env.content = igi::Value(igi::ValueMap{{"code", wire}, {"message", "m"}, {"retryable", true}});
    bool caught = false;
    try {
      std::rethrow_exception(igi::ErrorFromReply(env));
    } catch (const igi::RequestError& e) {
      caught = true;
      CHECK_EQ(e.wire_code(), wire);  // an unknown code maps to InternalError but keeps its name
      CHECK_MSG((wire == "busy") == (dynamic_cast<const igi::BusyError*>(&e) != nullptr), wire << " class");
      CHECK_MSG((wire == "quota_exceeded") == (dynamic_cast<const igi::InternalError*>(&e) != nullptr), wire << " class");
      CHECK(e.retryable());
    }
    CHECK_MSG(caught, "ErrorFromReply(" << wire << ") held no RequestError");
  }
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

TEST(envelope_reads_the_major_version_as_a_number) {
  // ipc/PROTOCOL.md 2 (check 4): a version matches ^[0-9]{1,4}\.[0-9]{1,4}$ (section 3) and the Python reference
  // reads its major as a number, int("01") == 1.
  CHECK(igi::SameMajor("01.0", "1.0"));
  CHECK(igi::SameMajor("0001.9", "1.0"));
  CHECK(igi::SameMajor("1.00", "1.0"));
  CHECK(!igi::SameMajor("2.0", "1.0"));
  CHECK(!igi::SameMajor("10.0", "1.0"));
  CHECK(!igi::SameMajor("0.1", "1.0"));
  CHECK(!igi::SameMajor("", ""));
  CHECK(!igi::SameMajor("x.0", "x.0"));
  // A message whose header says "01.0" is decoded, not dropped as unsupported_version.
  std::string key(32, '\x01');
  igi::Header header = igi::NewHeader(igi::StatusRequest::kType);
  header.protocol_version = "01.0";
  igi::Frames frames = igi::PackMessage(key, header, igi::StatusRequest{});
  igi::Envelope env = igi::UnpackFrames(key, std::vector<std::string>(frames.begin(), frames.end()));
  CHECK_EQ(env.header.protocol_version, std::string("01.0"));
}

TEST(frame_budget_reports_at_its_rate_and_applies_advice) {
  igi::FrameBudgetOptions options;
  options.report_interval_s = 0.5;
  igi::FrameBudget budget(options);
  CHECK(!budget.PollReport(0.0).has_value());  // no frames yet
  for (int ms = 20; ms >= 1; --ms) budget.AddFrame(ms);
  std::optional<igi::FrameStatsRequest> report = budget.PollReport(1.0);
  REQUIRE(report.has_value());
  CHECK_EQ(report->frame_time_ms, 19.0);  // nearest-rank p95 of 20 frames: the 19th shortest, as the Unity helper
  budget.AddFrame(5.0);
  CHECK(!budget.PollReport(1.2).has_value());
  report = budget.PollReport(1.5);
  REQUIRE(report.has_value());
  CHECK_EQ(report->frame_time_ms, 5.0);  // only the frames since the last report
  CHECK(!budget.PollReport(2.5).has_value());  // none since
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

TEST(frame_budget_p95_clamps_and_keeps_a_bounded_window) {
  igi::FrameBudgetOptions options;
  options.window_frames = 8;
  igi::FrameBudget budget(options);
  budget.AddFrame(1e306);
  budget.AddFrame(std::numeric_limits<double>::infinity());
  budget.AddFrame(-1.0);
  budget.AddFrame(std::nan(""));
  CHECK_EQ(budget.P95FrameTimeMs(), igi::kMaxFrameTimeMs);  // cut to the longest the governor reads
  for (int i = 0; i < 100; ++i) budget.AddFrame(0.0);
  CHECK_EQ(budget.P95FrameTimeMs(), 0.0);  // the window kept the last 8 frames only
  CHECK_EQ(budget.MeanFrameTimeMs(), 0.0);
  // Busy time: the longest engine thread time, else the interval.
  CHECK_EQ(igi::BusyFrameTimeMs(6.0, 9.0, 7.5, 16.7), 9.0);
  CHECK_EQ(igi::BusyFrameTimeMs(0.0, 0.0, 0.0, 16.7), 16.7);
  CHECK_EQ(igi::BusyFrameTimeMs(std::nan(""), -1.0, 4.0, 16.7), 4.0);
}

TEST(frame_budget_target_frame_time_reaches_the_running_helper) {
  igi::FrameBudget budget;
  budget.SetTargetFrameTimeMs(33.3);
  budget.AddFrame(10.0);
  std::optional<igi::FrameStatsRequest> report = budget.PollReport(0.0);
  REQUIRE(report.has_value());
  CHECK_EQ(report->target_frame_time_ms, 33.3);
  budget.SetTargetFrameTimeMs(-1.0);  // refused: kept
  budget.SetTargetFrameTimeMs(std::nan(""));
  CHECK_EQ(budget.options().target_frame_time_ms, 33.3);
}

TEST(frame_budget_a_failed_budget_request_is_requested_again) {
  igi::FrameBudget budget;
  budget.DeclareBudgetLevels({2048, 0});
  budget.SetBudgetOverride(2048);
  REQUIRE(budget.TakeBudgetChange() == std::optional<std::int64_t>(2048));
  std::optional<std::vector<std::int64_t>> levels = budget.TakeBudgetLevels();
  CHECK(!budget.TakeBudgetChange().has_value());
  budget.OnBudgetFailed(2048, levels);
  CHECK(budget.TakeBudgetChange() == std::optional<std::int64_t>(2048));  // again
  CHECK(budget.TakeBudgetLevels() == levels);
  budget.OnBudgetFailed(2048, std::nullopt);  // refused for its levels: the budget again, without them
  CHECK(budget.TakeBudgetChange() == std::optional<std::int64_t>(2048));
  CHECK(!budget.HasPendingBudgetLevels());
  budget.SetBudgetOverride(1024);
  CHECK(budget.TakeBudgetChange() == std::optional<std::int64_t>(1024));
  budget.OnBudgetFailed(2048, std::vector<std::int64_t>{0});  // an older request's failure: 1024 stays requested
  CHECK(!budget.TakeBudgetChange().has_value());
}

TEST(budget_levels_and_interim_of_protocol_1_3) {
  // levels_mib: nullopt (absent or nil: a 1.2 sender) and empty are distinct; at most 16 U63s.
  igi::Value no_levels(igi::ValueMap{{"vram_budget_mib", 2048}, {"reason", "play"}});
  CHECK(!igi::StructFromValue<igi::SetBudgetRequest>(no_levels).levels_mib.has_value());
  igi::SetBudgetRequest declared{6144, "menu", std::vector<std::int64_t>{6144, 2048, 0}};
  igi::Value wire = igi::StructToValue(declared);
  CHECK_EQ(wire.as_map().back().first, std::string("levels_mib"));
  CHECK(igi::StructFromValue<igi::SetBudgetRequest>(wire).levels_mib == declared.levels_mib);
  igi::SetBudgetRequest cleared{2048, "", std::vector<std::int64_t>{}};
  igi::SetBudgetRequest read_back = igi::StructFromValue<igi::SetBudgetRequest>(igi::StructToValue(cleared));
  CHECK(read_back.levels_mib.has_value() && read_back.levels_mib->empty());
  auto with_levels = [](igi::Value levels) {
    return igi::Value(igi::ValueMap{{"vram_budget_mib", 1}, {"levels_mib", std::move(levels)}});
  };
  igi::ValueArray sixteen(igi::kMaxBudgetLevels, igi::Value(0));
  sixteen[0] = igi::Value(static_cast<long long>(INT64_MAX));
  CHECK_EQ(igi::StructFromValue<igi::SetBudgetRequest>(with_levels(sixteen)).levels_mib->size(), 16u);
  igi::ValueArray seventeen = sixteen;
  seventeen.emplace_back(0);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(with_levels(seventeen)), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(with_levels(igi::ValueArray{2048, -1})), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(with_levels(igi::ValueArray{2048.0})), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(with_levels(igi::ValueArray{true})), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(with_levels(igi::Value(2048))), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::SetBudgetRequest>(with_levels(igi::ValueArray{18446744073709551615ULL})),
                  igi::DecodeError);
  // interim: absent (a 1.2 daemon) is nullopt, read as false; a non-bool is refused.
  igi::BudgetAck ack;
  ack.interim = true;
  igi::Value ack_wire = igi::StructToValue(ack);
  CHECK(igi::StructFromValue<igi::BudgetAck>(ack_wire).IsInterim());
  igi::ValueMap old_ack;
  for (const auto& [key, value] : ack_wire.as_map()) {
    if (key != "interim") old_ack.emplace_back(key, value);
  }
  igi::BudgetAck from_old = igi::StructFromValue<igi::BudgetAck>(igi::Value(old_ack));
  CHECK(!from_old.interim.has_value() && !from_old.IsInterim());
  old_ack.emplace_back("interim", 1);
  CHECK_THROWS_AS(igi::StructFromValue<igi::BudgetAck>(igi::Value(old_ack)), igi::DecodeError);
  // The frame budget helper sends declared levels with the next budget change, or with the budget in force.
  igi::FrameBudget budget;
  budget.DeclareBudgetLevels({6144, 2048, 0});
  CHECK(!budget.requested_budget_mib().has_value() && budget.HasPendingBudgetLevels());
  budget.SetBudgetOverride(2048);
  CHECK(budget.TakeBudgetChange() == std::optional<std::int64_t>(2048));
  CHECK(budget.TakeBudgetLevels() == std::optional<std::vector<std::int64_t>>(std::vector<std::int64_t>{6144, 2048, 0}));
  CHECK(!budget.TakeBudgetLevels().has_value() && !budget.HasPendingBudgetLevels());
  budget.DeclareBudgetLevels({});
  CHECK(!budget.TakeBudgetChange().has_value() && budget.requested_budget_mib() == std::optional<std::int64_t>(2048));
  CHECK(budget.TakeBudgetLevels() == std::optional<std::vector<std::int64_t>>(std::vector<std::int64_t>{}));
}

TEST(priority_ageing_of_protocol_1_4) {
  CHECK_EQ(std::string(igi::kProtocolVersion), std::string("1.4"));
  CHECK_EQ(igi::Limits{}.priority_ageing_per_s, 0.0);  // strict priority
  // Written last, after max_queue_depth; read back as written.
  igi::Limits limits;
  limits.max_queue_depth = 8;
  limits.priority_ageing_per_s = 2.5;
  igi::Value wire = igi::StructToValue(limits);
  const igi::ValueMap& map = wire.as_map();
  REQUIRE(map.size() == 5u);
  CHECK_EQ(map[3].first, std::string("max_queue_depth"));
  CHECK_EQ(map[4].first, std::string("priority_ageing_per_s"));
  CHECK_EQ(igi::StructFromValue<igi::Limits>(wire).priority_ageing_per_s, 2.5);
  // Absent (a daemon older than 1.4) is 0.0; an int is read as a float; a negative or non-number rate is refused.
  igi::ValueMap old_limits(map.begin(), map.end() - 1);
  CHECK_EQ(igi::StructFromValue<igi::Limits>(igi::Value(old_limits)).priority_ageing_per_s, 0.0);
  auto with_rate = [&](igi::Value rate) {
    igi::ValueMap m = old_limits;
    m.emplace_back("priority_ageing_per_s", std::move(rate));
    return igi::Value(std::move(m));
  };
  CHECK_EQ(igi::StructFromValue<igi::Limits>(with_rate(igi::Value(0.0))).priority_ageing_per_s, 0.0);
  CHECK_EQ(igi::StructFromValue<igi::Limits>(with_rate(igi::Value(3))).priority_ageing_per_s, 3.0);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Limits>(with_rate(igi::Value(-0.5))), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Limits>(with_rate(igi::Value("1.0"))), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Limits>(with_rate(igi::Value())), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Limits>(with_rate(igi::Value(true))), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Limits>(with_rate(igi::Value(std::nan("")))), igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Limits>(with_rate(igi::Value(std::numeric_limits<double>::infinity()))),
                  igi::DecodeError);
}

TEST(client_without_daemon_times_out_and_refuses_requests) {
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
  // Not connected: nothing but hello_request may be sent (spec 9.4), so requests are refused at once, typed.
  std::string error;
  CHECK_THROWS_AS(client.CreateSessionAsync(igi::CreateSessionRequest{}, {},
                                            [&](const igi::IgiError& e) { error = e.what(); }),
                  igi::NotConnectedError);
  CHECK_THROWS_AS((client.Call<igi::ShutdownRequest, igi::ShutdownReply>(igi::ShutdownRequest{}, std::nullopt, 0.2)),
                  igi::NotConnectedError);
  client.Pump();
  CHECK(error.empty());  // refused by the throw, not through a callback
  client.Close();
  CHECK_THROWS_AS(client.Status(), igi::DaemonUnavailableError);
}
