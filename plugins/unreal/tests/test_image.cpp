// test_image.cpp - IgiClientCore tests: the Image wire value (protocol 1.1) and the capture pixel conversions.
#include <stdexcept>
#include <string>
#include <vector>

#include "igi/image.hpp"
#include "test_framework.hpp"

TEST(image_round_trips_and_refuses_wrong_types) {
  igi::Image png = igi::Image::Png(igi::Bytes{0x89, 'P', 'N', 'G'});
  igi::Value v = igi::StructToValue(png);
  const igi::ValueMap& m = v.as_map();
  CHECK_EQ(m[0].first, std::string("format"));
  CHECK(m[1].second.is_bin());
  CHECK(m[2].second.is_nil() && m[3].second.is_nil());
  igi::Image back = igi::StructFromValue<igi::Image>(v);
  CHECK_EQ(back.format, std::string("png"));
  CHECK_EQ(back.data.size(), 4u);
  // data must be bin, format one of four, sizes positive, data non-empty
  CHECK_THROWS_AS(igi::StructFromValue<igi::Image>(igi::Value(igi::ValueMap{{"format", "png"}, {"data", "text"}})),
                  igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Image>(
                      igi::Value(igi::ValueMap{{"format", "gif"}, {"data", igi::Value(igi::Bytes{1})}})),
                  igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Image>(
                      igi::Value(igi::ValueMap{{"format", "rgb8"}, {"data", igi::Value(igi::Bytes{})}})),
                  igi::DecodeError);
  CHECK_THROWS_AS(igi::StructFromValue<igi::Image>(igi::Value(igi::ValueMap{
                      {"format", "rgb8"}, {"data", igi::Value(igi::Bytes{1, 2, 3})}, {"width", 0}, {"height", 1}})),
                  igi::DecodeError);
  CHECK_THROWS_AS(igi::Image::Raw(igi::Bytes(11), 2, 2, false), std::invalid_argument);
  CHECK_EQ(igi::Image::Raw(igi::Bytes(16), 2, 2, true).format, std::string("rgba8"));
}

TEST(bgra_to_rgb_reorders_channels_and_flips_rows) {
  // 1x2 image: top pixel BGRA (1,2,3,9), bottom (4,5,6,9)
  const std::vector<std::uint8_t> bgra{1, 2, 3, 9, 4, 5, 6, 9};
  igi::Bytes rgb = igi::BgraToRgb(bgra.data(), 1, 2);
  CHECK(rgb == (igi::Bytes{3, 2, 1, 6, 5, 4}));
  igi::Bytes flipped = igi::BgraToRgb(bgra.data(), 1, 2, true);
  CHECK(flipped == (igi::Bytes{6, 5, 4, 3, 2, 1}));
}
