// igi/transport.hpp - IgiClientCore, transport layer: the ZeroMQ DEALER socket, bytes only.
//
// The socket is owned by one I/O thread, which calls Poll(). Any thread may Post() frames: they are
// queued and the I/O thread is woken through an inproc PAIR pipe, so the DEALER socket itself is
// never touched by two threads. This class never sees a typed message.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace igi {

using Multipart = std::vector<std::string>;

/// True when `endpoint` is tcp:// to an IPv6 literal host ("tcp://[::1]:PORT"): the DEALER then needs
/// ZMQ_IPV6, without which libzmq resolves IPv4 only and never reaches the daemon.
bool EndpointNeedsIpv6(const std::string& endpoint);

class DealerTransport {
 public:
  /// Creates the sockets and connects the DEALER to `endpoint` (ZeroMQ connects lazily).
  DealerTransport(const std::string& endpoint, int linger_ms);
  ~DealerTransport();
  DealerTransport(const DealerTransport&) = delete;
  DealerTransport& operator=(const DealerTransport&) = delete;

  /// Queues a multipart message for sending; thread-safe, never blocks on the network.
  void Post(Multipart frames);
  /// Wakes a Poll() in progress (e.g. to let the I/O thread notice a stop request).
  void Wake();
  /// I/O thread only: sends everything posted, then waits up to `timeout_s` for incoming
  /// messages and returns all that are available (possibly none).
  std::vector<Multipart> Poll(double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace igi
