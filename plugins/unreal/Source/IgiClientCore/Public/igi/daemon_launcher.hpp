// daemon_launcher.hpp - IgiClientCore: starts the self-contained daemon bundle, waits for its connection file,
// restarts it with backoff when it dies, stops it; and the book of saved sessions to restore after a restart.
//
// Engine-independent. The process itself is behind igi::ChildProcess: SpawnNativeProcess is the POSIX backend
// (fork/exec, one pipe for stdout+stderr), used by the tests and by tools; IgiRuntime passes a spawner built on
// FPlatformProcess so that the same supervision runs on every Unreal platform.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "igi/connection_file.hpp"
#include "igi/errors.hpp"
#include "igi/messages.hpp"

namespace igi {

/// A daemon process could not be started (missing or non-executable file, fork/exec failure).
class LaunchError : public IgiError {
 public:
  using IgiError::IgiError;
  std::string kind() const override { return "launch_failed"; }
};

class Client;

/// One started process. Every method is called from the launcher's supervising thread, except Kill/Terminate
/// (also from Stop()).
class ChildProcess {
 public:
  virtual ~ChildProcess() = default;
  virtual std::int64_t pid() const = 0;
  /// Non-blocking: true once the process has exited, with its exit code (128 + signal for a POSIX signal).
  virtual bool Exited(int* exit_code) = 0;
  /// Appends complete output lines (stdout and stderr) read so far, without blocking.
  virtual void ReadLines(std::vector<std::string>* lines) = 0;
  /// Asks the process to exit (SIGTERM on POSIX); false where the platform has no such request.
  virtual bool Terminate() = 0;
  /// Ends it at once (SIGKILL, TerminateProcess).
  virtual void Kill() = 0;
};

/// Starts `executable` with `arguments` (one string each, no quoting needed) in `working_directory`, with
/// PYTHONHOME/PYTHONPATH removed from the environment. Throws LaunchError when it cannot start.
using ProcessSpawner = std::function<std::unique_ptr<ChildProcess>(
    const std::string& executable, const std::vector<std::string>& arguments, const std::string& working_directory)>;

/// The POSIX backend (fork + execve). On Windows it throws LaunchError: pass a spawner of the engine's own.
std::unique_ptr<ChildProcess> SpawnNativeProcess(const std::string& executable, const std::vector<std::string>& arguments,
                                                 const std::string& working_directory);

struct DaemonLauncherOptions {
  std::string executable;               ///< the bundle's igi-daemon (BundleExecutable finds it in a folder)
  std::vector<std::string> executable_arguments;  ///< before the daemon's own, for an executable that is not the
                                                 ///< daemon (a Python interpreter: {"-m", "igi_sdk.daemon"})
  std::string connection_file;          ///< passed as --connection-file
  std::vector<std::string> arguments;   ///< more daemon flags, e.g. {"--vram-budget-mib", "2048"}
  bool exit_with_game = true;           ///< pass --exit-with-pid <this process's id> (after --port 0, before
                                        ///< arguments): the daemon shuts down when the game crashes or is killed
  std::string working_directory;        ///< "" = the executable's folder
  double start_timeout_s = 120.0;       ///< longest wait for the connection file; then killed, a failed start
  double restart_delay_s = 0.25;        ///< delay before the first restart; doubles per consecutive failure
  double max_restart_delay_s = 30.0;    ///< cap of the delay
  double stable_uptime_s = 60.0;        ///< a daemon that served this long starts the backoff afresh
  int max_consecutive_failures = 8;     ///< then the launcher gives up (kFailed)
  double stop_timeout_s = 10.0;         ///< Stop(): wait for an orderly exit this long, then kill
  ProcessSpawner spawner;               ///< empty = SpawnNativeProcess
};

/// One command line from separate arguments, each quoted by the Windows C runtime's rules when it has a space, tab
/// or quote (what FPlatformProcess::CreateProc and the C runtimes split it back with).
std::string JoinCommandLine(const std::vector<std::string>& arguments);

/// `<folder>/igi-daemon.exe` on Windows, else `<folder>/igi-daemon`.
std::string BundleExecutable(const std::string& bundle_folder);

/// The restart delay before restart number `consecutive_failures` (1 = first): first * 2^(n-1), capped.
double RestartDelayS(int consecutive_failures, double first_delay_s, double max_delay_s);

/// "error", "warning", "debug" or "info": the level field of a daemon log line (json or key=value).
std::string LogLevelOf(const std::string& line);

enum class DaemonState { kStopped, kStarting, kRunning, kBackoff, kFailed };

struct DaemonReady {
  ConnectionInfo connection;  ///< the daemon's connection file (pid checked)
  std::int64_t pid = 0;
  int restart = 0;            ///< 0 = the first start
  double start_s = 0.0;       ///< process start to connection file
  double down_s = 0.0;        ///< time since the previous daemon died (0 for the first start)
};

struct DaemonExited {
  std::int64_t pid = 0;
  int exit_code = -1;         ///< 128 + signal for a POSIX signal (137 = SIGKILL); -1 = it never started
  double uptime_s = 0.0;
  bool was_ready = false;
  double restart_in_s = 0.0;  ///< negative: the launcher gives up
};

struct DaemonLogLine {
  std::string text;
  bool from_daemon = true;    ///< false: the launcher's own account of starts and deaths
  std::string level = "info";
};

/// Supervises one daemon process at a time (see docs/unreal.md, "Shipping the daemon"). A background thread starts
/// it with the executable's arguments, `--connection-file F --port 0`, `--exit-with-pid` of this process (unless
/// exit_with_game is false) and the options' arguments, deletes a stale connection file first, waits until the file
/// names the new pid, watches it and restarts it after RestartDelayS when it dies without being asked to. Callbacks
/// run only inside Pump(), on the thread that calls it (the game thread).
class DaemonLauncher {
 public:
  explicit DaemonLauncher(DaemonLauncherOptions options);  ///< throws std::invalid_argument for bad options
  ~DaemonLauncher();                                        ///< Stop()
  DaemonLauncher(const DaemonLauncher&) = delete;
  DaemonLauncher& operator=(const DaemonLauncher&) = delete;

  void SetOnReady(std::function<void(const DaemonReady&)> cb);
  void SetOnExited(std::function<void(const DaemonExited&)> cb);
  void SetOnFailed(std::function<void(const std::string&)> cb);
  void SetOnLog(std::function<void(const DaemonLogLine&)> cb);

  /// Starts supervising (once; no-op while it runs).
  void Start();
  /// Runs queued callbacks on this thread; returns how many ran.
  std::size_t Pump(std::size_t max_callbacks = SIZE_MAX);
  /// Blocks until kRunning (true) or kFailed/kStopped/timeout (false). Callbacks still run only in Pump().
  bool WaitUntilRunning(double timeout_s);
  /// Stops supervising and ends the daemon: shutdown_request through `client` when it is connected to this daemon,
  /// else Terminate(); killed after stop_timeout_s. Returns once the process has exited. Idempotent.
  void Stop(Client* client = nullptr);

  DaemonState state() const { return state_.load(); }
  std::int64_t pid() const;   ///< the current process, 0 = none
  int restarts() const { return restarts_.load(); }
  const DaemonLauncherOptions& options() const { return options_; }

 private:
  void Supervise();
  void Post(std::function<void()> fn);
  void Say(const std::string& level, const std::string& text);
  void DrainOutput(ChildProcess& process);
  bool WaitStoppable(double seconds);

  DaemonLauncherOptions options_;
  std::atomic<DaemonState> state_{DaemonState::kStopped};
  std::atomic<int> restarts_{0};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::shared_ptr<ChildProcess> process_;
  std::thread supervisor_;
  std::mutex queue_mu_;
  std::vector<std::function<void()>> queue_;
  std::function<void(const DaemonReady&)> on_ready_;
  std::function<void(const DaemonExited&)> on_exited_;
  std::function<void(const std::string&)> on_failed_;
  std::function<void(const DaemonLogLine&)> on_log_;
};

/// Where the game last saved each session (save_session_request), under a key of its own (an NPC's name: session
/// ids change when a daemon restarts); RestoreAll opens every recorded save on a new daemon. Thread-safe.
class SessionSaveBook {
 public:
  /// Saves `session_id` (path nullopt: the daemon's session folder), records it under `key`; returns the file.
  std::string Save(Client& client, const std::string& key, const std::string& session_id,
                   const std::optional<std::string>& path = std::nullopt, double timeout_s = 30.0);
  void Record(const std::string& key, const std::string& path);
  bool Forget(const std::string& key);
  std::map<std::string, std::string> saves() const;

  struct Restored {
    std::map<std::string, LoadSessionReply> restored;  ///< key -> reply (session_id is the new id)
    std::map<std::string, std::string> failed;         ///< key -> error kind and message
  };
  /// Opens every recorded save; one that fails is reported and kept.
  Restored RestoreAll(Client& client, double timeout_s = 60.0);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> paths_;
};

}  // namespace igi
