// igi/errors.hpp - IgiClientCore, shared leaf: the typed error tree of the C++ client.
//
//   IgiError                         every error the client raises on purpose
//    +-- WireError                    received frames that do not form a valid message
//    |    +-- BadFrameError           wrong frame count, magic or signature-frame shape ("bad_frame")
//    |    +-- BadSignatureError       HMAC mismatch ("bad_signature")
//    |    +-- ProtocolError           authentic message violating the protocol; carries an ErrorCode
//    |         +-- DecodeError        malformed msgpack, missing or mistyped field ("invalid_request")
//    +-- EncodeError                  a value msgpack cannot represent
//    +-- ConnectionFileError          connection file missing, unreadable or invalid
//    |    +-- StaleConnectionFileError  it names a daemon that is gone (killed without removing it)
//    +-- TransportError               the daemon cannot be reached
//    |    +-- TimeoutError            no reply within the deadline
//    |    +-- DaemonUnavailableError  heartbeats unanswered / client closed
//    |    +-- NotConnectedError       a request other than hello_request before Connect() (nothing sent)
//    +-- RequestError                 the daemon answered error_reply{code, message, detail, retryable}
//         one subclass per wire ErrorCode, built by MakeRequestError() (the one mapping place)
//
// WireError::classification() is the `expect` string of ipc/vectors/invalid.msgpack.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

#include "igi/value.hpp"

namespace igi {

/// Base of every error the client raises on purpose.
class IgiError : public std::runtime_error {
 public:
  explicit IgiError(const std::string& message) : std::runtime_error(message) {}
  /// Stable short name of the failure, usable without RTTI (Unreal builds run without it): the wire
  /// error code for RequestError, the classification for WireError, else "timeout",
  /// "daemon_unavailable", "not_connected", "transport", "connection_file", "stale_connection_file", "encode" or
  /// "error".
  virtual std::string kind() const { return "error"; }
};

class EncodeError : public IgiError {
 public:
  using IgiError::IgiError;
  std::string kind() const override { return "encode"; }
};

/// Received frames that do not form a valid protocol message.
class WireError : public IgiError {
 public:
  using IgiError::IgiError;
  /// Stable failure name ("bad_frame", "bad_signature" or an error code string).
  virtual std::string classification() const = 0;
  std::string kind() const override { return classification(); }
};
class BadFrameError : public WireError {
 public:
  using WireError::WireError;
  std::string classification() const override { return "bad_frame"; }
};
class BadSignatureError : public WireError {
 public:
  using WireError::WireError;
  std::string classification() const override { return "bad_signature"; }
};

class ConnectionFileError : public IgiError {
 public:
  using IgiError::IgiError;
  std::string kind() const override { return "connection_file"; }
};
/// Connect(): the connection file names a daemon that is gone (its pid does not run, or runs with another start time)
/// and nothing answered a short handshake: a daemon killed with SIGKILL left it. Start the daemon; it replaces the file.
class StaleConnectionFileError : public ConnectionFileError {
 public:
  StaleConnectionFileError(const std::string& message, std::int64_t pid) : ConnectionFileError(message), pid_(pid) {}
  std::string kind() const override { return "stale_connection_file"; }
  /// The pid the file names.
  std::int64_t pid() const { return pid_; }

 private:
  std::int64_t pid_;
};
class TransportError : public IgiError {
 public:
  using IgiError::IgiError;
  std::string kind() const override { return "transport"; }
};
class TimeoutError : public TransportError {
 public:
  using TransportError::TransportError;
  std::string kind() const override { return "timeout"; }
};
class DaemonUnavailableError : public TransportError {
 public:
  using TransportError::TransportError;
  std::string kind() const override { return "daemon_unavailable"; }
};
/// A request other than hello_request before Connect() succeeded: the protocol's first message is
/// hello_request (ipc/PROTOCOL.md 9.4), so the request is refused and nothing is sent.
class NotConnectedError : public TransportError {
 public:
  using TransportError::TransportError;
  std::string kind() const override { return "not_connected"; }
};

/// The closed set of wire error codes (ipc/PROTOCOL.md, "Error codes").
enum class ErrorCode {
  kInvalidRequest,
  kUnknownType,
  kUnsupportedVersion,
  kTooLarge,
  kBusy,
  kNotFound,
  kNoModel,
  kModelNotFound,
  kModelInvalid,
  kBudgetInfeasible,
  kEngineFailure,
  kCancelled,
  kTimeout,
  kShuttingDown,
  kInternal,  ///< also what a code from a newer protocol minor maps to
  // 1.1: constrained output and tools
  kInvalidGrammar,
  kInvalidSchema,
  kUnknownTool,
  kInvalidToolArguments,
  kInvalidOutput,
  // 1.1: images
  kInvalidImage,
  // 1.2: the replay window (ipc/PROTOCOL.md 2.1)
  kReplayed,  ///< the last value
};

/// The wire string of `code` ("invalid_request", ...).
const char* ErrorCodeName(ErrorCode code);
/// True when the same request may succeed if sent again later (the spec's default per code).
bool RetryableByDefault(ErrorCode code);
/// Parses a wire code; unknown strings give ErrorCode::kInternal (as the Python SDK does).
ErrorCode ParseErrorCode(std::string_view wire);

/// An authentic message that violates the protocol (the daemon answers these with error_reply).
class ProtocolError : public WireError {
 public:
  ProtocolError(ErrorCode code, const std::string& message);
  ErrorCode code() const { return code_; }
  std::string classification() const override { return ErrorCodeName(code_); }

 private:
  ErrorCode code_;
};

/// Malformed msgpack or a missing / mistyped / out-of-range field: code invalid_request.
class DecodeError : public ProtocolError {
 public:
  explicit DecodeError(const std::string& message) : ProtocolError(ErrorCode::kInvalidRequest, message) {}
};

/// The daemon answered a request with error_reply.
class RequestError : public IgiError {
 public:
  RequestError(ErrorCode code, std::string wire_code, const std::string& message, Value detail,
               bool retryable = false);
  ErrorCode code() const { return code_; }
  /// The code exactly as received (differs from ErrorCodeName(code()) only for unknown codes).
  const std::string& wire_code() const { return wire_code_; }
  const Value& detail() const { return detail_; }
  bool retryable() const { return retryable_; }
  std::string kind() const override { return ErrorCodeName(code_); }

 private:
  ErrorCode code_;
  std::string wire_code_;
  Value detail_;
  bool retryable_;
};

#define IGI_REQUEST_ERROR(Name)                 \
  class Name : public RequestError {            \
   public:                                      \
    using RequestError::RequestError;           \
  };
IGI_REQUEST_ERROR(InvalidRequestError)
IGI_REQUEST_ERROR(UnknownTypeError)
IGI_REQUEST_ERROR(UnsupportedVersionError)
IGI_REQUEST_ERROR(TooLargeError)
IGI_REQUEST_ERROR(BusyError)
IGI_REQUEST_ERROR(NotFoundError)
IGI_REQUEST_ERROR(NoModelError)
IGI_REQUEST_ERROR(ModelNotFoundError)
IGI_REQUEST_ERROR(ModelInvalidError)
IGI_REQUEST_ERROR(BudgetInfeasibleError)
IGI_REQUEST_ERROR(EngineFailureError)
IGI_REQUEST_ERROR(CancelledError)
IGI_REQUEST_ERROR(DaemonTimeoutError)
IGI_REQUEST_ERROR(ShuttingDownError)
IGI_REQUEST_ERROR(InternalError)
IGI_REQUEST_ERROR(InvalidGrammarError)
IGI_REQUEST_ERROR(InvalidSchemaError)
IGI_REQUEST_ERROR(UnknownToolError)
IGI_REQUEST_ERROR(InvalidToolArgumentsError)
IGI_REQUEST_ERROR(InvalidOutputError)
IGI_REQUEST_ERROR(InvalidImageError)
IGI_REQUEST_ERROR(ReplayedError)
#undef IGI_REQUEST_ERROR

/// Builds the RequestError subclass for a wire code: the single code -> exception mapping.
std::exception_ptr MakeRequestError(std::string_view wire_code, const std::string& message,
                                    const Value& detail, bool retryable = false);

/// Throws the RequestError subclass for a wire code.
[[noreturn]] void ThrowRequestError(std::string_view wire_code, const std::string& message,
                                    const Value& detail, bool retryable = false);

}  // namespace igi
