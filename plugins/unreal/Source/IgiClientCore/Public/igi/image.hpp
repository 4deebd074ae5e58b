// igi/image.hpp - IgiClientCore, messages layer: the image a generate_request may carry (protocol 1.1), and the
// pixel conversions a capture needs (Unreal-independent, tested in igi_tests).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "igi/value.hpp"
#include "igi/wire_fields.hpp"

namespace igi {

/// Longest side the daemon accepts, pixels; most pixels (a 4K frame).
inline constexpr std::int64_t kMaxImageSidePx = 4096;
inline constexpr std::int64_t kMaxImagePixels = 4096LL * 2304LL;

/// An image attached to a player's line: PNG/JPEG bytes, or raw RGB8/RGBA8 pixels (row-major, top row first) with
/// width and height. The daemon checks the bytes against the format and the limits before decoding; the message
/// must fit its max_frame_bytes (1 MiB by default): send JPEG, or downscale.
struct Image {
  std::string format = "png";  ///< "png", "jpeg", "rgb8" or "rgba8"
  Bytes data;
  std::optional<std::int64_t> width;   ///< required for raw formats
  std::optional<std::int64_t> height;  ///< required for raw formats

  template <class V>
  void Visit(V& v) {
    v.Req("format", format, rules::kImageFormat);
    v.Req("data", data, rules::MinLen(1));
    v.Def("width", width, rules::Range(1.0, 2147483647.0));
    v.Def("height", height, rules::Range(1.0, 2147483647.0));
  }

  static Image Png(Bytes bytes);
  static Image Jpeg(Bytes bytes);
  /// Raw pixels, top row first; throws std::invalid_argument when the size does not match.
  static Image Raw(Bytes pixels, std::int64_t width, std::int64_t height, bool alpha);
};

/// BGRA8 pixels (Unreal's FColor order) to RGB8, rows optionally flipped (bottom-up sources).
Bytes BgraToRgb(const std::uint8_t* bgra, std::int64_t width, std::int64_t height, bool flip_rows = false);

}  // namespace igi
