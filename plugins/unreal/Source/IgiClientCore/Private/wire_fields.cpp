// wire_fields.cpp - IgiClientCore, messages layer: scalar ToWire/FromWire and field rule checks.
#include "igi/wire_fields.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace igi {

Value ToWire(const std::string& x) { return Value(x); }
Value ToWire(std::int64_t x) { return Value(static_cast<long long>(x)); }
Value ToWire(double x) { return Value(x); }
Value ToWire(bool x) { return Value(x); }
Value ToWire(const Value& x) { return x.is_map() ? CanonicalTree(x, 0, "map") : x; }

Value ToWire(const std::vector<std::string>& x) {
  ValueArray a;
  a.reserve(x.size());
  for (const std::string& s : x) a.emplace_back(s);
  return Value(std::move(a));
}

Value ToWire(const std::vector<std::int64_t>& x) {
  ValueArray a;
  a.reserve(x.size());
  for (std::int64_t n : x) a.emplace_back(static_cast<long long>(n));
  return Value(std::move(a));
}

Value ToWire(const Bytes& x) { return Value(x); }

Value ToWire(const CounterMap& x) {
  CounterMap sorted = x;
  std::sort(sorted.begin(), sorted.end());  // canonical: keys sorted by UTF-8 bytes
  ValueMap m;
  for (const auto& [k, n] : sorted) m.emplace_back(k, Value(static_cast<long long>(n)));
  return Value(std::move(m));
}

Value ToWire(ErrorCode x) { return Value(ErrorCodeName(x)); }

namespace {

[[noreturn]] void WrongType(const std::string& path, const char* expected, const Value& v) {
  throw DecodeError(path + ": expected " + expected + ", got " + Value::KindName(v.kind()));
}

std::string Num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::size_t CodePoints(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

bool AllOf(const std::string& s, bool (*ok)(char)) { return std::all_of(s.begin(), s.end(), ok); }
bool IsLowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool IsIdChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-';
}

bool IsVersion(const std::string& s) {
  std::size_t dot = s.find('.');
  if (dot == std::string::npos || dot == 0 || dot > 4) return false;
  std::string major = s.substr(0, dot), minor = s.substr(dot + 1);
  auto digits = [](const std::string& p) {
    return !p.empty() && p.size() <= 4 && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return digits(major) && digits(minor);
}

}  // namespace

void FromWire(const Value& v, std::string& x, const std::string& path) {
  if (!v.is_str()) WrongType(path, "str", v);
  x = v.as_str();
}

void FromWire(const Value& v, Bytes& x, const std::string& path) {
  if (!v.is_bin()) WrongType(path, "bin", v);
  x = v.as_bin();
}

void CheckRule(const Bytes& x, const Rule& rule, const std::string& path) {
  if (x.size() > rule.max_len) throw DecodeError(path + ": longer than " + std::to_string(rule.max_len) + " bytes");
  if (x.size() < rule.min_len) throw DecodeError(path + ": shorter than " + std::to_string(rule.min_len) + " bytes");
}

void FromWire(const Value& v, std::int64_t& x, const std::string& path) {
  if (v.kind() == Value::Kind::UInt) throw DecodeError(path + ": integer does not fit int64");
  if (v.kind() != Value::Kind::Int) WrongType(path, "int", v);
  x = v.as_int();
}

void FromWire(const Value& v, double& x, const std::string& path) {
  if (v.is_float()) {
    x = v.as_float();
  } else if (v.kind() == Value::Kind::Int) {
    x = static_cast<double>(v.as_int());  // an integer for a float field is converted (spec)
  } else {
    WrongType(path, "float", v);
  }
  if (!std::isfinite(x)) throw DecodeError(path + ": floats must be finite");
}

void FromWire(const Value& v, bool& x, const std::string& path) {
  if (!v.is_bool()) WrongType(path, "bool", v);
  x = v.as_bool();
}

Value CanonicalTree(const Value& v, std::size_t depth, const std::string& path) {
  if (depth > kMaxTreeDepth) throw DecodeError(path + ": free-form value nested too deep");
  switch (v.kind()) {
    case Value::Kind::UInt: throw DecodeError(path + ": integer does not fit int64");
    case Value::Kind::Bin: throw DecodeError(path + ": bin is not allowed in a free-form map");
    case Value::Kind::Float:
      if (!std::isfinite(v.as_float())) throw DecodeError(path + ": floats must be finite");
      return v;
    case Value::Kind::Array: {
      ValueArray a;
      for (const Value& item : v.as_array()) a.push_back(CanonicalTree(item, depth + 1, path));
      return Value(std::move(a));
    }
    case Value::Kind::Map: {
      ValueMap m;
      for (const auto& [k, item] : v.as_map()) m.emplace_back(k, CanonicalTree(item, depth + 1, path + "." + k));
      std::sort(m.begin(), m.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      return Value(std::move(m));
    }
    default: return v;
  }
}

void FromWire(const Value& v, Value& x, const std::string& path) {
  if (!v.is_map() && !v.is_nil()) WrongType(path, "map or nil", v);
  x = CanonicalTree(v, 0, path);
}

void FromWire(const Value& v, std::vector<std::string>& x, const std::string& path) {
  if (!v.is_array()) WrongType(path, "array", v);
  x.clear();
  for (std::size_t i = 0; i < v.as_array().size(); ++i) {
    std::string item;
    FromWire(v.as_array()[i], item, path + "[" + std::to_string(i) + "]");
    x.push_back(std::move(item));
  }
}

void FromWire(const Value& v, std::vector<std::int64_t>& x, const std::string& path) {
  if (!v.is_array()) WrongType(path, "array", v);
  x.clear();
  for (std::size_t i = 0; i < v.as_array().size(); ++i) {
    std::int64_t item = 0;
    FromWire(v.as_array()[i], item, path + "[" + std::to_string(i) + "]");
    x.push_back(item);
  }
}

void FromWire(const Value& v, CounterMap& x, const std::string& path) {
  if (!v.is_map()) WrongType(path, "map", v);
  x.clear();
  for (const auto& [k, item] : v.as_map()) {
    std::int64_t n = 0;
    FromWire(item, n, path + "." + k);
    if (n < 0) throw DecodeError(path + "." + k + ": counter must be >= 0");
    x.emplace_back(k, n);
  }
  std::sort(x.begin(), x.end());
}

void FromWire(const Value& v, ErrorCode& x, const std::string& path) {
  if (!v.is_str()) WrongType(path, "str", v);
  x = ParseErrorCode(v.as_str());
}

void CheckRule(double x, const Rule& rule, const std::string& path) {
  if (rule.min_exclusive ? !(x > rule.min) : !(x >= rule.min)) {
    throw DecodeError(path + ": must be " + (rule.min_exclusive ? "> " : ">= ") + Num(rule.min));
  }
  if (!(x <= rule.max)) throw DecodeError(path + ": must be <= " + Num(rule.max));
}

void CheckRule(std::int64_t x, const Rule& rule, const std::string& path) {
  CheckRule(static_cast<double>(x), rule, path);
}

void CheckRule(const std::string& x, const Rule& rule, const std::string& path) {
  std::size_t n = CodePoints(x);
  if (n > rule.max_len) throw DecodeError(path + ": longer than " + std::to_string(rule.max_len) + " characters");
  if (n < rule.min_len) throw DecodeError(path + ": shorter than " + std::to_string(rule.min_len) + " characters");
  bool ok = true;
  switch (rule.pattern) {
    case Rule::Pattern::kNone: break;
    case Rule::Pattern::kMsgId: ok = x.size() == 32 && AllOf(x, IsLowerHex); break;
    case Rule::Pattern::kSessionId: ok = AllOf(x, IsIdChar); break;
    case Rule::Pattern::kVersion: ok = IsVersion(x); break;
    case Rule::Pattern::kImageFormat: ok = x == "png" || x == "jpeg" || x == "rgb8" || x == "rgba8"; break;
    case Rule::Pattern::kFinishReason:
      ok = x == "stop" || x == "length" || x == "cancelled" || x == "error" || x == "tool_call";
      break;
    case Rule::Pattern::kToolName:
      ok = AllOf(x, IsIdChar) && !(x[0] >= '0' && x[0] <= '9') && x[0] != '-';
      break;
  }
  if (!ok) throw DecodeError(path + ": '" + x + "' does not match the required pattern");
}

void CheckRule(const std::vector<std::string>& x, const Rule& rule, const std::string& path) {
  if (x.size() > rule.max_len) throw DecodeError(path + ": more than " + std::to_string(rule.max_len) + " items");
}

void CheckRule(const std::vector<std::int64_t>& x, const Rule& rule, const std::string& path) {
  if (x.size() > rule.max_len) throw DecodeError(path + ": more than " + std::to_string(rule.max_len) + " items");
  for (std::size_t i = 0; i < x.size(); ++i) CheckRule(x[i], rule, path + "[" + std::to_string(i) + "]");
}

}  // namespace igi
