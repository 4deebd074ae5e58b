// errors.cpp - IgiClientCore, shared leaf: wire error code table and the code -> exception mapping.
#include "igi/errors.hpp"

#include <utility>

namespace igi {
namespace {

struct CodeEntry {
  ErrorCode code;
  const char* wire;
  bool retryable;
};

constexpr CodeEntry kCodes[] = {
    {ErrorCode::kInvalidRequest, "invalid_request", false},
    {ErrorCode::kUnknownType, "unknown_type", false},
    {ErrorCode::kUnsupportedVersion, "unsupported_version", false},
    {ErrorCode::kTooLarge, "too_large", false},
    {ErrorCode::kBusy, "busy", true},
    {ErrorCode::kNotFound, "not_found", false},
    {ErrorCode::kNoModel, "no_model", true},
    {ErrorCode::kModelNotFound, "model_not_found", false},
    {ErrorCode::kModelInvalid, "model_invalid", false},
    {ErrorCode::kBudgetInfeasible, "budget_infeasible", false},
    {ErrorCode::kEngineFailure, "engine_failure", true},
    {ErrorCode::kCancelled, "cancelled", false},
    {ErrorCode::kTimeout, "timeout", true},
    {ErrorCode::kShuttingDown, "shutting_down", false},
    {ErrorCode::kInternal, "internal", false},
    {ErrorCode::kInvalidGrammar, "invalid_grammar", false},
    {ErrorCode::kInvalidSchema, "invalid_schema", false},
    {ErrorCode::kUnknownTool, "unknown_tool", false},
    {ErrorCode::kInvalidToolArguments, "invalid_tool_arguments", true},
    {ErrorCode::kInvalidOutput, "invalid_output", true},
    {ErrorCode::kInvalidImage, "invalid_image", false},
    {ErrorCode::kReplayed, "replayed", false},
};

template <typename E>
std::exception_ptr Make(ErrorCode code, std::string_view wire, const std::string& message, const Value& detail,
                        bool retryable) {
  return std::make_exception_ptr(E(code, std::string(wire), message, detail, retryable));
}

}  // namespace

const char* ErrorCodeName(ErrorCode code) {
  for (const CodeEntry& e : kCodes) {
    if (e.code == code) return e.wire;
  }
  return "internal";
}

bool RetryableByDefault(ErrorCode code) {
  for (const CodeEntry& e : kCodes) {
    if (e.code == code) return e.retryable;
  }
  return false;
}

ErrorCode ParseErrorCode(std::string_view wire) {
  for (const CodeEntry& e : kCodes) {
    if (wire == e.wire) return e.code;
  }
  return ErrorCode::kInternal;
}

ProtocolError::ProtocolError(ErrorCode code, const std::string& message)
    : WireError(std::string(ErrorCodeName(code)) + ": " + message), code_(code) {}

RequestError::RequestError(ErrorCode code, std::string wire_code, const std::string& message, Value detail,
                           bool retryable)
    : IgiError(wire_code + ": " + message),
      code_(code),
      wire_code_(std::move(wire_code)),
      detail_(std::move(detail)),
      retryable_(retryable) {}

std::exception_ptr MakeRequestError(std::string_view wire_code, const std::string& message, const Value& detail,
                                    bool retryable) {
  ErrorCode code = ParseErrorCode(wire_code);
  switch (code) {
    case ErrorCode::kInvalidRequest: return Make<InvalidRequestError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kUnknownType: return Make<UnknownTypeError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kUnsupportedVersion: return Make<UnsupportedVersionError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kTooLarge: return Make<TooLargeError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kBusy: return Make<BusyError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kNotFound: return Make<NotFoundError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kNoModel: return Make<NoModelError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kModelNotFound: return Make<ModelNotFoundError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kModelInvalid: return Make<ModelInvalidError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kBudgetInfeasible: return Make<BudgetInfeasibleError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kEngineFailure: return Make<EngineFailureError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kCancelled: return Make<CancelledError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kTimeout: return Make<DaemonTimeoutError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kShuttingDown: return Make<ShuttingDownError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kInternal: return Make<InternalError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kInvalidGrammar: return Make<InvalidGrammarError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kInvalidSchema: return Make<InvalidSchemaError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kUnknownTool: return Make<UnknownToolError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kInvalidToolArguments:
      return Make<InvalidToolArgumentsError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kInvalidOutput: return Make<InvalidOutputError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kInvalidImage: return Make<InvalidImageError>(code, wire_code, message, detail, retryable);
    case ErrorCode::kReplayed: return Make<ReplayedError>(code, wire_code, message, detail, retryable);
  }
  return Make<RequestError>(code, wire_code, message, detail, retryable);
}

void ThrowRequestError(std::string_view wire_code, const std::string& message, const Value& detail,
                       bool retryable) {
  std::rethrow_exception(MakeRequestError(wire_code, message, detail, retryable));
}

}  // namespace igi
