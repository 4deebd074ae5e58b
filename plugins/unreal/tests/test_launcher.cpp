// test_launcher.cpp - IgiClientCore tests: the daemon launcher; against the real bundle when --bundle DIR (or
// IGI_DAEMON_BUNDLE) names it: start, talk, kill -9, restart (time printed) with a saved session restored, stop.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef _WIN32
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

#include "igi/client.hpp"
#include "igi/daemon_launcher.hpp"
#include "test_framework.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string TempDir() {
  char tmpl[] = "/tmp/igi-launcher-cpp-XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  if (dir == nullptr) throw std::runtime_error("mkdtemp failed");
  return dir;
}

template <class Pred>
bool PumpUntil(igi::DaemonLauncher& launcher, igi::Client* client, Pred done, double timeout_s) {
  const auto start = Clock::now();
  while (!done()) {
    if (Since(start) > timeout_s) return false;
    launcher.Pump();
    if (client != nullptr) client->Pump();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

/// Linux: pids whose /proc/PID/exe is `exe` (the bundle's daemon, worker and helpers).
std::vector<long> ProcessesOf(const std::string& exe) {
  std::vector<long> pids;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    char buf[4096];
    const std::string link = std::string("/proc/") + e->d_name + "/exe";
    const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
    if (n > 0 && std::string(buf, static_cast<std::size_t>(n)) == exe) pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

std::string Say(igi::DaemonLauncher& launcher, igi::Client& client, const std::string& session, const std::string& text) {
  igi::GenerateRequest request;
  request.text = text;
  request.max_tokens = 8;
  std::optional<igi::GenerateReply> reply;
  std::string error;
  client.Generate(session, request, {nullptr, [&](const igi::GenerateReply& r) { reply = r; },
                                     [&](const igi::IgiError& e) { error = e.kind() + ": " + e.what(); }});
  if (!PumpUntil(launcher, &client, [&] { return reply.has_value() || !error.empty(); }, 120)) return "<no reply>";
  return reply ? reply->text : "<error " + error + ">";
}

}  // namespace

TEST(launcher_restart_delay_doubles_per_failure_and_is_capped) {
  CHECK(igi::RestartDelayS(0, 0.25, 30) == 0.0);
  CHECK(igi::RestartDelayS(1, 0.25, 30) == 0.25);
  CHECK(igi::RestartDelayS(2, 0.25, 30) == 0.5);
  CHECK(igi::RestartDelayS(4, 0.25, 30) == 2.0);
  CHECK(igi::RestartDelayS(9, 0.25, 30) == 30.0);
  CHECK(igi::RestartDelayS(100000, 0.25, 30) == 30.0);
}

TEST(launcher_log_levels_are_read_from_json_and_kv_records) {
  CHECK(igi::LogLevelOf("{\"ts\":1.0,\"level\":\"warning\",\"event\":\"x\"}") == "warning");
  CHECK(igi::LogLevelOf("ts=1.0 level=error logger=igi event=worker_crashed") == "error");
  CHECK(igi::LogLevelOf("Traceback (most recent call last):") == "error");
  CHECK(igi::LogLevelOf("anything else") == "info");
}

TEST(launcher_bad_options_are_refused) {
  igi::DaemonLauncherOptions o;
  o.connection_file = "c.json";
  CHECK_THROWS_AS(igi::DaemonLauncher{o}, std::invalid_argument);
  o.executable = "x";
  o.restart_delay_s = 5;
  o.max_restart_delay_s = 1;
  CHECK_THROWS_AS(igi::DaemonLauncher{o}, std::invalid_argument);
}

TEST(launcher_missing_executable_is_retried_with_backoff_then_given_up) {
  const std::string dir = TempDir();
  igi::DaemonLauncherOptions o;
  o.executable = dir + "/no-such-daemon";
  o.connection_file = dir + "/c.json";
  o.restart_delay_s = 0.01;
  o.max_restart_delay_s = 0.05;
  o.max_consecutive_failures = 2;
  igi::DaemonLauncher launcher(o);
  std::vector<igi::DaemonExited> exits;
  std::optional<std::string> failed;
  std::vector<std::string> lines;
  launcher.SetOnExited([&](const igi::DaemonExited& e) { exits.push_back(e); });
  launcher.SetOnFailed([&](const std::string& m) { failed = m; });
  launcher.SetOnLog([&](const igi::DaemonLogLine& l) { lines.push_back(l.text); });
  launcher.Start();
  REQUIRE(PumpUntil(launcher, nullptr, [&] { return failed.has_value(); }, 20));
  launcher.Pump();
  CHECK(launcher.state() == igi::DaemonState::kFailed);
  REQUIRE(exits.size() == 3);  // the first start and two restarts
  CHECK(exits[0].restart_in_s == 0.01);
  CHECK(exits[1].restart_in_s == 0.02);
  CHECK(exits[2].restart_in_s < 0);
  bool named = false;
  for (const auto& l : lines) named = named || (l.find("cannot start") != std::string::npos && l.find("no-such-daemon") != std::string::npos);
  CHECK(named);
  launcher.Stop();
  CHECK(launcher.state() == igi::DaemonState::kStopped);
}

namespace {

/// The arguments the launcher hands its spawner for the first start. The spawner records them and throws
/// LaunchError (nothing is started), so the launcher gives up after one restart.
std::vector<std::string> ArgumentsSpawnedWith(std::optional<bool> exit_with_game, const std::string& connection_file,
                                              const std::vector<std::string>& executable_arguments = {}) {
  igi::DaemonLauncherOptions o;
  o.executable = "/nonexistent/igi-daemon";
  o.executable_arguments = executable_arguments;
  o.connection_file = connection_file;
  o.arguments = {"--log-format", "kv"};
  if (exit_with_game) o.exit_with_game = *exit_with_game;
  o.restart_delay_s = 0.01;
  o.max_restart_delay_s = 0.01;
  o.max_consecutive_failures = 1;
  std::mutex mu;
  std::vector<std::vector<std::string>> spawned;
  o.spawner = [&](const std::string&, const std::vector<std::string>& arguments,
                  const std::string&) -> std::unique_ptr<igi::ChildProcess> {
    {
      std::lock_guard<std::mutex> lock(mu);
      spawned.push_back(arguments);
    }
    throw igi::LaunchError("the test's spawner starts nothing");
  };
  igi::DaemonLauncher launcher(o);
  bool failed = false;
  launcher.SetOnFailed([&](const std::string&) { failed = true; });
  launcher.Start();
  const bool gave_up = PumpUntil(launcher, nullptr, [&] { return failed; }, 20);
  launcher.Stop();
  if (!gave_up) throw std::runtime_error("the launcher did not give up on a spawner that always throws");
  std::lock_guard<std::mutex> lock(mu);
  if (spawned.empty()) throw std::runtime_error("the spawner was never called");
  return spawned.front();
}

std::string Joined(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace

TEST(launcher_stop_during_a_start_leaves_no_daemon_running) {
  // Stop() while the supervisor is inside the spawner: the process it then gets is stopped too, not left running
  // (with --exit-with-pid naming the game, it would live as long as the editor).
  const std::string dir = TempDir();
  igi::DaemonLauncherOptions o;
  o.executable = "/bin/sleep";
  o.connection_file = dir + "/c.json";
  std::mutex mutex;
  bool spawning = false;
  long pid = 0;
  o.spawner = [&](const std::string& executable, const std::vector<std::string>&, const std::string& working_directory) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      spawning = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // Stop() runs meanwhile
    std::unique_ptr<igi::ChildProcess> child = igi::SpawnNativeProcess(executable, {"60"}, working_directory);
    std::lock_guard<std::mutex> lock(mutex);
    pid = child->pid();
    return child;
  };
  igi::DaemonLauncher launcher(o);
  launcher.Start();
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (spawning) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  launcher.Stop();
  long spawned = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    spawned = pid;
  }
  REQUIRE(spawned > 0);
  const bool gone = ::kill(static_cast<pid_t>(spawned), 0) != 0;  // killed and reaped by Stop(): no such process
  if (!gone) ::kill(static_cast<pid_t>(spawned), SIGKILL);
  CHECK(gone);
}

TEST(launcher_passes_exit_with_pid_of_the_game_process_by_default) {
  CHECK(igi::DaemonLauncherOptions{}.exit_with_game);
  const std::string file = TempDir() + "/c.json";
  const std::vector<std::string> args = ArgumentsSpawnedWith(std::nullopt, file);
  const std::vector<std::string> want{"--connection-file", file, "--port", "0",
                                      "--exit-with-pid", std::to_string(::getpid()), "--log-format", "kv"};
  CHECK_MSG(args == want, "\n    spawned: " << Joined(args) << "\n    want:    " << Joined(want));
}

TEST(launcher_exit_with_game_false_leaves_exit_with_pid_out) {
  const std::string file = TempDir() + "/c.json";
  const std::vector<std::string> args = ArgumentsSpawnedWith(false, file);
  const std::vector<std::string> want{"--connection-file", file, "--port", "0", "--log-format", "kv"};
  CHECK_MSG(args == want, "\n    spawned: " << Joined(args) << "\n    want:    " << Joined(want));
}

TEST(launcher_puts_the_executable_arguments_before_the_daemon_flags) {
  // A Python interpreter as the executable: `python -m igi_sdk.daemon --connection-file F ...`, never
  // `python --connection-file F ... -m igi_sdk.daemon` (which the interpreter refuses).
  const std::string file = TempDir() + "/c.json";
  const std::vector<std::string> args = ArgumentsSpawnedWith(false, file, {"-m", "igi_sdk.daemon"});
  const std::vector<std::string> want{"-m", "igi_sdk.daemon", "--connection-file", file, "--port", "0",
                                      "--log-format", "kv"};
  CHECK_MSG(args == want, "\n    spawned: " << Joined(args) << "\n    want:    " << Joined(want));
}

TEST(bundle_is_started_killed_restarted_with_its_saved_session_and_stopped) {
  const std::string& bundle = igi_test::GetOptions().bundle_dir;
  if (bundle.empty()) SKIP("no daemon bundle given (--bundle DIR or IGI_DAEMON_BUNDLE; ./dev.sh bundle builds it)");
  char resolved[4096];
  REQUIRE(::realpath(igi::BundleExecutable(bundle).c_str(), resolved) != nullptr);
  const std::string exe = resolved;
  const std::string dir = TempDir();
  igi::DaemonLauncherOptions o;
  o.executable = exe;
  o.connection_file = dir + "/connection.json";
  o.arguments = {"--n-threads", "2", "--log-format", "kv"};
  igi::DaemonLauncher launcher(o);
  std::vector<igi::DaemonReady> readies;
  std::vector<igi::DaemonExited> exits;
  std::vector<igi::DaemonLogLine> log;
  launcher.SetOnReady([&](const igi::DaemonReady& r) { readies.push_back(r); });
  launcher.SetOnExited([&](const igi::DaemonExited& e) { exits.push_back(e); });
  launcher.SetOnLog([&](const igi::DaemonLogLine& l) { log.push_back(l); });
  std::unique_ptr<igi::Client> client;
  struct DumpLog {
    std::vector<igi::DaemonLogLine>& log;
    ~DumpLog() {
      for (const auto& l : log) if (!l.from_daemon || l.level != "info") std::cout << "    | " << l.text << "\n";
    }
  } dump{log};

  launcher.Start();
  REQUIRE(PumpUntil(launcher, nullptr, [&] { return readies.size() == 1; }, 180));
  const std::int64_t first_pid = readies[0].pid;
  bool is_bundle = false;
  for (long p : ProcessesOf(exe)) is_bundle = is_bundle || p == first_pid;
  CHECK_MSG(is_bundle, "the daemon process is the bundle's executable, not a Python");
  bool forwarded = false;
  for (const auto& l : log) forwarded = forwarded || (l.from_daemon && l.text.find("daemon_ready") != std::string::npos);
  CHECK_MSG(forwarded, "the daemon's log is forwarded");

  client = igi::Client::FromConnectionFile(o.connection_file);
  client->Connect();
  igi::CreateSessionRequest npc;
  npc.persona = "Mira";
  npc.system_prompt = "You are Mira, a blacksmith. Answer in one sentence.";
  npc.sampling.temperature = 0.0;
  npc.sampling.max_tokens = 8;
  const std::string session = client->CreateSession(npc).session_id;
  const std::string first = Say(launcher, *client, session, "Can you fix my sword?");
  CHECK_MSG(first.rfind("<", 0) != 0, first);
  igi::SessionSaveBook book;
  const std::string saved = book.Save(*client, "mira", session, dir + "/mira.igisession");
  CHECK(std::ifstream(saved).good());

  const auto killed_at = Clock::now();
  REQUIRE(::kill(static_cast<pid_t>(first_pid), SIGKILL) == 0);
  REQUIRE(PumpUntil(launcher, client.get(), [&] { return readies.size() == 2; }, 60));
  const double restart_s = Since(killed_at);
  std::cout << "    restart after kill -9: " << restart_s << " s (daemon start " << readies[1].start_s << " s)\n";
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].was_ready);
  CHECK(exits[0].pid == first_pid);
  CHECK(exits[0].exit_code == 128 + SIGKILL);
  CHECK(readies[1].restart == 1);
  CHECK(readies[1].pid != first_pid);
  // a liveness bound (5 s, the target, when run by hand); tests/plugins passes 30 s in IGI_RESTART_LIMIT_S: the
  // restart time is a measured figure, not a timed test
  const char* limit_env = std::getenv("IGI_RESTART_LIMIT_S");
  const double limit_s = limit_env != nullptr ? std::atof(limit_env) : 5.0;
  CHECK_MSG(restart_s < limit_s, "restarted " << restart_s << " s after the kill (limit " << limit_s << " s)");

  client->Close();
  client = igi::Client::FromConnectionFile(o.connection_file);
  client->Connect();
  CHECK(client->connection().pid == readies[1].pid);
  const auto restored = book.RestoreAll(*client);
  CHECK(restored.failed.empty());
  REQUIRE(restored.restored.count("mira") == 1);
  CHECK(restored.restored.at("mira").n_turns == 1);
  const std::string again = Say(launcher, *client, restored.restored.at("mira").session_id, "And my shield?");
  CHECK_MSG(again.rfind("<", 0) != 0, again);
  CHECK(client->Status().n_sessions == 1);

  launcher.Stop(client.get());
  CHECK(launcher.state() == igi::DaemonState::kStopped);
  struct stat st;
  CHECK_MSG(::stat(o.connection_file.c_str(), &st) != 0, "the daemon removed its connection file");
  CHECK_MSG(exits.size() == 1, "a stop is not a death");
  const auto start = Clock::now();
  std::vector<long> left = ProcessesOf(exe);
  while (!left.empty() && Since(start) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = ProcessesOf(exe);
  }
  CHECK_MSG(left.empty(), left.size() << " processes of the bundle left behind");
  client->Close();
}

TEST(launcher_command_line_is_quoted_by_the_c_runtime_rules) {
  CHECK(igi::JoinCommandLine({"--port", "0"}) == "--port 0");
  CHECK(igi::JoinCommandLine({""}) == "\"\"");
  CHECK(igi::JoinCommandLine({"C:\\My Game\\igi.json"}) == "\"C:\\My Game\\igi.json\"");
  CHECK(igi::JoinCommandLine({"say \"hi\""}) == "\"say \\\"hi\\\"\"");
  CHECK(igi::JoinCommandLine({"ends in \\"}) == "\"ends in \\\\\"");
}
