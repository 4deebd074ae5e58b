// connection_file.cpp - IgiClientCore, transport layer: connection file reading and a tiny JSON parser.
#include "igi/connection_file.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "igi/errors.hpp"
#include "igi/signing.hpp"

#if !defined(_WIN32)
#include <sys/stat.h>
#endif

namespace igi {
namespace {

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  Value ParseDocument() {
    Value v = ParseValue(0);
    SkipSpace();
    if (pos_ != s_.size()) Fail("trailing characters after JSON value");
    return v;
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    throw ConnectionFileError("invalid JSON at offset " + std::to_string(pos_) + ": " + what);
  }

  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  bool Consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Value ParseValue(int depth) {
    if (depth > 32) Fail("nested too deep");
    SkipSpace();
    if (pos_ >= s_.size()) Fail("unexpected end");
    char c = s_[pos_];
    if (c == '{') return ParseObject(depth);
    if (c == '[') return ParseArray(depth);
    if (c == '"') return Value(ParseString());
    if (Consume("true")) return Value(true);
    if (Consume("false")) return Value(false);
    if (Consume("null")) return Value();
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber();
    Fail(std::string("unexpected character '") + c + "'");
  }

  Value ParseObject(int depth) {
    ++pos_;  // {
    ValueMap m;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return Value(std::move(m));
    }
    for (;;) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') Fail("expected a string key");
      std::string key = ParseString();
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') Fail("expected ':'");
      ++pos_;
      Value item = ParseValue(depth + 1);
      bool replaced = false;
      for (auto& entry : m) {
        if (entry.first == key) {
          entry.second = item;
          replaced = true;
        }
      }
      if (!replaced) m.emplace_back(std::move(key), std::move(item));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return Value(std::move(m));
      }
      Fail("expected ',' or '}'");
    }
  }

  Value ParseArray(int depth) {
    ++pos_;  // [
    ValueArray a;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return Value(std::move(a));
    }
    for (;;) {
      a.push_back(ParseValue(depth + 1));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return Value(std::move(a));
      }
      Fail("expected ',' or ']'");
    }
  }

  static void AppendUtf8(std::uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::uint32_t ParseHex4() {
    if (pos_ + 4 > s_.size()) Fail("truncated \\u escape");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
      else Fail("bad \\u escape");
    }
    return v;
  }

  std::string ParseString() {
    ++pos_;  // "
    std::string out;
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) Fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = ParseHex4();
          if (cp >= 0xd800 && cp <= 0xdbff && Consume("\\u")) {
            std::uint32_t lo = ParseHex4();
            if (lo < 0xdc00 || lo > 0xdfff) Fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xd800 && cp <= 0xdfff) {
            Fail("lone surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default: Fail("bad escape");
      }
    }
    Fail("unterminated string");
  }

  Value ParseNumber() {
    std::size_t start = pos_;
    bool is_int = true;
    if (s_[pos_] == '-') ++pos_;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c >= '0' && c <= '9') {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        is_int = false;
        ++pos_;
      } else {
        break;
      }
    }
    std::string token(s_.substr(start, pos_ - start));
    char* end = nullptr;
    errno = 0;
    if (is_int) {
      long long v = std::strtoll(token.c_str(), &end, 10);
      if (errno == 0 && end == token.c_str() + token.size()) return Value(v);
    }
    errno = 0;
    double d = std::strtod(token.c_str(), &end);
    if (errno != 0 || end != token.c_str() + token.size()) Fail("bad number '" + token + "'");
    return Value(d);
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

const Value& Field(const Value& doc, const char* name, Value::Kind kind) {
  const Value* v = doc.Find(name);
  if (v == nullptr) throw ConnectionFileError(std::string("connection file lacks field '") + name + "'");
  if (v->kind() != kind) {
    throw ConnectionFileError(std::string("connection file field '") + name + "' must be " + Value::KindName(kind) +
                              ", got " + Value::KindName(v->kind()));
  }
  return *v;
}

}  // namespace

Value ParseJson(std::string_view text) { return JsonParser(text).ParseDocument(); }

std::string DerivePlainPassword(std::string_view key) { return SignHex(key, "igi-zmq-plain-1", ""); }

std::optional<std::string> ConnectionInfo::PlainPassword() const {
  if (zmq_mechanism != "plain") return std::nullopt;
  return DerivePlainPassword(key);
}

std::string ConnectionInfo::Endpoint() const {
  if (transport == "ipc") return "ipc://" + ip;
  bool bracket = ip.find(':') != std::string::npos && ip.front() != '[';  // IPv6 literal, e.g. "::1"
  std::string host = bracket ? "[" + ip + "]" : ip;
  return "tcp://" + host + ":" + std::to_string(port);
}

ConnectionInfo ParseConnectionInfo(std::string_view json_text) {
  Value doc = ParseJson(json_text);
  if (!doc.is_map()) throw ConnectionFileError("connection file is not a JSON object");
  ConnectionInfo info;
  info.transport = Field(doc, "transport", Value::Kind::Str).as_str();
  info.ip = Field(doc, "ip", Value::Kind::Str).as_str();
  info.port = Field(doc, "port", Value::Kind::Int).as_int();
  std::string key_hex = Field(doc, "key", Value::Kind::Str).as_str();
  info.signature_scheme = Field(doc, "signature_scheme", Value::Kind::Str).as_str();
  info.protocol_version = Field(doc, "protocol_version", Value::Kind::Str).as_str();
  info.pid = Field(doc, "pid", Value::Kind::Int).as_int();
  if (doc.Find("zmq_mechanism") != nullptr) {  // 1.2; absent from an older daemon's file ("null")
    info.zmq_mechanism = Field(doc, "zmq_mechanism", Value::Kind::Str).as_str();
  }
  if (const Value* ticks = doc.Find("pid_start_ticks"); ticks != nullptr && ticks->kind() != Value::Kind::Nil) {
    if (ticks->kind() != Value::Kind::Int || ticks->as_int() < 0) {
      throw ConnectionFileError("connection file field 'pid_start_ticks' must be a non-negative integer or null");
    }
    info.pid_start_ticks = ticks->as_int();
  }
  if (info.zmq_mechanism != "plain" && info.zmq_mechanism != "null") {
    throw ConnectionFileError("unsupported zmq_mechanism '" + info.zmq_mechanism + "' (need plain or null)");
  }
  if (info.signature_scheme != "hmac-sha256") {
    throw ConnectionFileError("unsupported signature_scheme '" + info.signature_scheme + "' (need hmac-sha256)");
  }
  if (info.transport != "tcp" && info.transport != "ipc") {
    throw ConnectionFileError("unsupported transport '" + info.transport + "' (need tcp or ipc)");
  }
  if (info.transport == "tcp" && (info.port <= 0 || info.port > 65535)) {
    throw ConnectionFileError("port " + std::to_string(info.port) + " out of range");
  }
  if (info.transport == "ipc" && info.port != 0) {  // spec 13: an ipc file's port is 0
    throw ConnectionFileError("ipc connection file has port " + std::to_string(info.port) + " (must be 0)");
  }
  if (key_hex.size() != 64) throw ConnectionFileError("key must be 64 hex digits (32 bytes)");
  info.key = HexDecode(key_hex);
  return info;
}

ConnectionInfo ReadConnectionFile(const std::string& path) {
#if !defined(_WIN32)
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw ConnectionFileError("cannot read connection file " + path + ": " + std::strerror(errno));
  }
  if ((st.st_mode & 077) != 0) {
    throw ConnectionFileError("connection file " + path + " is accessible by group or others (need mode 0600)");
  }
#endif
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConnectionFileError("cannot open connection file " + path);
  std::stringstream buf;
  buf << in.rdbuf();
  try {
    return ParseConnectionInfo(buf.str());
  } catch (const ConnectionFileError& e) {
    throw ConnectionFileError(path + ": " + e.what());
  }
}

}  // namespace igi
