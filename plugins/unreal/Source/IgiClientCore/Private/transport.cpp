// transport.cpp - IgiClientCore, transport layer: DEALER socket + inproc wake pipe (cppzmq).
#include "igi/transport.hpp"

#include <atomic>
#include <deque>
#include <mutex>
#include <string_view>
#include <zmq.hpp>

#include "igi/errors.hpp"

namespace igi {

struct DealerTransport::Impl {
  zmq::context_t context{1};
  zmq::socket_t dealer{context, zmq::socket_type::dealer};
  zmq::socket_t wake_rx{context, zmq::socket_type::pair};
  zmq::socket_t wake_tx{context, zmq::socket_type::pair};
  std::mutex outbox_mutex;  // guards outbox and wake_tx
  std::deque<Multipart> outbox;
};

namespace {
std::atomic<unsigned> g_instance{0};
}  // namespace

bool EndpointNeedsIpv6(const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  std::string_view rest(endpoint);
  if (rest.substr(0, kTcp.size()) != kTcp) return false;
  rest.remove_prefix(kTcp.size());
  std::string_view host = rest.substr(0, rest.rfind(':'));  // without ":PORT"
  return host.find_first_of("[:") != std::string_view::npos;  // "[::1]": an IPv6 literal
}

DealerTransport::DealerTransport(const std::string& endpoint, int linger_ms) : impl_(std::make_unique<Impl>()) {
  try {
    std::string wake_endpoint = "inproc://igi-wake-" + std::to_string(g_instance.fetch_add(1));
    impl_->wake_rx.bind(wake_endpoint);
    impl_->wake_tx.connect(wake_endpoint);
    for (zmq::socket_t* s : {&impl_->dealer, &impl_->wake_rx, &impl_->wake_tx}) {
      s->set(zmq::sockopt::linger, linger_ms);
    }
    impl_->dealer.set(zmq::sockopt::sndhwm, 1000);
    impl_->dealer.set(zmq::sockopt::rcvhwm, 1000);
    // libzmq resolves IPv4 only unless ZMQ_IPV6 is set before connecting; the daemon may bind tcp://[::1]:PORT.
    if (EndpointNeedsIpv6(endpoint)) impl_->dealer.set(zmq::sockopt::ipv6, true);
    impl_->dealer.connect(endpoint);
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

std::vector<Multipart> DealerTransport::Poll(double timeout_s) {
  std::deque<Multipart> to_send;
  {
    std::lock_guard<std::mutex> lock(impl_->outbox_mutex);
    to_send.swap(impl_->outbox);
  }
  for (Multipart& frames : to_send) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      impl_->dealer.send(zmq::buffer(frames[i]), flags);  // blocks only at the HWM
    }
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
