// envelope.cpp - IgiClientCore, messages layer: framing, signing and receive-side validation.
#include "igi/envelope.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>

#include "igi/errors.hpp"
#include "igi/signing.hpp"

namespace igi {
namespace {

bool IsLowerHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The major of a "major.minor" version as a number, as the spec's reference reads it (int("01") == 1): "01.0" and
// "1.0" share the major although their text differs. -1 when the part before the dot is not 1-4 digits.
int MajorOf(const std::string& version) {
  std::size_t digits = std::min(version.find('.'), version.size());
  if (digits == 0 || digits > 4) return -1;
  int major = 0;
  for (std::size_t i = 0; i < digits; ++i) {
    if (version[i] < '0' || version[i] > '9') return -1;
    major = major * 10 + (version[i] - '0');
  }
  return major;
}

Value DecodeFrame(const std::string& bytes, std::size_t max_frame_bytes, const char* what) {
  if (bytes.size() > max_frame_bytes) {
    throw ProtocolError(ErrorCode::kTooLarge, std::string(what) + " frame of " + std::to_string(bytes.size()) +
                                                  " bytes exceeds " + std::to_string(max_frame_bytes));
  }
  DecodeLimits limits;
  limits.max_input_bytes = max_frame_bytes;
  return Decode(bytes, limits);  // DecodeError = invalid_request
}

}  // namespace

std::string NewMsgId() {
  static std::mutex mutex;
  static std::mt19937_64 rng{[] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }()};
  unsigned char b[16];
  {
    std::lock_guard<std::mutex> lock(mutex);
    std::uint64_t hi = rng(), lo = rng();
    for (int i = 0; i < 8; ++i) {
      b[i] = static_cast<unsigned char>(hi >> (8 * i));
      b[8 + i] = static_cast<unsigned char>(lo >> (8 * i));
    }
  }
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return HexEncode(std::string(reinterpret_cast<const char*>(b), sizeof b));
}

double UnixNow() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

Header NewHeader(const std::string& type, std::optional<std::string> parent_id,
                 std::optional<std::string> session_id) {
  Header h;
  h.msg_id = NewMsgId();
  h.parent_id = std::move(parent_id);
  h.session_id = std::move(session_id);
  h.type = type;
  h.protocol_version = kProtocolVersion;
  h.sent_at = UnixNow();
  return h;
}

Frames PackFrames(const std::string& key, const Header& header, const Value& content) {
  std::string header_bytes = Encode(StructToValue(header));
  std::string content_bytes = Encode(content);
  std::string signature = SignHex(key, header_bytes, content_bytes);
  return {std::string(kMagic), std::move(signature), std::move(header_bytes), std::move(content_bytes)};
}

void CheckFrames(const std::string& key, const std::vector<std::string>& frames) {
  if (frames.size() != kNumFrames) {
    throw BadFrameError("expected 4 frames, got " + std::to_string(frames.size()));
  }
  if (frames[0] != kMagic) throw BadFrameError("bad magic, expected IGI1");
  if (!IsLowerHex64(frames[1])) throw BadFrameError("signature frame is not 64 lowercase hex digits");
  if (!VerifyHex(key, frames[1], frames[2], frames[3])) throw BadSignatureError("HMAC-SHA256 signature mismatch");
}

Header DecodeHeader(const std::string& header_bytes, std::size_t max_frame_bytes) {
  Value raw = DecodeFrame(header_bytes, max_frame_bytes, "header");
  if (!raw.is_map()) throw DecodeError(std::string("header is a ") + Value::KindName(raw.kind()) + ", not a map");
  try {
    return StructFromValue<Header>(raw);
  } catch (const DecodeError& e) {
    throw DecodeError(std::string("invalid header: ") + e.what());
  }
}

bool SameMajor(const std::string& version, const std::string& ours) {
  int major = MajorOf(version);
  return major >= 0 && major == MajorOf(ours);
}

Value DecodeContent(const Header& header, const std::string& content_bytes, std::size_t max_frame_bytes) {
  if (!SameMajor(header.protocol_version, kProtocolVersion)) {  // before the type (spec 2, check 4)
    throw ProtocolError(ErrorCode::kUnsupportedVersion,
                        "protocol_version " + header.protocol_version + " (supported: " + kProtocolVersion + ")");
  }
  const MessageTypeInfo* info = FindMessageType(header.type);
  if (info == nullptr) throw ProtocolError(ErrorCode::kUnknownType, "unknown message type '" + header.type + "'");
  if (info->requires_session && !header.session_id) {
    throw DecodeError(header.type + " requires header.session_id");
  }
  Value raw = DecodeFrame(content_bytes, max_frame_bytes, "content");
  if (!raw.is_map()) throw DecodeError(std::string("content is a ") + Value::KindName(raw.kind()) + ", not a map");
  info->canonicalize(raw);  // validates; throws DecodeError
  return raw;
}

Envelope UnpackFrames(const std::string& key, const std::vector<std::string>& frames, std::size_t max_frame_bytes) {
  CheckFrames(key, frames);
  Envelope env;
  env.header = DecodeHeader(frames[2], max_frame_bytes);
  env.content = DecodeContent(env.header, frames[3], max_frame_bytes);
  return env;
}

}  // namespace igi
