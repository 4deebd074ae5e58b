// signing.cpp - IgiClientCore, codec layer: HMAC-SHA256 through OpenSSL's one-shot HMAC().
//
// HMAC() exists unchanged in OpenSSL 1.1.1 (what Unreal Engine 5 ships) and 3.x (Debian 12).
#include "igi/signing.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "igi/errors.hpp"

namespace igi {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string HexEncode(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    out += kHexDigits[c >> 4];
    out += kHexDigits[c & 0x0f];
  }
  return out;
}

std::string HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) throw ConnectionFileError("hex string has an odd number of digits");
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    int hi = HexValue(hex[i]);
    int lo = HexValue(hex[i + 1]);
    if (hi < 0 || lo < 0) throw ConnectionFileError("hex string contains a non-hex digit");
    out += static_cast<char>((hi << 4) | lo);
  }
  return out;
}

std::string SignHex(std::string_view key, std::string_view header, std::string_view content) {
  std::string message;
  message.reserve(header.size() + content.size());
  message.append(header);
  message.append(content);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  const unsigned char* digest =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &out_len);
  if (digest == nullptr) throw IgiError("OpenSSL: HMAC-SHA256 failed");
  return HexEncode(std::string_view(reinterpret_cast<const char*>(out), out_len));
}

bool VerifyHex(std::string_view key, std::string_view signature, std::string_view header,
               std::string_view content) {
  std::string expected = SignHex(key, header, content);
  if (signature.size() != expected.size()) return false;
  return CRYPTO_memcmp(expected.data(), signature.data(), expected.size()) == 0;
}

}  // namespace igi
