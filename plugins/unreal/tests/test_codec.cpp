// test_codec.cpp - IgiClientCore tests: canonical msgpack encoder/decoder and HMAC signing.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "igi/errors.hpp"
#include "igi/msgpack.hpp"
#include "igi/signing.hpp"
#include "test_alloc.hpp"
#include "test_framework.hpp"

#ifdef IGI_HAVE_MSGPACK_CXX
#include <msgpack.hpp>
#endif

namespace {

std::string Hex(const std::string& s) { return igi::HexEncode(s); }

/// A msgpack header: `tag` followed by `n` as 4 big-endian bytes (array32 0xdd, map32 0xdf).
std::string Header32(std::uint8_t tag, std::uint32_t n) {
  std::string out(1, static_cast<char>(tag));
  for (int i = 3; i >= 0; --i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

/// n distinct 6-character keys, each as a msgpack fixstr followed by a nil (a map entry or two array items).
std::string KeysAndNils(int n) {
  std::string out;
  char key[8];
  for (int i = 0; i < n; ++i) {
    std::snprintf(key, sizeof key, "k%05d", i);
    out += static_cast<char>(0xa6);
    out += key;
    out += static_cast<char>(0xc0);
  }
  return out;
}

double SecondsToDecode(const std::string& data) {
  auto start = std::chrono::steady_clock::now();
  igi::Decode(data);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST(codec_integers_use_smallest_form) {
  CHECK_EQ(Hex(igi::Encode(igi::Value(0))), "00");
  CHECK_EQ(Hex(igi::Encode(igi::Value(127))), "7f");
  CHECK_EQ(Hex(igi::Encode(igi::Value(128))), "cc80");
  CHECK_EQ(Hex(igi::Encode(igi::Value(255))), "ccff");
  CHECK_EQ(Hex(igi::Encode(igi::Value(256))), "cd0100");
  CHECK_EQ(Hex(igi::Encode(igi::Value(65536))), "ce00010000");
  CHECK_EQ(Hex(igi::Encode(igi::Value(4294967296LL))), "cf0000000100000000");
  CHECK_EQ(Hex(igi::Encode(igi::Value(-1))), "ff");
  CHECK_EQ(Hex(igi::Encode(igi::Value(-32))), "e0");
  CHECK_EQ(Hex(igi::Encode(igi::Value(-33))), "d0df");
  CHECK_EQ(Hex(igi::Encode(igi::Value(-129))), "d1ff7f");
  CHECK_EQ(Hex(igi::Encode(igi::Value(-32769))), "d2ffff7fff");
  CHECK_EQ(Hex(igi::Encode(igi::Value(std::numeric_limits<long long>::min()))), "d38000000000000000");
  CHECK_EQ(Hex(igi::Encode(igi::Value(std::numeric_limits<unsigned long long>::max()))), "cfffffffffffffffff");
}

TEST(codec_floats_are_always_float64) {
  CHECK_EQ(Hex(igi::Encode(igi::Value(1.5))), "cb3ff8000000000000");
  CHECK_EQ(Hex(igi::Encode(igi::Value(0.0))), "cb0000000000000000");
  // float32 on the wire decodes, and re-encodes as float64.
  igi::Value v = igi::Decode(igi::HexDecode("ca3fc00000"));
  REQUIRE(v.is_float());
  CHECK_EQ(v.as_float(), 1.5);
}

TEST(codec_str_bin_array_map_headers) {
  CHECK_EQ(Hex(igi::Encode(igi::Value(""))), "a0");
  CHECK_EQ(Hex(igi::Encode(igi::Value(std::string(31, 'a')))).substr(0, 2), "bf");
  CHECK_EQ(Hex(igi::Encode(igi::Value(std::string(32, 'a')))).substr(0, 4), "d920");
  CHECK_EQ(Hex(igi::Encode(igi::Value(std::string(256, 'a')))).substr(0, 6), "da0100");
  CHECK_EQ(Hex(igi::Encode(igi::Value(igi::Bytes{1, 2}))), "c4020102");
  CHECK_EQ(Hex(igi::Encode(igi::Value(igi::ValueArray{}))), "90");
  CHECK_EQ(Hex(igi::Encode(igi::Value(igi::ValueArray(16, igi::Value())))).substr(0, 6), "dc0010");
  igi::ValueMap m{{"b", 1}, {"a", nullptr}};
  CHECK_EQ(Hex(igi::Encode(igi::Value(m))), "82a16201a161c0");
  CHECK_EQ(Hex(igi::Encode(igi::Value(true))), "c3");
}

TEST(codec_round_trip_preserves_map_order_and_types) {
  igi::ValueMap inner{{"z", -5}, {"a", 2.25}, {"bin", igi::Bytes{0, 255}}};
  igi::Value v(igi::ValueMap{{"type", "generate_request"},
                             {"n", 300},
                             {"big", std::numeric_limits<unsigned long long>::max()},
                             {"items", igi::ValueArray{1, "two", nullptr, false}},
                             {"inner", inner},
                             {"text", "caf\xc3\xa9 \xf0\x9f\x8e\xae"}});
  std::string wire = igi::Encode(v);
  igi::Value back = igi::Decode(wire);
  CHECK_MSG(back == v, back.ToString());
  CHECK_EQ(igi::Encode(back), wire);
  CHECK(back.Find("inner")->as_map()[0].first == "z");
}

TEST(codec_decoder_rejects_malformed_input) {
  CHECK_THROWS_AS(igi::Decode(""), igi::DecodeError);
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("c1")), igi::DecodeError);            // never used
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("d40100")), igi::DecodeError);        // fixext1
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("a3616263ff")), igi::DecodeError);    // trailing bytes
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("a4616263")), igi::DecodeError);      // truncated str
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("81010203")), igi::DecodeError);      // int key
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("a2c328")), igi::DecodeError);        // invalid UTF-8
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("dfffffffff")), igi::DecodeError);    // huge map count
  CHECK_THROWS_AS(igi::Decode(igi::HexDecode("82a16101a16102")), igi::DecodeError);  // duplicate key
  std::string deep(100, static_cast<char>(0x91));
  deep += static_cast<char>(0xc0);
  CHECK_THROWS_AS(igi::Decode(deep), igi::DecodeError);
}

TEST(codec_decoder_reserves_only_for_elements_that_arrive) {
  // 1 MiB of nested array32 headers, each claiming every byte left. Reserving each claim (~128 bytes a Value)
  // allocated ~4 GiB before the depth limit stopped the decode; reserving at most 1024 elements, a few MiB.
  const std::size_t size = 1u << 20;
  std::string bomb;
  for (std::size_t level = 0; level < 33; ++level) {
    bomb += Header32(0xdd, static_cast<std::uint32_t>(size - bomb.size() - 5));  // every byte after this header
  }
  bomb.append(size - bomb.size(), static_cast<char>(0xc0));
  std::size_t total = 0;
  {
    igi_test::AllocationCounter counter;
    CHECK_THROWS_AS(igi::Decode(bomb), igi::DecodeError);  // nesting exceeds the depth limit
    total = counter.total_bytes();
  }
  CHECK_MSG(total < 16 * size, "decoding a " << size << "-byte frame allocated " << total << " bytes");
  // Arrays and maps longer than the reserve still decode whole: they grow as their elements arrive.
  igi::Value array = igi::Decode(Header32(0xdd, 3000) + std::string(3000, '\x01'));
  CHECK_EQ(array.as_array().size(), 3000u);
  igi::Value map = igi::Decode(Header32(0xdf, 3000) + KeysAndNils(3000));
  CHECK_EQ(map.as_map().size(), 3000u);
  CHECK_EQ(map.as_map()[2999].first, std::string("k02999"));
}

TEST(codec_decoder_finds_duplicate_map_keys_in_near_linear_time) {
  // 60000 keys: checking each against all earlier ones (1.8e9 string compares) took ~11 s; a hash set takes
  // milliseconds. The bound is relative to an array of the same bytes (no key check) and generous either way.
  const int n = 60000;
  std::string items = KeysAndNils(n);
  double array_s = SecondsToDecode(Header32(0xdd, 2 * n) + items);
  double map_s = SecondsToDecode(Header32(0xdf, n) + items);
  CHECK_MSG(map_s < 1.0 + 20 * array_s, "map of " << n << " keys took " << map_s << " s, the same bytes as an array "
                                                  << array_s << " s");
  // Still strict: a duplicate of the first key, last, is found.
  std::string duplicate = Header32(0xdf, n + 1) + items + KeysAndNils(1);
  CHECK_THROWS_AS(igi::Decode(duplicate), igi::DecodeError);
}

TEST(codec_wide_int_forms_decode_to_the_same_value) {
  igi::Value v = igi::Decode(igi::HexDecode("cf0000000000000005"));
  REQUIRE(v.is_integer());
  CHECK_EQ(v.as_int(), 5);
  CHECK_EQ(Hex(igi::Encode(v)), "05");
  CHECK_EQ(igi::Decode(igi::HexDecode("d0fb")).as_int(), -5);
}

#ifdef IGI_HAVE_MSGPACK_CXX
TEST(codec_output_is_read_back_by_msgpack_c) {
  igi::Value v(igi::ValueMap{{"a", 1}, {"b", -200}, {"c", 0.25}, {"d", "text"}, {"e", igi::ValueArray{nullptr, true}}});
  std::string wire = igi::Encode(v);
  msgpack::object_handle oh = msgpack::unpack(wire.data(), wire.size());
  const msgpack::object& o = oh.get();
  REQUIRE(o.type == msgpack::type::MAP);
  REQUIRE(o.via.map.size == 5);
  CHECK(o.via.map.ptr[0].key.as<std::string>() == "a");
  CHECK(o.via.map.ptr[1].val.as<int>() == -200);
  CHECK(o.via.map.ptr[2].val.type == msgpack::type::FLOAT64);
  CHECK(o.via.map.ptr[3].val.type == msgpack::type::STR);
  // msgpack-c's own packer picks the same smallest forms for these integers.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack(-200);
  CHECK_EQ(Hex(std::string(buf.data(), buf.size())), Hex(igi::Encode(igi::Value(-200))));
}
#endif

TEST(signing_matches_rfc4231_case_2) {
  // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?"
  CHECK_EQ(igi::SignHex("Jefe", "what do ya want ", "for nothing?"),
           "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(signing_verify_rejects_tampering) {
  std::string sig = igi::SignHex("k", "header", "content");
  CHECK(sig.size() == 64);
  CHECK(igi::VerifyHex("k", sig, "header", "content"));
  CHECK(!igi::VerifyHex("k", sig, "header", "contenT"));
  CHECK(!igi::VerifyHex("other", sig, "header", "content"));
  CHECK(!igi::VerifyHex("k", sig.substr(1), "header", "content"));
  std::string upper = sig;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (upper != sig) CHECK(!igi::VerifyHex("k", upper, "header", "content"));
}

// ---- protocol 1.1: tools and constrained output ------------------------------------------------------------
#include "igi/messages.hpp"

TEST(protocol_1_1_tool_fields_round_trip_and_are_checked) {
  igi::CreateSessionRequest create;
  create.persona = "Mira";
  create.json_schema = std::string("{\"type\": \"object\"}");
  igi::Tool give;
  give.name = "give_item";
  give.parameters = "{\"type\": \"object\"}";
  create.tools.push_back(give);
  igi::Value wire = igi::StructToValue(create);
  igi::CreateSessionRequest back = igi::StructFromValue<igi::CreateSessionRequest>(wire);
  CHECK_EQ(back.tools.size(), static_cast<std::size_t>(1));
  CHECK_EQ(back.tools[0].name, std::string("give_item"));
  CHECK(back.json_schema.has_value() && !back.grammar.has_value());

  igi::GenerateReply reply;
  reply.finish_reason = "tool_call";
  igi::ToolCall call;
  call.id = "call_1";
  call.name = "give_item";
  call.arguments = "{\"item\": \"sword\"}";
  reply.tool_call = call;
  igi::GenerateReply reply_back = igi::StructFromValue<igi::GenerateReply>(igi::StructToValue(reply));
  CHECK(reply_back.tool_call.has_value() && reply_back.tool_call->arguments == call.arguments);
  CHECK(!reply_back.json_output.has_value());

  create.tools[0].name = "9lives";  // a tool name may not start with a digit
  CHECK_THROWS_AS(igi::StructFromValue<igi::CreateSessionRequest>(igi::StructToValue(create)), igi::DecodeError);
  igi::GenerateRequest generate;
  generate.grammar = std::string();  // grammar, when set, is 1-65536 characters
  CHECK_THROWS_AS(igi::StructFromValue<igi::GenerateRequest>(igi::StructToValue(generate)), igi::DecodeError);
}

TEST(protocol_1_1_decoder_refuses_grammar_with_json_schema_and_a_tool_name_twice) {
  igi::GenerateRequest generate;
  generate.grammar = std::string("root ::= \"yes\"");
  generate.json_schema = std::string("{\"type\": \"boolean\"}");
  CHECK_THROWS_AS(igi::StructFromValue<igi::GenerateRequest>(igi::StructToValue(generate)), igi::DecodeError);
  generate.json_schema.reset();
  CHECK(igi::StructFromValue<igi::GenerateRequest>(igi::StructToValue(generate)).grammar.has_value());

  igi::CreateSessionRequest create;
  create.grammar = generate.grammar;
  create.json_schema = std::string("{}");
  CHECK_THROWS_AS(igi::StructFromValue<igi::CreateSessionRequest>(igi::StructToValue(create)), igi::DecodeError);
  create.grammar.reset();
  igi::Tool wave;
  wave.name = "wave";
  igi::Tool wave_cased = wave;
  wave_cased.name = "Wave";  // names are compared as written: wave and Wave are two tools
  create.tools = {wave, wave_cased};
  CHECK_EQ(igi::StructFromValue<igi::CreateSessionRequest>(igi::StructToValue(create)).tools.size(),
           static_cast<std::size_t>(2));
  create.tools.push_back(wave);
  try {
    igi::StructFromValue<igi::CreateSessionRequest>(igi::StructToValue(create));
    CHECK_MSG(false, "a tool name twice was accepted");
  } catch (const igi::DecodeError& e) {
    CHECK(std::string(e.what()).find("'wave' twice") != std::string::npos);
  }
}
