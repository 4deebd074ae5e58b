// igi/connection_file.hpp - IgiClientCore, transport layer: the daemon's JSON connection file.
//
// {"transport", "ip", "port", "key" (64 hex digits), "signature_scheme": "hmac-sha256",
//  "protocol_version", "pid", "zmq_mechanism", "pid_start_ticks"}; unknown fields are ignored (ipc/PROTOCOL.md
// section 13). "zmq_mechanism" (protocol 1.2) is optional: a file without it (an older daemon) means "null".
// "pid_start_ticks" (1.2) is optional too: absent or null, the daemon's start time is not known.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "igi/value.hpp"

namespace igi {

/// What a client needs to reach and authenticate with one daemon launch.
struct ConnectionInfo {
  std::string transport;  ///< "tcp" or "ipc"
  std::string ip;         ///< loopback address, or the socket path for "ipc"
  std::int64_t port = 0;
  std::string key;        ///< raw HMAC key (hex-decoded "key", 32 bytes)
  std::string signature_scheme;
  std::string protocol_version;
  std::int64_t pid = 0;
  /// What the client presents at the ZeroMQ handshake (ipc/PROTOCOL.md 1.5): "plain" or "null" (none).
  std::string zmq_mechanism = "null";
  /// The daemon's start time in clock ticks since boot (Linux /proc/PID/stat field 22); nullopt where its platform
  /// has none or the file predates the field. With `pid` it tells a daemon that is gone (igi/process_liveness.hpp).
  std::optional<std::int64_t> pid_start_ticks;

  /// ZeroMQ endpoint: "tcp://ip:port" or "ipc://path".
  std::string Endpoint() const;
  /// The ZMQ_PLAIN password to present ("plain"), or nullopt for the NULL mechanism.
  std::optional<std::string> PlainPassword() const;
};

/// The ZMQ_PLAIN username every client presents.
inline constexpr const char* kPlainUsername = "igi";

/// The ZMQ_PLAIN password of a launch key: the 64 ASCII bytes of the lowercase hex HMAC-SHA256(key,
/// "igi-zmq-plain-1") (ipc/PROTOCOL.md 1.5). Derived one way, so PLAIN, which carries it in clear, never shows the key.
std::string DerivePlainPassword(std::string_view key);

/// Parses connection-file JSON text; throws ConnectionFileError naming the problem.
ConnectionInfo ParseConnectionInfo(std::string_view json_text);

/// Reads and parses a connection file; on POSIX refuses files accessible by group or others.
ConnectionInfo ReadConnectionFile(const std::string& path);

/// Minimal JSON reader (objects, arrays, strings, numbers, true/false/null) into a Value;
/// integers become Int, other numbers Float. Throws ConnectionFileError on invalid JSON.
Value ParseJson(std::string_view text);

}  // namespace igi
