// igi/transport.hpp - IgiClientCore, transport layer: the ZeroMQ DEALER socket, bytes only.
//
// The socket is owned by one I/O thread, which calls Poll(). Any thread may Post() frames: they are
// queued and the I/O thread is woken through an inproc PAIR pipe, so the DEALER socket itself is
// never touched by two threads. This class never sees a typed message.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace igi {

using Multipart = std::vector<std::string>;

/// ZMQ_MAXMSGSIZE before a handshake has announced the daemon's limit: 2 x the default limits.max_frame_bytes
/// (1 MiB, kDefaultMaxFrameBytes), as ipc/PROTOCOL.md 1.4 asks.
inline constexpr std::int64_t kDefaultMaxMsgBytes = 2 * 1048576;

/// The ZMQ_MAXMSGSIZE hard cap for a `max_frame_bytes` limit: twice it (ipc/PROTOCOL.md 1.4); -1 (no cap) when
/// twice it does not fit an int64.
std::int64_t MaxMsgBytesFor(std::int64_t max_frame_bytes);

/// True when `endpoint` is tcp:// to an IPv6 literal host ("tcp://[::1]:PORT"): the DEALER then needs
/// ZMQ_IPV6, without which libzmq resolves IPv4 only and never reaches the daemon.
bool EndpointNeedsIpv6(const std::string& endpoint);

class DealerTransport {
 public:
  /// Creates the sockets and connects the DEALER to `endpoint` (tcp:// or ipc://; ZeroMQ connects lazily).
  /// `max_msg_bytes` is the DEALER's ZMQ_MAXMSGSIZE (-1 = none): libzmq drops the connection when the peer sends a
  /// larger frame, and, that being a protocol error, does not re-establish it. With `plain_password` the DEALER
  /// presents the ZMQ_PLAIN credential (username kPlainUsername) at its handshakes (ipc/PROTOCOL.md 1.5), on this
  /// socket and on those Reconnect() makes; without it, none (the NULL mechanism).
  DealerTransport(const std::string& endpoint, int linger_ms, std::int64_t max_msg_bytes = kDefaultMaxMsgBytes,
                  std::optional<std::string> plain_password = std::nullopt);
  ~DealerTransport();
  DealerTransport(const DealerTransport&) = delete;
  DealerTransport& operator=(const DealerTransport&) = delete;

  /// Queues a multipart message for sending; thread-safe, never blocks on the network.
  void Post(Multipart frames);
  /// Wakes a Poll() in progress (e.g. to let the I/O thread notice a stop request).
  void Wake();
  /// Replaces the DEALER by a fresh one connected to the same endpoint with ZMQ_MAXMSGSIZE `max_msg_bytes`
  /// (libzmq applies that option only to connections made after it is set). Thread-safe: the I/O thread's next
  /// Poll() does it before sending anything, so what is posted after this call goes out on the new socket; what
  /// arrived on the old one and was not yet received is lost.
  void Reconnect(std::int64_t max_msg_bytes);
  /// The ZMQ_MAXMSGSIZE of the DEALER (the one a pending Reconnect() asked for). Thread-safe.
  std::int64_t max_msg_bytes() const;
  /// I/O thread only: sends what was posted, in order, then waits up to `timeout_s` for incoming
  /// messages and returns all that are available (possibly none). Never blocks on a send: when the DEALER
  /// cannot take a message (no peer, or at the high-water mark) it and the ones after it stay queued for the
  /// next Poll().
  std::vector<Multipart> Poll(double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace igi
