// value.cpp - IgiClientCore, codec layer: Value equality, lookup and rendering.
#include "igi/value.hpp"

#include <cstdio>

namespace igi {

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::Map) return nullptr;
  for (const auto& [k, v] : map_) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::operator==(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::Nil: return true;
    case Kind::Bool:
    case Kind::Int:
    case Kind::UInt: return int_ == other.int_;
    case Kind::Float: return float_ == other.float_;
    case Kind::Str: return str_ == other.str_;
    case Kind::Bin: return bin_ == other.bin_;
    case Kind::Array: return array_ == other.array_;
    case Kind::Map: return map_ == other.map_;
  }
  return false;
}

const char* Value::KindName(Kind kind) {
  switch (kind) {
    case Kind::Nil: return "nil";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::UInt: return "uint";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bin: return "bin";
    case Kind::Array: return "array";
    case Kind::Map: return "map";
  }
  return "?";
}

namespace {

void AppendQuoted(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

void Render(const Value& v, std::string& out) {
  char buf[64];
  switch (v.kind()) {
    case Value::Kind::Nil: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int:
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v.as_int()));
      out += buf;
      return;
    case Value::Kind::UInt:
      std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(v.as_uint()));
      out += buf;
      return;
    case Value::Kind::Float:
      std::snprintf(buf, sizeof buf, "%.17g", v.as_float());
      out += buf;
      return;
    case Value::Kind::Str: AppendQuoted(v.as_str(), out); return;
    case Value::Kind::Bin:
      out += "bin(";
      for (std::uint8_t b : v.as_bin()) {
        std::snprintf(buf, sizeof buf, "%02x", b);
        out += buf;
      }
      out += ")";
      return;
    case Value::Kind::Array: {
      out += '[';
      bool first = true;
      for (const Value& item : v.as_array()) {
        if (!first) out += ", ";
        first = false;
        Render(item, out);
      }
      out += ']';
      return;
    }
    case Value::Kind::Map: {
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.as_map()) {
        if (!first) out += ", ";
        first = false;
        AppendQuoted(k, out);
        out += ": ";
        Render(item, out);
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string Value::ToString() const {
  std::string out;
  Render(*this, out);
  return out;
}

}  // namespace igi
