// image.cpp - IgiClientCore: Image constructors and pixel conversions.
#include "igi/image.hpp"

#include <stdexcept>
#include <utility>

namespace igi {

namespace {
Bytes NonEmpty(Bytes b) {
  if (b.empty()) throw std::invalid_argument("image data is empty");
  return b;
}
}  // namespace

Image Image::Png(Bytes bytes) { return Image{"png", NonEmpty(std::move(bytes)), std::nullopt, std::nullopt}; }

Image Image::Jpeg(Bytes bytes) { return Image{"jpeg", NonEmpty(std::move(bytes)), std::nullopt, std::nullopt}; }

Image Image::Raw(Bytes pixels, std::int64_t width, std::int64_t height, bool alpha) {
  const std::int64_t channels = alpha ? 4 : 3;
  if (width < 1 || height < 1) throw std::invalid_argument("width and height must be >= 1");
  if (static_cast<std::int64_t>(pixels.size()) != width * height * channels)
    throw std::invalid_argument("pixels hold " + std::to_string(pixels.size()) + " bytes, not " +
                                std::to_string(width) + "x" + std::to_string(height) + "x" + std::to_string(channels));
  return Image{alpha ? "rgba8" : "rgb8", std::move(pixels), width, height};
}

Bytes BgraToRgb(const std::uint8_t* bgra, std::int64_t width, std::int64_t height, bool flip_rows) {
  if (bgra == nullptr || width < 1 || height < 1) throw std::invalid_argument("no pixels");
  Bytes rgb(static_cast<std::size_t>(width * height * 3));
  for (std::int64_t y = 0; y < height; ++y) {
    const std::uint8_t* row = bgra + (flip_rows ? height - 1 - y : y) * width * 4;
    std::uint8_t* out = rgb.data() + y * width * 3;
    for (std::int64_t x = 0; x < width; ++x) {
      out[3 * x] = row[4 * x + 2];
      out[3 * x + 1] = row[4 * x + 1];
      out[3 * x + 2] = row[4 * x];
    }
  }
  return rgb;
}

}  // namespace igi
