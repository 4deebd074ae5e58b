// connect_task.hpp - IgiClientCore, client layer: connecting (and reopening saved sessions) off the game thread.
//
// Client::Connect waits for the daemon's hello: up to stale_connect_timeout_s on a file a killed daemon left, up to
// connect_timeout_s per handshake otherwise; SessionSaveBook::RestoreAll waits for one load_session per save. A game
// thread must wait for none of them: a ConnectTask runs them on a thread of its own, and the game thread polls it once
// per frame and installs the client it hands over. Engine-independent; UIgiSubsystem is its Unreal user.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "igi/client.hpp"
#include "igi/daemon_launcher.hpp"

namespace igi {

/// What a ConnectTask ended with: a connected client, or the error that stopped it.
struct ConnectOutcome {
  std::unique_ptr<Client> client;      ///< connected; null when `error` is set
  std::exception_ptr error;            ///< an IgiError (rethrow to read it), or null
  SessionSaveBook::Restored restored;  ///< the saves reopened through the client, when the task was given a book
};

class ConnectTask {
 public:
  /// Starts connecting to the daemon `connection_file` names; with `restore`, then reopens every save it records
  /// (SessionSaveBook::RestoreAll: the book must outlive the task).
  explicit ConnectTask(std::string connection_file, ClientOptions options = {}, SessionSaveBook* restore = nullptr);
  /// Abort().
  ~ConnectTask();
  ConnectTask(const ConnectTask&) = delete;
  ConnectTask& operator=(const ConnectTask&) = delete;

  /// The outcome, once (nullopt while the task runs, and after it was taken). Never blocks.
  std::optional<ConnectOutcome> Poll();
  /// Ends the task: a handshake or a restore under way fails at once (the client being connected is closed), the
  /// thread is joined, and no outcome is handed over. Safe to call more than once.
  void Abort();

 private:
  void Run(std::string connection_file, ClientOptions options, SessionSaveBook* restore);

  std::mutex mu_;
  bool aborted_ = false;
  Client* connecting_ = nullptr;  ///< the client the thread is connecting through (closed by Abort)
  std::optional<ConnectOutcome> outcome_;  ///< set by the thread when it ends (not when aborted), until Poll takes it
  std::thread thread_;
};

}  // namespace igi
