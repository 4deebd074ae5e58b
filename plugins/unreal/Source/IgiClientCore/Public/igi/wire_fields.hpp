// igi/wire_fields.hpp - IgiClientCore, messages layer: field visitors that map C++ structs to wire maps.
//
// Every wire struct lists its fields once, in spec order, in `template <class V> void Visit(V& v)`:
//   v.Req("name", field, rule)   key must be present (the value may be nil when `field` is std::optional)
//   v.Def("name", field, rule)   key may be missing; the C++ default then stays
// FieldWriter turns a struct into a canonical ValueMap (every key written, nil for empty optionals);
// FieldReader fills a struct from a decoded map, ignoring unknown keys and throwing DecodeError (code
// invalid_request) for a missing required key, a wrong type or a value outside its Rule; a struct with a
// `void Check(const std::string& path) const` member has it run after its fields (rules across fields).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "igi/errors.hpp"
#include "igi/value.hpp"

namespace igi {

/// Named counters (status_reply.counters), kept sorted by key.
using CounterMap = std::vector<std::pair<std::string, std::int64_t>>;

/// Constraints of one field, checked by FieldReader (ignored by FieldWriter).
struct Rule {
  enum class Pattern { kNone, kMsgId, kSessionId, kVersion, kFinishReason, kToolName, kImageFormat };
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  std::size_t max_len = (std::numeric_limits<std::size_t>::max)();  ///< str: code points; array: items
  std::size_t min_len = 0;
  Pattern pattern = Pattern::kNone;
};

namespace rules {
inline constexpr Rule kAny{};
inline constexpr Rule kNonNeg{0.0};                           ///< U63 / NonNegF64
inline constexpr Rule kU32{0.0, 4294967295.0};
inline constexpr Rule kPositive{1.0};                         ///< U63 with ge=1
inline constexpr Rule kPriority{-100.0, 100.0};
inline constexpr Rule kMsgId{-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                             false, 32, 32, Rule::Pattern::kMsgId};
inline constexpr Rule kSessionId{-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                                 false, 64, 1, Rule::Pattern::kSessionId};
inline constexpr Rule kVersion{-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                               false, 9, 3, Rule::Pattern::kVersion};
inline constexpr Rule kFinishReason{-std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::infinity(), false,
                                    (std::numeric_limits<std::size_t>::max)(), 0, Rule::Pattern::kFinishReason};
/// 1.1: a tool name, 1-64 of [A-Za-z0-9_-], not starting with a digit or '-'.
inline constexpr Rule kToolName{-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(),
                                false, 64, 1, Rule::Pattern::kToolName};
/// 1.1: a tool call id, 1-64 of [A-Za-z0-9_-] (the session id's form).
inline constexpr Rule kToolCallId = kSessionId;
constexpr Rule Text(std::size_t min_len, std::size_t max_len) {
  Rule r;
  r.min_len = min_len;
  r.max_len = max_len;
  return r;
}
inline constexpr Rule kImageFormat{-std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::infinity(), false,
                                   (std::numeric_limits<std::size_t>::max)(), 0, Rule::Pattern::kImageFormat};
constexpr Rule MinLen(std::size_t n) {
  Rule r;
  r.min_len = n;
  return r;
}
constexpr Rule MaxLen(std::size_t n) {
  Rule r;
  r.max_len = n;
  return r;
}
constexpr Rule Range(double lo, double hi) {
  Rule r;
  r.min = lo;
  r.max = hi;
  return r;
}
}  // namespace rules

struct FieldWriter;

/// Has a `Visit` member template: a nested wire struct.
template <class T, class = void>
struct IsWireStruct : std::false_type {};
template <class T>
struct IsWireStruct<T, std::void_t<decltype(std::declval<T&>().Visit(std::declval<FieldWriter&>()))>>
    : std::true_type {};

// ---- writing -------------------------------------------------------------------------------------
Value ToWire(const std::string& x);
Value ToWire(std::int64_t x);
Value ToWire(double x);
Value ToWire(bool x);
Value ToWire(const Value& x);
Value ToWire(const std::vector<std::string>& x);
Value ToWire(const std::vector<std::int64_t>& x);
Value ToWire(const Bytes& x);
Value ToWire(const CounterMap& x);
Value ToWire(ErrorCode x);
template <class T>
Value ToWire(const std::optional<T>& x);
template <class T, std::enable_if_t<IsWireStruct<T>::value, int> = 0>
Value ToWire(const T& x);
template <class T, std::enable_if_t<IsWireStruct<T>::value, int> = 0>
Value ToWire(const std::vector<T>& x);

/// Collects a struct's fields into a ValueMap in declaration order.
struct FieldWriter {
  ValueMap map;
  template <class T>
  void Req(const char* key, const T& field, const Rule& = rules::kAny) {
    map.emplace_back(key, ToWire(field));
  }
  template <class T>
  void Def(const char* key, const T& field, const Rule& = rules::kAny) {
    map.emplace_back(key, ToWire(field));
  }
};

template <class T>
Value ToWire(const std::optional<T>& x) {
  return x ? ToWire(*x) : Value();
}

template <class T, std::enable_if_t<IsWireStruct<T>::value, int>>
Value ToWire(const T& x) {
  FieldWriter w;
  const_cast<T&>(x).Visit(w);  // Visit only reads through a FieldWriter
  return Value(std::move(w.map));
}

template <class T, std::enable_if_t<IsWireStruct<T>::value, int>>
Value ToWire(const std::vector<T>& x) {
  ValueArray items;
  for (const T& item : x) items.push_back(ToWire(item));
  return Value(std::move(items));
}

/// Deepest nesting accepted inside a free-form map (error_reply.detail).
inline constexpr std::size_t kMaxTreeDepth = 8;

/// Checks a free-form value and returns it with every map's keys sorted by UTF-8 bytes (canonical).
Value CanonicalTree(const Value& v, std::size_t depth, const std::string& path);

// ---- reading -------------------------------------------------------------------------------------
void FromWire(const Value& v, std::string& x, const std::string& path);
void FromWire(const Value& v, std::int64_t& x, const std::string& path);
void FromWire(const Value& v, double& x, const std::string& path);
void FromWire(const Value& v, bool& x, const std::string& path);
void FromWire(const Value& v, Value& x, const std::string& path);
void FromWire(const Value& v, std::vector<std::string>& x, const std::string& path);
void FromWire(const Value& v, std::vector<std::int64_t>& x, const std::string& path);
void FromWire(const Value& v, Bytes& x, const std::string& path);
void FromWire(const Value& v, CounterMap& x, const std::string& path);
/// Unknown code strings become ErrorCode::kInternal (spec 5.7).
void FromWire(const Value& v, ErrorCode& x, const std::string& path);
template <class T>
void FromWire(const Value& v, std::optional<T>& x, const std::string& path);
template <class T, std::enable_if_t<IsWireStruct<T>::value, int> = 0>
void FromWire(const Value& v, T& x, const std::string& path);
template <class T, std::enable_if_t<IsWireStruct<T>::value, int> = 0>
void FromWire(const Value& v, std::vector<T>& x, const std::string& path);

void CheckRule(const std::string& x, const Rule& rule, const std::string& path);
void CheckRule(std::int64_t x, const Rule& rule, const std::string& path);
void CheckRule(double x, const Rule& rule, const std::string& path);
void CheckRule(const std::vector<std::string>& x, const Rule& rule, const std::string& path);
/// max_len: items; min / max: each item.
void CheckRule(const std::vector<std::int64_t>& x, const Rule& rule, const std::string& path);
void CheckRule(const Bytes& x, const Rule& rule, const std::string& path);  ///< min_len / max_len in bytes
template <class T>
void CheckRule(const T&, const Rule&, const std::string&) {}
template <class T, std::enable_if_t<IsWireStruct<T>::value, int> = 0>
void CheckRule(const std::vector<T>& x, const Rule& rule, const std::string& path) {
  if (x.size() > rule.max_len) throw DecodeError(path + ": more than " + std::to_string(rule.max_len) + " items");
}
template <class T>
void CheckRule(const std::optional<T>& x, const Rule& rule, const std::string& path) {
  if (x) CheckRule(*x, rule, path);
}

/// Fills a struct from a decoded map; unknown keys are ignored.
struct FieldReader {
  const Value& map;
  std::string prefix;  ///< "field." path for error messages

  template <class T>
  void Req(const char* key, T& field, const Rule& rule = rules::kAny) {
    const Value* v = map.Find(key);
    if (v == nullptr) throw DecodeError(prefix + key + ": field required");
    Read(*v, key, field, rule);
  }
  template <class T>
  void Def(const char* key, T& field, const Rule& rule = rules::kAny) {
    const Value* v = map.Find(key);
    if (v != nullptr) Read(*v, key, field, rule);
  }

 private:
  template <class T>
  void Read(const Value& v, const char* key, T& field, const Rule& rule) {
    std::string path = prefix + key;
    FromWire(v, field, path);
    CheckRule(field, rule, path);
  }
};

template <class T>
void FromWire(const Value& v, std::optional<T>& x, const std::string& path) {
  if (v.is_nil()) {
    x.reset();
    return;
  }
  T inner{};
  FromWire(v, inner, path);
  x = std::move(inner);
}

/// Has a `void Check(const std::string& path) const` member: rules across its fields, run after its fields are read.
template <class T, class = void>
struct HasCrossFieldCheck : std::false_type {};
template <class T>
struct HasCrossFieldCheck<T, std::void_t<decltype(std::declval<const T&>().Check(std::declval<const std::string&>()))>>
    : std::true_type {};

template <class T, std::enable_if_t<IsWireStruct<T>::value, int>>
void FromWire(const Value& v, T& x, const std::string& path) {
  if (!v.is_map()) throw DecodeError(path + ": expected a map, got " + Value::KindName(v.kind()));
  FieldReader r{v, path.empty() ? std::string() : path + "."};
  x.Visit(r);
  if constexpr (HasCrossFieldCheck<T>::value) x.Check(path);
}

template <class T, std::enable_if_t<IsWireStruct<T>::value, int>>
void FromWire(const Value& v, std::vector<T>& x, const std::string& path) {
  if (!v.is_array()) throw DecodeError(path + ": expected an array, got " + Value::KindName(v.kind()));
  x.clear();
  for (std::size_t i = 0; i < v.as_array().size(); ++i) {
    T item{};
    FromWire(v.as_array()[i], item, path + "[" + std::to_string(i) + "]");
    x.push_back(std::move(item));
  }
}

/// Encodes a wire struct as its canonical map.
template <class T>
Value StructToValue(const T& x) {
  return ToWire(x);
}

/// Decodes a wire struct from a map (unknown keys ignored); throws DecodeError.
template <class T>
T StructFromValue(const Value& v) {
  T x{};
  FromWire(v, x, "");
  return x;
}

}  // namespace igi
