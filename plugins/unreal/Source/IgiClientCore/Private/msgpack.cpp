// msgpack.cpp - IgiClientCore, codec layer: canonical msgpack encoder and strict decoder.
#include "igi/msgpack.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <unordered_set>

#include "igi/errors.hpp"

namespace igi {
namespace {

void PutBE(std::string& out, std::uint64_t v, int n_bytes) {
  for (int i = n_bytes - 1; i >= 0; --i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void PutTagged(std::string& out, std::uint8_t tag, std::uint64_t v, int n_bytes) {
  out += static_cast<char>(tag);
  PutBE(out, v, n_bytes);
}

void EncodeUnsigned(std::uint64_t v, std::string& out) {
  if (v <= 0x7f) {
    out += static_cast<char>(v);
  } else if (v <= 0xff) {
    PutTagged(out, 0xcc, v, 1);
  } else if (v <= 0xffff) {
    PutTagged(out, 0xcd, v, 2);
  } else if (v <= 0xffffffffULL) {
    PutTagged(out, 0xce, v, 4);
  } else {
    PutTagged(out, 0xcf, v, 8);
  }
}

void EncodeSigned(std::int64_t v, std::string& out) {
  if (v >= 0) {
    EncodeUnsigned(static_cast<std::uint64_t>(v), out);
  } else if (v >= -32) {
    out += static_cast<char>(static_cast<std::uint8_t>(v));
  } else if (v >= INT8_MIN) {
    PutTagged(out, 0xd0, static_cast<std::uint8_t>(v), 1);
  } else if (v >= INT16_MIN) {
    PutTagged(out, 0xd1, static_cast<std::uint16_t>(v), 2);
  } else if (v >= INT32_MIN) {
    PutTagged(out, 0xd2, static_cast<std::uint32_t>(v), 4);
  } else {
    PutTagged(out, 0xd3, static_cast<std::uint64_t>(v), 8);
  }
}

void EncodeLength(std::size_t n, std::uint8_t fix_base, std::size_t fix_max, std::uint8_t tag8,
                  std::uint8_t tag16, std::uint8_t tag32, std::string& out) {
  if (fix_max > 0 && n <= fix_max) {
    out += static_cast<char>(fix_base | n);
  } else if (tag8 != 0 && n <= 0xff) {
    PutTagged(out, tag8, n, 1);
  } else if (n <= 0xffff) {
    PutTagged(out, tag16, n, 2);
  } else if (n <= 0xffffffffULL) {
    PutTagged(out, tag32, n, 4);
  } else {
    throw EncodeError("msgpack object longer than 2^32-1");
  }
}

void EncodeStr(const std::string& s, std::string& out) {
  EncodeLength(s.size(), 0xa0, 31, 0xd9, 0xda, 0xdb, out);
  out += s;
}

}  // namespace

void EncodeTo(const Value& value, std::string& out) {
  switch (value.kind()) {
    case Value::Kind::Nil: out += static_cast<char>(0xc0); return;
    case Value::Kind::Bool: out += static_cast<char>(value.as_bool() ? 0xc3 : 0xc2); return;
    case Value::Kind::Int: EncodeSigned(value.as_int(), out); return;
    case Value::Kind::UInt: EncodeUnsigned(value.as_uint(), out); return;
    case Value::Kind::Float: {
      std::uint64_t bits;
      double d = value.as_float();
      std::memcpy(&bits, &d, sizeof bits);
      PutTagged(out, 0xcb, bits, 8);
      return;
    }
    case Value::Kind::Str: EncodeStr(value.as_str(), out); return;
    case Value::Kind::Bin:
      EncodeLength(value.as_bin().size(), 0, 0, 0xc4, 0xc5, 0xc6, out);
      out.append(reinterpret_cast<const char*>(value.as_bin().data()), value.as_bin().size());
      return;
    case Value::Kind::Array:
      EncodeLength(value.as_array().size(), 0x90, 15, 0, 0xdc, 0xdd, out);
      for (const Value& item : value.as_array()) EncodeTo(item, out);
      return;
    case Value::Kind::Map:
      EncodeLength(value.as_map().size(), 0x80, 15, 0, 0xde, 0xdf, out);
      for (const auto& [k, item] : value.as_map()) {
        EncodeStr(k, out);
        EncodeTo(item, out);
      }
      return;
  }
}

std::string Encode(const Value& value) {
  std::string out;
  EncodeTo(value, out);
  return out;
}

namespace {

bool IsValidUtf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static const std::uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

class Reader {
 public:
  Reader(std::string_view data, const DecodeLimits& limits) : data_(data), limits_(limits) {}

  Value ReadTop() {
    if (data_.size() > limits_.max_input_bytes) throw DecodeError("msgpack input exceeds size limit");
    Value v = Read(0);
    if (pos_ != data_.size()) {
      throw DecodeError("trailing bytes after msgpack object (" +
                        std::to_string(data_.size() - pos_) + " extra)");
    }
    return v;
  }

 private:
  std::uint64_t Take(int n_bytes) {
    Need(static_cast<std::size_t>(n_bytes));
    std::uint64_t v = 0;
    for (int i = 0; i < n_bytes; ++i) v = (v << 8) | static_cast<std::uint8_t>(data_[pos_++]);
    return v;
  }

  void Need(std::size_t n) const {
    if (data_.size() - pos_ < n) throw DecodeError("truncated msgpack data");
  }

  std::string_view TakeRaw(std::uint64_t n) {
    Need(static_cast<std::size_t>(n));
    std::string_view s = data_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }

  std::string ReadStrBody(std::uint64_t n) {
    std::string_view s = TakeRaw(n);
    if (!IsValidUtf8(s)) throw DecodeError("msgpack str is not valid UTF-8");
    return std::string(s);
  }

  // A header's count is only a claim: each Value is ~128 bytes, so reserving what nested array32/map32 headers
  // declare turned a 1 MiB frame into ~4 GiB of reservations before a byte of content was read. Reserve at most
  // kMaxReserve up front and let the container grow as elements actually arrive.
  static constexpr std::uint64_t kMaxReserve = 1024;

  static std::size_t ReserveFor(std::uint64_t n) { return static_cast<std::size_t>(std::min(n, kMaxReserve)); }

  Value ReadArray(std::uint64_t n, std::size_t depth) {
    if (n > data_.size() - pos_) throw DecodeError("truncated msgpack array");
    ValueArray a;
    a.reserve(ReserveFor(n));
    for (std::uint64_t i = 0; i < n; ++i) a.push_back(Read(depth + 1));
    return Value(std::move(a));
  }

  // The raw bytes of a str just read: they end at pos_ and equal the decoded text. They live in data_, so views of
  // them stay valid while the map grows (views of the map's own keys would not: moving a short string moves its
  // characters).
  std::string_view LastStrBytes(const std::string& text) const {
    return data_.substr(pos_ - text.size(), text.size());
  }

  Value ReadMap(std::uint64_t n, std::size_t depth) {
    if (n > (data_.size() - pos_) / 2) throw DecodeError("truncated msgpack map");
    ValueMap m;
    m.reserve(ReserveFor(n));
    // A hash set, not a scan of the earlier keys: the scan was O(n^2) (100k keys took 36 s, under the client mutex).
    std::unordered_set<std::string_view> seen;
    seen.reserve(ReserveFor(n));
    for (std::uint64_t i = 0; i < n; ++i) {
      Value key = Read(depth + 1);
      if (!key.is_str()) {
        throw DecodeError(std::string("msgpack map key must be str, got ") + Value::KindName(key.kind()));
      }
      if (!seen.insert(LastStrBytes(key.as_str())).second) {
        throw DecodeError("duplicate msgpack map key '" + key.as_str() + "'");
      }
      Value item = Read(depth + 1);
      m.emplace_back(key.as_str(), std::move(item));
    }
    return Value(std::move(m));
  }

  Value Read(std::size_t depth) {
    if (depth > limits_.max_depth) throw DecodeError("msgpack nesting exceeds depth limit");
    auto tag = static_cast<std::uint8_t>(Take(1));
    if (tag <= 0x7f) return Value(static_cast<int>(tag));
    if (tag >= 0xe0) return Value(static_cast<int>(static_cast<std::int8_t>(tag)));
    if ((tag & 0xe0) == 0xa0) return Value(ReadStrBody(tag & 0x1f));
    if ((tag & 0xf0) == 0x90) return ReadArray(tag & 0x0f, depth);
    if ((tag & 0xf0) == 0x80) return ReadMap(tag & 0x0f, depth);
    switch (tag) {
      case 0xc0: return Value();
      case 0xc2: return Value(false);
      case 0xc3: return Value(true);
      case 0xc4: { auto n = Take(1); std::string_view s = TakeRaw(n); return Value(Bytes(s.begin(), s.end())); }
      case 0xc5: { auto n = Take(2); std::string_view s = TakeRaw(n); return Value(Bytes(s.begin(), s.end())); }
      case 0xc6: { auto n = Take(4); std::string_view s = TakeRaw(n); return Value(Bytes(s.begin(), s.end())); }
      case 0xca: {
        auto bits = static_cast<std::uint32_t>(Take(4));
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return Value(static_cast<double>(f));
      }
      case 0xcb: {
        std::uint64_t bits = Take(8);
        double d;
        std::memcpy(&d, &bits, sizeof d);
        return Value(d);
      }
      case 0xcc: return Value(static_cast<unsigned long long>(Take(1)));
      case 0xcd: return Value(static_cast<unsigned long long>(Take(2)));
      case 0xce: return Value(static_cast<unsigned long long>(Take(4)));
      case 0xcf: return Value(static_cast<unsigned long long>(Take(8)));
      case 0xd0: return Value(static_cast<long long>(static_cast<std::int8_t>(Take(1))));
      case 0xd1: return Value(static_cast<long long>(static_cast<std::int16_t>(Take(2))));
      case 0xd2: return Value(static_cast<long long>(static_cast<std::int32_t>(Take(4))));
      case 0xd3: return Value(static_cast<long long>(static_cast<std::int64_t>(Take(8))));
      case 0xd9: return Value(ReadStrBody(Take(1)));
      case 0xda: return Value(ReadStrBody(Take(2)));
      case 0xdb: return Value(ReadStrBody(Take(4)));
      case 0xdc: return ReadArray(Take(2), depth);
      case 0xdd: return ReadArray(Take(4), depth);
      case 0xde: return ReadMap(Take(2), depth);
      case 0xdf: return ReadMap(Take(4), depth);
      default: break;
    }
    if (tag == 0xc1) throw DecodeError("msgpack tag 0xc1 is never used");
    throw DecodeError("msgpack ext types are not part of the protocol");
  }

  std::string_view data_;
  const DecodeLimits& limits_;
  std::size_t pos_ = 0;
};

}  // namespace

Value Decode(std::string_view data, const DecodeLimits& limits) {
  return Reader(data, limits).ReadTop();
}

}  // namespace igi
