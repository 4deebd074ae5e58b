// igi/errors.hpp - IgiClientCore, shared leaf: the typed error tree of the C++ client.
//
//   IgiError                         every error the client raises on purpose
//    +-- ProtocolError                bytes that do not form a valid protocol message
//    |    +-- DecodeError             malformed msgpack / missing or mistyped field
//    |    +-- EncodeError             a value msgpack cannot represent
//    |    +-- SignatureError          HMAC mismatch or missing signature
//    +-- ConnectionFileError          connection file missing, unreadable or invalid
//    +-- TransportError               the daemon cannot be reached
//    |    +-- TimeoutError            no reply within the deadline
//    |    +-- DaemonUnavailableError  heartbeats stopped / client closed
//    +-- RequestError                 the daemon answered with error_reply{code, message, detail}
//         one subclass per wire ErrorCode, built by MakeRequestError() (the one mapping place)
#pragma once

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
};

class ProtocolError : public IgiError {
 public:
  using IgiError::IgiError;
};
class DecodeError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};
class EncodeError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};
class SignatureError : public ProtocolError {
 public:
  using ProtocolError::ProtocolError;
};
class ConnectionFileError : public IgiError {
 public:
  using IgiError::IgiError;
};
class TransportError : public IgiError {
 public:
  using IgiError::IgiError;
};
class TimeoutError : public TransportError {
 public:
  using TransportError::TransportError;
};
class DaemonUnavailableError : public TransportError {
 public:
  using TransportError::TransportError;
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
};

/// The wire string of `code` ("invalid_request", ...).
const char* ErrorCodeName(ErrorCode code);
/// True when the same request may succeed if sent again later (the spec's default per code).
bool RetryableByDefault(ErrorCode code);
/// Parses a wire code; unknown strings give ErrorCode::kInternal (as the Python SDK does).
ErrorCode ParseErrorCode(std::string_view wire);

/// The daemon answered a request with error_reply.
class RequestError : public IgiError {
 public:
  RequestError(ErrorCode code, std::string wire_code, const std::string& message, Value detail);
  ErrorCode code() const { return code_; }
  /// The code exactly as received (differs from ErrorCodeName(code()) only for unknown codes).
  const std::string& wire_code() const { return wire_code_; }
  const Value& detail() const { return detail_; }

 private:
  ErrorCode code_;
  std::string wire_code_;
  Value detail_;
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
#undef IGI_REQUEST_ERROR

/// Builds the RequestError subclass for a wire code: the single code -> exception mapping.
std::exception_ptr MakeRequestError(std::string_view wire_code, const std::string& message,
                                               const Value& detail);

/// Throws the RequestError subclass for a wire code.
[[noreturn]] void ThrowRequestError(std::string_view wire_code, const std::string& message,
                                    const Value& detail);

}  // namespace igi
