// client.cpp - IgiClientCore, client layer: lifecycle, raw calls, Pump and accessors of igi::Client.
#include "igi/client.hpp"

#include "client_impl.hpp"

namespace igi {

using detail::SteadyNow;

Client::Client(ConnectionInfo info, ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(info), std::move(options))) {
  impl_->io_thread = std::thread([impl = impl_.get()] { impl->Run(); });
}

std::unique_ptr<Client> Client::FromConnectionFile(const std::string& connection_file, ClientOptions options) {
  auto client = std::make_unique<Client>(ReadConnectionFile(connection_file), std::move(options));
  client->impl_->connection_file = connection_file;  // named in a StaleConnectionFileError
  return client;
}

Client::~Client() { Close(); }

void Client::Close() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (!impl_->running && !impl_->io_thread.joinable()) return;
    impl_->running = false;
  }
  impl_->transport.Wake();
  if (impl_->io_thread.joinable()) impl_->io_thread.join();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto error = std::make_exception_ptr(DaemonUnavailableError("client closed"));
  for (auto& [id, p] : impl_->pending) impl_->FailLocked(id, p, error);
  impl_->pending.clear();
  impl_->connected = false;
}

Envelope Client::CallRaw(const std::string& type, const std::optional<std::string>& session_id, Value content,
                         double timeout_s) {
  Pending entry;
  entry.promise = std::make_shared<std::promise<Envelope>>();
  std::future<Envelope> future = entry.promise->get_future();
  std::string id = impl_->Send(type, session_id, content, std::move(entry), timeout_s);
  // The I/O thread enforces the deadline; the margin only guards against a stalled I/O thread.
  if (future.wait_for(std::chrono::duration<double>(timeout_s + 1.0)) != std::future_status::ready) {
    Forget(id);
    throw TimeoutError("no reply to " + type + " within " + std::to_string(timeout_s) + " s");
  }
  Envelope env = future.get();  // rethrows TimeoutError / DaemonUnavailableError / ProtocolError
  if (env.header.type == ErrorReply::kType) std::rethrow_exception(ErrorFromReply(env));
  return env;
}

std::size_t Client::Pump(std::size_t max_callbacks) {
  std::size_t ran = 0;
  while (ran < max_callbacks) {
    std::function<void()> event;
    {
      std::lock_guard<std::mutex> lock(impl_->mutex);
      if (impl_->events.empty()) break;
      event = std::move(impl_->events.front().second);
      impl_->events.pop_front();
    }
    event();  // outside the lock: callbacks may call back into the client
    ++ran;
  }
  return ran;
}

void Client::Forget(const std::string& msg_id) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->pending.erase(msg_id);
  auto& q = impl_->events;
  q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& e) { return e.first == msg_id; }), q.end());
}

void Client::SetOnDisconnected(std::function<void(const IgiError&)> callback) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->on_disconnected = std::move(callback);
}

bool Client::connected() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->connected;
}

HelloReply Client::hello() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->hello;
}

ClientCounters Client::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->counters;
}

const ConnectionInfo& Client::connection() const { return impl_->info; }

std::int64_t Client::max_msg_bytes() const { return impl_->transport.max_msg_bytes(); }

}  // namespace igi
