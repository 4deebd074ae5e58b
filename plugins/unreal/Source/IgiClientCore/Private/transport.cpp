// transport.cpp - IgiClientCore, transport layer: DEALER socket + inproc wake pipe (cppzmq).
#include "igi/transport.hpp"

#include <atomic>
#include <cstdint>
#include <deque>
#include <iterator>
#include <mutex>
#include <string_view>
#include <zmq.hpp>

#include "igi/connection_file.hpp"
#include "igi/errors.hpp"

// SendNow's later frames are sent without dontwait: libzmq 4.3.2 and later drop the rest of a message whose peer was
// lost after its first frame (a handshake refused, a frame over ZMQ_MAXMSGSIZE received), where 4.3.1 and earlier
// rolled it back and a blocking send then waited for good.
static_assert(ZMQ_VERSION >= ZMQ_MAKE_VERSION(4, 3, 2), "IgiClientCore needs libzmq 4.3.2 or later");

namespace igi {

struct DealerTransport::Impl {
  zmq::context_t context{1};
  zmq::socket_t dealer{context, zmq::socket_type::dealer};
  zmq::socket_t wake_rx{context, zmq::socket_type::pair};
  zmq::socket_t wake_tx{context, zmq::socket_type::pair};
  std::string endpoint;
  int linger_ms = 0;
  std::optional<std::string> plain_password;  // the handshake credential (ipc/PROTOCOL.md 1.5), if any
  std::atomic<std::int64_t> max_msg_bytes{kDefaultMaxMsgBytes};
  std::mutex outbox_mutex;  // guards outbox, reconnect and wake_tx
  std::deque<Multipart> outbox;
  bool reconnect = false;   // a Reconnect() waits for the I/O thread

  // I/O thread only (and the constructor): a fresh DEALER with the options, connected to `endpoint`.
  void ConnectDealer(std::int64_t cap) {
    dealer = zmq::socket_t(context, zmq::socket_type::dealer);  // closes the previous one (linger as set)
    dealer.set(zmq::sockopt::linger, linger_ms);
    dealer.set(zmq::sockopt::sndhwm, 1000);
    dealer.set(zmq::sockopt::rcvhwm, 1000);
    // ipc/PROTOCOL.md 1.4: the hard cap, before connecting (libzmq applies it to later connections only).
    dealer.set(zmq::sockopt::maxmsgsize, cap);
    // libzmq resolves IPv4 only unless ZMQ_IPV6 is set before connecting; the daemon may bind tcp://[::1]:PORT.
    if (EndpointNeedsIpv6(endpoint)) dealer.set(zmq::sockopt::ipv6, true);
    // ipc/PROTOCOL.md 1.5: a daemon with zmq_mechanism "plain" completes the handshake only with this credential.
    if (plain_password) {
      dealer.set(zmq::sockopt::plain_username, kPlainUsername);
      dealer.set(zmq::sockopt::plain_password, *plain_password);
    }
    dealer.connect(endpoint);
  }

  // Sends one multipart message; false (nothing sent) when the DEALER cannot take it now (EAGAIN: no peer, or at
  // the high-water mark). Only the first frame can meet that: the later frames of a message that libzmq accepted
  // are never refused (the high-water mark counts whole messages, and from libzmq 4.3.2 on, checked above, a peer
  // lost mid-message drops the rest).
  bool SendNow(const Multipart& frames) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      auto more = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (i == 0) {
        if (!dealer.send(zmq::buffer(frames[i]), more | zmq::send_flags::dontwait)) return false;
      } else {
        dealer.send(zmq::buffer(frames[i]), more);
      }
    }
    return true;
  }
};

namespace {
std::atomic<unsigned> g_instance{0};
}  // namespace

std::int64_t MaxMsgBytesFor(std::int64_t max_frame_bytes) {
  return max_frame_bytes > INT64_MAX / 2 ? -1 : 2 * max_frame_bytes;
}

bool EndpointNeedsIpv6(const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  std::string_view rest(endpoint);
  if (rest.substr(0, kTcp.size()) != kTcp) return false;
  rest.remove_prefix(kTcp.size());
  std::string_view host = rest.substr(0, rest.rfind(':'));  // without ":PORT"
  return host.find_first_of("[:") != std::string_view::npos;  // "[::1]": an IPv6 literal
}

DealerTransport::DealerTransport(const std::string& endpoint, int linger_ms, std::int64_t max_msg_bytes,
                                 std::optional<std::string> plain_password)
    : impl_(std::make_unique<Impl>()) {
  impl_->endpoint = endpoint;
  impl_->linger_ms = linger_ms;
  impl_->plain_password = std::move(plain_password);
  impl_->max_msg_bytes = max_msg_bytes;
  try {
    std::string wake_endpoint = "inproc://igi-wake-" + std::to_string(g_instance.fetch_add(1));
    impl_->wake_rx.bind(wake_endpoint);
    impl_->wake_tx.connect(wake_endpoint);
    for (zmq::socket_t* s : {&impl_->wake_rx, &impl_->wake_tx}) s->set(zmq::sockopt::linger, linger_ms);
    impl_->ConnectDealer(max_msg_bytes);
  } catch (const zmq::error_t& e) {
    throw TransportError("cannot connect DEALER to " + endpoint + ": " + e.what());
  }
}

DealerTransport::~DealerTransport() = default;

void DealerTransport::Post(Multipart frames) {
  std::lock_guard<std::mutex> lock(impl_->outbox_mutex);
  impl_->outbox.push_back(std::move(frames));
  impl_->wake_tx.send(zmq::const_buffer("", 0), zmq::send_flags::dontwait);
}

void DealerTransport::Wake() {
  std::lock_guard<std::mutex> lock(impl_->outbox_mutex);
  impl_->wake_tx.send(zmq::const_buffer("", 0), zmq::send_flags::dontwait);
}

void DealerTransport::Reconnect(std::int64_t max_msg_bytes) {
  std::lock_guard<std::mutex> lock(impl_->outbox_mutex);
  impl_->max_msg_bytes = max_msg_bytes;
  impl_->reconnect = true;
  impl_->wake_tx.send(zmq::const_buffer("", 0), zmq::send_flags::dontwait);
}

std::int64_t DealerTransport::max_msg_bytes() const { return impl_->max_msg_bytes; }

std::vector<Multipart> DealerTransport::Poll(double timeout_s) {
  std::deque<Multipart> to_send;
  bool reconnect = false;
  {
    std::lock_guard<std::mutex> lock(impl_->outbox_mutex);
    to_send.swap(impl_->outbox);
    std::swap(reconnect, impl_->reconnect);
  }
  if (reconnect) impl_->ConnectDealer(impl_->max_msg_bytes);
  while (!to_send.empty() && impl_->SendNow(to_send.front())) to_send.pop_front();
  if (!to_send.empty()) {  // not taken now (e.g. the daemon's connection is gone): kept, in order, for the next Poll
    std::lock_guard<std::mutex> lock(impl_->outbox_mutex);
    impl_->outbox.insert(impl_->outbox.begin(), std::make_move_iterator(to_send.begin()),
                         std::make_move_iterator(to_send.end()));
  }
  zmq::pollitem_t items[] = {{impl_->dealer.handle(), 0, ZMQ_POLLIN, 0}, {impl_->wake_rx.handle(), 0, ZMQ_POLLIN, 0}};
  auto timeout_ms = std::chrono::milliseconds(static_cast<long>(timeout_s > 0 ? timeout_s * 1000.0 : 0));
  zmq::poll(items, 2, timeout_ms);
  if (items[1].revents & ZMQ_POLLIN) {
    zmq::message_t drop;
    while (impl_->wake_rx.recv(drop, zmq::recv_flags::dontwait)) {
    }
  }
  std::vector<Multipart> received;
  for (;;) {
    Multipart frames;
    zmq::message_t part;
    if (!impl_->dealer.recv(part, zmq::recv_flags::dontwait)) break;
    frames.emplace_back(part.to_string());
    while (part.more()) {
      if (!impl_->dealer.recv(part, zmq::recv_flags::none)) break;
      frames.emplace_back(part.to_string());
    }
    received.push_back(std::move(frames));
  }
  return received;
}

}  // namespace igi
