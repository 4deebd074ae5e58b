// igi/value.hpp - IgiClientCore, codec layer: the msgpack data model as one C++ value type.
//
// A Value is what one msgpack object decodes to: nil, bool, int (int64 or a uint64 above
// INT64_MAX), float64, str, bin, array, or a map with str keys kept in wire order (the
// protocol's canonical encoding writes map keys in spec order, so order is data here).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace igi {

class Value;
using Bytes = std::vector<std::uint8_t>;
using ValueArray = std::vector<Value>;
/// A msgpack map with str keys, in wire order.
using ValueMap = std::vector<std::pair<std::string, Value>>;

/// One msgpack object.
class Value {
 public:
  enum class Kind { Nil, Bool, Int, UInt, Float, Str, Bin, Array, Map };

  Value() = default;  // nil
  Value(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): nil literal
  Value(bool b) : kind_(Kind::Bool), int_(b ? 1 : 0) {}  // NOLINT
  Value(int v) : kind_(Kind::Int), int_(v) {}  // NOLINT
  Value(long v) : kind_(Kind::Int), int_(v) {}  // NOLINT
  Value(long long v) : kind_(Kind::Int), int_(v) {}  // NOLINT
  Value(unsigned v) : kind_(Kind::Int), int_(v) {}  // NOLINT
  Value(unsigned long v) { SetUnsigned(v); }  // NOLINT
  Value(unsigned long long v) { SetUnsigned(v); }  // NOLINT
  Value(double v) : kind_(Kind::Float), float_(v) {}  // NOLINT
  Value(const char* s) : kind_(Kind::Str), str_(s) {}  // NOLINT
  Value(std::string s) : kind_(Kind::Str), str_(std::move(s)) {}  // NOLINT
  Value(std::string_view s) : kind_(Kind::Str), str_(s) {}  // NOLINT
  Value(Bytes b) : kind_(Kind::Bin), bin_(std::move(b)) {}  // NOLINT
  Value(ValueArray a) : kind_(Kind::Array), array_(std::move(a)) {}  // NOLINT
  Value(ValueMap m) : kind_(Kind::Map), map_(std::move(m)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_nil() const { return kind_ == Kind::Nil; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  /// True for Int and UInt.
  bool is_integer() const { return kind_ == Kind::Int || kind_ == Kind::UInt; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_str() const { return kind_ == Kind::Str; }
  bool is_bin() const { return kind_ == Kind::Bin; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_map() const { return kind_ == Kind::Map; }

  bool as_bool() const { return int_ != 0; }
  /// The integer as int64 (only valid for Kind::Int).
  std::int64_t as_int() const { return int_; }
  /// The integer as uint64 (valid for Kind::UInt and non-negative Kind::Int).
  std::uint64_t as_uint() const { return static_cast<std::uint64_t>(int_); }
  double as_float() const { return float_; }
  const std::string& as_str() const { return str_; }
  const Bytes& as_bin() const { return bin_; }
  const ValueArray& as_array() const { return array_; }
  ValueArray& as_array() { return array_; }
  const ValueMap& as_map() const { return map_; }
  ValueMap& as_map() { return map_; }

  /// The map entry named `key`, or nullptr (also when this is not a map).
  const Value* Find(std::string_view key) const;

  /// Deep equality; map key order matters, floats compare by value, Int 1 != Float 1.0.
  bool operator==(const Value& other) const;
  bool operator!=(const Value& other) const { return !(*this == other); }

  /// Human-readable JSON-like rendering, for test diagnostics and logs.
  std::string ToString() const;

  /// Short name of a kind ("nil", "int", "str", ...), for error messages.
  static const char* KindName(Kind kind);

 private:
  void SetUnsigned(unsigned long long v) {
    if (v > static_cast<unsigned long long>(INT64_MAX)) {
      kind_ = Kind::UInt;
    } else {
      kind_ = Kind::Int;
    }
    int_ = static_cast<std::int64_t>(v);
  }

  Kind kind_ = Kind::Nil;
  std::int64_t int_ = 0;
  double float_ = 0.0;
  std::string str_;
  Bytes bin_;
  ValueArray array_;
  ValueMap map_;
};

}  // namespace igi
