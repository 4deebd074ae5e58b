// igi/signing.hpp - IgiClientCore, codec layer: HMAC-SHA256 message signatures (OpenSSL libcrypto).
//
// The signature frame is the lowercase hex HMAC-SHA256, keyed with the per-launch key, over the raw
// bytes of the header frame followed by the content frame.
#pragma once

#include <string>
#include <string_view>

namespace igi {

/// Lowercase hex HMAC-SHA256 of `header || content` under `key` (64 ASCII characters).
std::string SignHex(std::string_view key, std::string_view header, std::string_view content);

/// Constant-time check of a received signature frame; false for wrong length or case.
bool VerifyHex(std::string_view key, std::string_view signature, std::string_view header,
               std::string_view content);

/// Decodes a hex string (either case) into raw bytes; throws igi::ConnectionFileError on bad hex.
std::string HexDecode(std::string_view hex);

/// Lowercase hex of raw bytes.
std::string HexEncode(std::string_view raw);

}  // namespace igi
