// igi/msgpack.hpp - IgiClientCore, codec layer: canonical msgpack encoder and strict decoder.
//
// Canonical form (ipc/PROTOCOL.md): integers in the smallest msgpack form, floats always float64,
// text as str, bytes as bin, maps written in the order they are held. The decoder accepts any
// valid msgpack for the supported types (so float32 and wide int forms decode), rejects ext types,
// non-str map keys, invalid UTF-8, truncation, trailing bytes and nesting deeper than a limit.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "igi/value.hpp"

namespace igi {

/// Limits the decoder enforces on untrusted input.
struct DecodeLimits {
  std::size_t max_depth = 32;               ///< nesting of arrays/maps
  std::size_t max_input_bytes = 64u << 20;  ///< whole buffer
};

/// Appends the canonical msgpack encoding of `value` to `out`.
void EncodeTo(const Value& value, std::string& out);

/// The canonical msgpack encoding of `value`.
std::string Encode(const Value& value);

/// Decodes exactly one msgpack object spanning all of `data`.
///
/// Throws igi::DecodeError on malformed input, unsupported types or trailing bytes.
Value Decode(std::string_view data, const DecodeLimits& limits = {});

}  // namespace igi
