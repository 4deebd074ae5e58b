// connect_task.cpp - IgiClientCore, client layer: connecting (and reopening saved sessions) off the game thread.
#include "igi/connect_task.hpp"

#include <utility>

namespace igi {

ConnectTask::ConnectTask(std::string connection_file, ClientOptions options, SessionSaveBook* restore) {
  thread_ = std::thread([this, file = std::move(connection_file), options = std::move(options), restore]() mutable {
    Run(std::move(file), std::move(options), restore);
  });
}

ConnectTask::~ConnectTask() { Abort(); }

void ConnectTask::Run(std::string connection_file, ClientOptions options, SessionSaveBook* restore) {
  ConnectOutcome outcome;
  try {
    std::unique_ptr<Client> client = Client::FromConnectionFile(connection_file, std::move(options));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return;
      connecting_ = client.get();
    }
    client->Connect();
    if (restore != nullptr) outcome.restored = restore->RestoreAll(*client);
    outcome.client = std::move(client);
  } catch (const IgiError&) {
    outcome.error = std::current_exception();
  } catch (const std::exception& e) {  // not expected (e.g. bad_alloc): reported like the rest, never escaping
    outcome.error = std::make_exception_ptr(IgiError(std::string("connect failed: ") + e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  connecting_ = nullptr;
  if (aborted_) return;  // the client (if any) is destroyed here, on this thread
  outcome_ = std::move(outcome);
}

std::optional<ConnectOutcome> ConnectTask::Poll() {
  std::optional<ConnectOutcome> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!outcome_) return std::nullopt;  // still running, or handed over already
    out = std::move(outcome_);
    outcome_.reset();
  }
  if (thread_.joinable()) thread_.join();  // it has finished: the join is immediate
  return out;
}

void ConnectTask::Abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    if (connecting_ != nullptr) connecting_->Close();  // thread-safe: fails the handshake or load in flight at once
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  outcome_.reset();
}

}  // namespace igi
