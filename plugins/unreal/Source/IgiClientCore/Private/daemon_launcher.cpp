// daemon_launcher.cpp - IgiClientCore: daemon supervision (portable; the process backend is a ChildProcess).
#include "igi/daemon_launcher.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "igi/client.hpp"
#include "igi/process_liveness.hpp"

namespace igi {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(20);

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

bool FileExists(const std::string& path) {
  std::ifstream f(path);
  return f.good();
}

std::string ParentOf(const std::string& path) {
  const auto slash = path.find_last_of("/\\");
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

}  // namespace

std::string JoinCommandLine(const std::vector<std::string>& arguments) {
  std::string out;
  for (const std::string& arg : arguments) {
    if (!out.empty()) out += ' ';
    if (!arg.empty() && arg.find_first_of(" \t\n\"") == std::string::npos) {
      out += arg;
      continue;
    }
    out += '"';
    std::size_t backslashes = 0;
    for (char c : arg) {
      if (c == '\\') {
        ++backslashes;
        continue;
      }
      out.append(c == '"' ? backslashes * 2 + 1 : backslashes, '\\');
      backslashes = 0;
      out += c;
    }
    out.append(backslashes * 2, '\\');
    out += '"';
  }
  return out;
}

std::string BundleExecutable(const std::string& bundle_folder) {
#ifdef _WIN32
  return bundle_folder + "\\igi-daemon.exe";
#else
  return bundle_folder + "/igi-daemon";
#endif
}

double RestartDelayS(int consecutive_failures, double first_delay_s, double max_delay_s) {
  if (consecutive_failures < 1) return 0.0;
  const int exponent = consecutive_failures - 1 < 30 ? consecutive_failures - 1 : 30;
  const double delay = first_delay_s * std::ldexp(1.0, exponent);
  return delay < max_delay_s ? delay : max_delay_s;
}

std::string LogLevelOf(const std::string& line) {
  for (const char* level : {"error", "critical", "warning", "debug"}) {
    if (line.find(std::string("\"level\":\"") + level + "\"") != std::string::npos ||
        line.find(std::string("level=") + level) != std::string::npos) {
      return std::string(level) == "critical" ? "error" : level;
    }
  }
  if (line.rfind("Traceback", 0) == 0) return "error";
  return "info";
}

DaemonLauncher::DaemonLauncher(DaemonLauncherOptions options) : options_(std::move(options)) {
  if (options_.executable.empty()) throw std::invalid_argument("DaemonLauncherOptions.executable is empty");
  if (options_.connection_file.empty()) throw std::invalid_argument("DaemonLauncherOptions.connection_file is empty");
  if (!(options_.start_timeout_s > 0)) throw std::invalid_argument("start_timeout_s must be > 0");
  if (!(options_.restart_delay_s >= 0) || !(options_.max_restart_delay_s >= options_.restart_delay_s)) {
    throw std::invalid_argument("need 0 <= restart_delay_s <= max_restart_delay_s");
  }
  if (options_.max_consecutive_failures < 1) throw std::invalid_argument("max_consecutive_failures must be >= 1");
  if (!(options_.stop_timeout_s >= 0)) throw std::invalid_argument("stop_timeout_s must be >= 0");
  if (!options_.spawner) options_.spawner = SpawnNativeProcess;
  if (options_.working_directory.empty()) options_.working_directory = ParentOf(options_.executable);
}

DaemonLauncher::~DaemonLauncher() { Stop(); }

void DaemonLauncher::SetOnReady(std::function<void(const DaemonReady&)> cb) { on_ready_ = std::move(cb); }
void DaemonLauncher::SetOnExited(std::function<void(const DaemonExited&)> cb) { on_exited_ = std::move(cb); }
void DaemonLauncher::SetOnFailed(std::function<void(const std::string&)> cb) { on_failed_ = std::move(cb); }
void DaemonLauncher::SetOnLog(std::function<void(const DaemonLogLine&)> cb) { on_log_ = std::move(cb); }

void DaemonLauncher::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (supervisor_.joinable()) return;
  stopping_ = false;
  state_ = DaemonState::kStarting;
  supervisor_ = std::thread([this] { Supervise(); });
}

std::size_t DaemonLauncher::Pump(std::size_t max_callbacks) {
  std::size_t ran = 0;
  while (ran < max_callbacks) {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (queue_.empty()) break;
      fn = std::move(queue_.front());
      queue_.erase(queue_.begin());
    }
    ++ran;
    fn();
  }
  return ran;
}

bool DaemonLauncher::WaitUntilRunning(double timeout_s) {
  const auto start = Clock::now();
  while (Since(start) < timeout_s) {
    const DaemonState s = state_.load();
    if (s == DaemonState::kRunning) return true;
    if (s == DaemonState::kFailed || s == DaemonState::kStopped) return false;
    std::this_thread::sleep_for(kPoll);
  }
  return state_.load() == DaemonState::kRunning;
}

std::int64_t DaemonLauncher::pid() const {
  std::lock_guard<std::mutex> lock(mu_);
  return process_ ? process_->pid() : 0;
}

void DaemonLauncher::Post(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  queue_.push_back(std::move(fn));
}

void DaemonLauncher::Say(const std::string& level, const std::string& text) {
  DaemonLogLine line{"[igi-launcher] " + text, false, level};
  Post([this, line] { if (on_log_) on_log_(line); });
}

void DaemonLauncher::DrainOutput(ChildProcess& process) {
  std::vector<std::string> lines;
  process.ReadLines(&lines);
  for (auto& text : lines) {
    DaemonLogLine line{std::move(text), true, "info"};
    line.level = LogLevelOf(line.text);
    Post([this, line] { if (on_log_) on_log_(line); });
  }
}

bool DaemonLauncher::WaitStoppable(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return wake_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stopping_.load(); });
}

void DaemonLauncher::Supervise() {
  int failures = 0;
  std::optional<Clock::time_point> died_at;
  while (!stopping_) {
    state_ = DaemonState::kStarting;
    const auto started_at = Clock::now();
    bool ready = false;
    std::string why;
    int exit_code = -1;
    std::shared_ptr<ChildProcess> process;
    try {
      std::remove(options_.connection_file.c_str());  // a killed daemon's stale file
      std::vector<std::string> args = options_.executable_arguments;
      args.insert(args.end(), {"--connection-file", options_.connection_file, "--port", "0"});
      if (options_.exit_with_game) args.insert(args.end(), {"--exit-with-pid", std::to_string(CurrentProcessId())});
      args.insert(args.end(), options_.arguments.begin(), options_.arguments.end());
      process = options_.spawner(options_.executable, args, options_.working_directory);
      {
        std::lock_guard<std::mutex> lock(mu_);
        process_ = process;
      }
      Say("info", "started " + options_.executable + " (pid " + std::to_string(process->pid()) + ")");
      while (!stopping_) {
        DrainOutput(*process);
        if (process->Exited(&exit_code)) {
          why = "exited with code " + std::to_string(exit_code) + " before writing its connection file";
          break;
        }
        if (FileExists(options_.connection_file)) {
          try {
            ConnectionInfo info = ReadConnectionFile(options_.connection_file);
            if (info.pid == process->pid()) {
              DaemonReady r{info, process->pid(), restarts_.load(), Since(started_at),
                            died_at ? Since(*died_at) : 0.0};
              ready = true;
              state_ = DaemonState::kRunning;
              Say("info", "daemon pid " + std::to_string(r.pid) + " ready in " + Fixed(r.start_s, 2) + " s" +
                              (r.restart > 0 ? " (restart " + std::to_string(r.restart) + ", down " + Fixed(r.down_s, 2) + " s)" : ""));
              Post([this, r] { if (on_ready_) on_ready_(r); });
              break;
            }
          } catch (const IgiError&) {
            // being written: the daemon renames it into place
          }
        }
        if (Since(started_at) > options_.start_timeout_s) {
          process->Kill();
          for (int i = 0; i < 250 && !process->Exited(&exit_code); ++i) std::this_thread::sleep_for(kPoll);
          why = "wrote no connection file within " + Fixed(options_.start_timeout_s, 0) + " s (killed)";
          break;
        }
        std::this_thread::sleep_for(kPoll);
      }
      if (ready) {
        while (!stopping_ && !process->Exited(&exit_code)) {
          DrainOutput(*process);
          std::this_thread::sleep_for(kPoll);
        }
        DrainOutput(*process);
        why = "exited with code " + std::to_string(exit_code);
      }
    } catch (const IgiError& e) {
      why = std::string("cannot start ") + options_.executable + ": " + e.what();
    }
    if (stopping_) break;
    const double uptime_s = Since(started_at);
    died_at = Clock::now();
    failures = ready && uptime_s >= options_.stable_uptime_s ? 1 : failures + 1;
    const bool give_up = failures > options_.max_consecutive_failures;
    const double delay_s = give_up ? -1.0 : RestartDelayS(failures, options_.restart_delay_s, options_.max_restart_delay_s);
    DaemonExited ex{process ? process->pid() : 0, exit_code, uptime_s, ready, delay_s};
    Say(give_up ? "error" : "warning",
        "daemon " + (ex.pid ? "pid " + std::to_string(ex.pid) + " " : std::string()) + why + " after " + Fixed(uptime_s, 1) +
            " s" + (give_up ? "; " + std::to_string(failures) + " failures in a row: giving up" : "; restarting in " + Fixed(delay_s, 2) + " s"));
    Post([this, ex] { if (on_exited_) on_exited_(ex); });
    if (give_up) {
      state_ = DaemonState::kFailed;
      const std::string message = "the daemon failed " + std::to_string(failures) + " times in a row (last: " + why + ")";
      Post([this, message] { if (on_failed_) on_failed_(message); });
      return;
    }
    state_ = DaemonState::kBackoff;
    if (WaitStoppable(delay_s)) break;
    ++restarts_;
  }
}

void DaemonLauncher::Stop(Client* client) {
  std::shared_ptr<ChildProcess> process;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    process = process_;
  }
  wake_.notify_all();
  int exit_code = 0;
  if (process && !process->Exited(&exit_code)) {
    bool asked = false;
    if (client != nullptr && client->connected() && client->connection().pid == process->pid()) {
      try {
        client->Call<ShutdownRequest, ShutdownReply>(ShutdownRequest{}, std::nullopt,
                                                     options_.stop_timeout_s > 1.0 ? options_.stop_timeout_s : 1.0);
        asked = true;
      } catch (const IgiError&) {
        // it may exit before its reply arrives: the wait below decides
      }
    }
    const bool signalled = asked || process->Terminate();
    bool exited = false;
    if (signalled) {
      const auto start = Clock::now();
      while (!(exited = process->Exited(&exit_code)) && Since(start) < options_.stop_timeout_s) std::this_thread::sleep_for(kPoll);
    }
    if (!exited) {
      if (signalled) Say("warning", "the daemon did not exit within " + Fixed(options_.stop_timeout_s, 0) + " s: killing it");
      process->Kill();
      for (int i = 0; i < 250 && !process->Exited(&exit_code); ++i) std::this_thread::sleep_for(kPoll);
    }
  }
  if (supervisor_.joinable() && supervisor_.get_id() != std::this_thread::get_id()) supervisor_.join();
  // A (re)start the supervisor was spawning while Stop ran: it saw stopping_ only once the process existed, and
  // leaves it. It has served nothing yet: killed, not asked.
  std::shared_ptr<ChildProcess> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    late = process_;
  }
  if (late && late != process) {
    if (!late->Exited(&exit_code)) {
      late->Kill();
      for (int i = 0; i < 250 && !late->Exited(&exit_code); ++i) std::this_thread::sleep_for(kPoll);
    }
    process = late;
  }
  if (process) {
    try {
      if (ReadConnectionFile(options_.connection_file).pid == process->pid()) std::remove(options_.connection_file.c_str());
    } catch (const IgiError&) {
    }
  }
  state_ = DaemonState::kStopped;
}

std::string SessionSaveBook::Save(Client& client, const std::string& key, const std::string& session_id,
                                  const std::optional<std::string>& path, double timeout_s) {
  if (key.empty()) throw std::invalid_argument("SessionSaveBook::Save: key is empty");
  SaveSessionRequest request;
  request.path = path;
  const SaveSessionReply reply = client.Call<SaveSessionRequest, SaveSessionReply>(request, session_id, timeout_s);
  std::lock_guard<std::mutex> lock(mu_);
  paths_[key] = reply.path;
  return reply.path;
}

void SessionSaveBook::Record(const std::string& key, const std::string& path) {
  if (key.empty() || path.empty()) throw std::invalid_argument("SessionSaveBook::Record: key and path are required");
  std::lock_guard<std::mutex> lock(mu_);
  paths_[key] = path;
}

bool SessionSaveBook::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return paths_.erase(key) > 0;
}

std::map<std::string, std::string> SessionSaveBook::saves() const {
  std::lock_guard<std::mutex> lock(mu_);
  return paths_;
}

SessionSaveBook::Restored SessionSaveBook::RestoreAll(Client& client, double timeout_s) {
  Restored result;
  for (const auto& [key, path] : saves()) {
    try {
      LoadSessionRequest request;
      request.path = path;
      result.restored[key] = client.Call<LoadSessionRequest, LoadSessionReply>(request, std::nullopt, timeout_s);
    } catch (const IgiError& e) {
      result.failed[key] = e.kind() + ": " + e.what();
    }
  }
  return result;
}

}  // namespace igi
