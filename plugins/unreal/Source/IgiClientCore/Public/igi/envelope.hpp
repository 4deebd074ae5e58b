// igi/envelope.hpp - IgiClientCore, messages layer: header frame and the four signed frames.
//
// A message is [b"IGI1", signature, header, content]. Receive-side checks run in the order the
// spec gives, and the first failure is thrown: frame shape (BadFrameError), signature
// (BadSignatureError), header, major version, type, session, content (ProtocolError).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "igi/messages.hpp"
#include "igi/msgpack.hpp"

namespace igi {

inline constexpr const char* kMagic = "IGI1";
inline constexpr std::size_t kNumFrames = 4;
inline constexpr std::size_t kDefaultMaxFrameBytes = 1048576;

/// The header frame, in wire order. Member defaults are the wire's defaults for absent keys; NewHeader() builds an
/// outgoing header (it writes kProtocolVersion).
struct Header {
  std::string msg_id;  ///< uuid4 hex, 32 lowercase hex digits
  std::optional<std::string> parent_id;
  std::optional<std::string> session_id;
  std::string type;
  std::string protocol_version = kAbsentHeaderProtocolVersion;
  double sent_at = 0.0;  ///< unix seconds, float64

  template <class V>
  void Visit(V& v) {
    v.Req("msg_id", msg_id, rules::kMsgId);
    v.Def("parent_id", parent_id, rules::kMsgId);
    v.Def("session_id", session_id, rules::kSessionId);
    Rule type_rule = rules::MaxLen(64);
    type_rule.min_len = 1;
    v.Req("type", type, type_rule);
    v.Def("protocol_version", protocol_version, rules::kVersion);
    v.Req("sent_at", sent_at, rules::kNonNeg);
  }
};

/// A fresh uuid4 as 32 lowercase hex digits.
std::string NewMsgId();
/// Current wall clock, unix seconds.
double UnixNow();
/// A header with a fresh msg_id and the current time.
Header NewHeader(const std::string& type, std::optional<std::string> parent_id = std::nullopt,
                 std::optional<std::string> session_id = std::nullopt);

/// A received message: validated header, and the content as a decoded map (unknown keys kept).
struct Envelope {
  Header header;
  Value content;  ///< already validated against header.type; decode with StructFromValue<T>()
};

using Frames = std::array<std::string, kNumFrames>;

/// Encodes and signs a typed content map under `header` into the four frames.
Frames PackFrames(const std::string& key, const Header& header, const Value& content);

/// Encodes and signs a typed message.
template <class T>
Frames PackMessage(const std::string& key, const Header& header, const T& message) {
  return PackFrames(key, header, StructToValue(message));
}

/// Checks shape and signature of the four frames; throws BadFrameError / BadSignatureError.
void CheckFrames(const std::string& key, const std::vector<std::string>& frames);

/// Decodes and validates the header frame; throws ProtocolError (too_large / invalid_request).
Header DecodeHeader(const std::string& header_bytes, std::size_t max_frame_bytes = kDefaultMaxFrameBytes);

/// True when two "major.minor" versions share the major, compared as numbers ("01.0" and "1.0" do).
bool SameMajor(const std::string& version, const std::string& ours);

/// Checks the header's major version, then decodes and validates content for `header.type`;
/// throws ProtocolError (unsupported_version, unknown_type, too_large, invalid_request).
Value DecodeContent(const Header& header, const std::string& content_bytes,
                    std::size_t max_frame_bytes = kDefaultMaxFrameBytes);

/// CheckFrames + DecodeHeader + DecodeContent.
Envelope UnpackFrames(const std::string& key, const std::vector<std::string>& frames,
                      std::size_t max_frame_bytes = kDefaultMaxFrameBytes);

}  // namespace igi
