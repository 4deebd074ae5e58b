// test_conformance.cpp - IgiClientCore tests: conformance against every golden vector in ipc/vectors/.
//
// vectors.msgpack: verify signature, decode generically and compare with the maps, decode typed,
// re-encode canonically and compare bytes, re-sign. lenient.msgpack: the receive path accepts the
// frames and the typed result re-encodes to the canonical maps. invalid.msgpack: the receive path
// fails with the expected classification. connection.msgpack: the connection-file reader gives the endpoint, the
// mechanism and the ZMQ_PLAIN credential of each file, or refuses it.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "igi/connection_file.hpp"
#include "igi/envelope.hpp"
#include "igi/errors.hpp"
#include "igi/signing.hpp"
#include "test_framework.hpp"

namespace {

std::string VectorsDir() {
  const std::string& dir = igi_test::GetOptions().vectors_dir;
#ifdef IGI_DEFAULT_VECTORS_DIR
  if (dir.empty()) return IGI_DEFAULT_VECTORS_DIR;
#endif
  return dir;
}

igi::ValueArray LoadVectors(const std::string& file_name) {
  std::string path = VectorsDir() + "/" + file_name;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    igi_test::RecordFailure(__FILE__, __LINE__, "cannot open " + path + " (pass --vectors DIR)");
    throw igi_test::Failure{};
  }
  std::stringstream buf;
  buf << in.rdbuf();
  igi::DecodeLimits limits;
  limits.max_input_bytes = 256u << 20;
  limits.max_depth = 64;
  igi::Value all = igi::Decode(buf.str(), limits);
  if (!all.is_array() || all.as_array().empty()) {
    igi_test::RecordFailure(__FILE__, __LINE__, path + " is not a non-empty array");
    throw igi_test::Failure{};
  }
  return all.as_array();
}

std::string BinToString(const igi::Value& v) {
  const igi::Bytes& b = v.as_bin();
  return std::string(b.begin(), b.end());
}

struct Entry {
  std::string name;
  std::string key;
  std::vector<std::string> frames;
  const igi::Value* header = nullptr;
  const igi::Value* content = nullptr;
  std::string expect;
};

Entry ReadEntry(const igi::Value& v) {
  Entry e;
  e.name = v.Find("name")->as_str();
  e.key = BinToString(*v.Find("key"));
  for (const igi::Value& f : v.Find("frames")->as_array()) e.frames.push_back(BinToString(f));
  e.header = v.Find("header");
  e.content = v.Find("content");
  if (const igi::Value* expect = v.Find("expect")) e.expect = expect->as_str();
  return e;
}

}  // namespace

TEST(conformance_valid_vectors_round_trip_byte_for_byte) {
  igi::ValueArray vectors = LoadVectors("vectors.msgpack");
  std::vector<std::string> types_seen;
  for (const igi::Value& raw : vectors) {
    Entry e = ReadEntry(raw);
    REQUIRE(e.frames.size() == 4 && e.header != nullptr && e.content != nullptr);
    // 1. signature
    CHECK_MSG(igi::VerifyHex(e.key, e.frames[1], e.frames[2], e.frames[3]), e.name);
    // 2. generic decode equals the vector's maps, key order included
    igi::Value header = igi::Decode(e.frames[2]);
    igi::Value content = igi::Decode(e.frames[3]);
    CHECK_MSG(header == *e.header, e.name << ": header " << header.ToString());
    CHECK_MSG(content == *e.content, e.name << ": content " << content.ToString());
    // 3. typed decode, canonical re-encode, re-sign
    try {
      igi::Envelope env = igi::UnpackFrames(e.key, e.frames);
      const igi::MessageTypeInfo* info = igi::FindMessageType(env.header.type);
      REQUIRE(info != nullptr);
      std::string header_bytes = igi::Encode(igi::StructToValue(env.header));
      std::string content_bytes = igi::Encode(info->canonicalize(env.content));
      CHECK_MSG(header_bytes == e.frames[2], e.name << ": header bytes " << igi::HexEncode(header_bytes));
      CHECK_MSG(content_bytes == e.frames[3], e.name << ": content bytes " << igi::HexEncode(content_bytes)
                                                     << "\n    expected    " << igi::HexEncode(e.frames[3]));
      igi::Frames packed = igi::PackFrames(e.key, env.header, info->canonicalize(env.content));
      CHECK_MSG(packed[1] == e.frames[1], e.name << ": re-signed signature differs");
      types_seen.push_back(env.header.type);
    } catch (const igi::IgiError& err) {
      CHECK_MSG(false, e.name << ": " << err.what());
    }
  }
  // Every message type of the registry has at least one golden vector.
  for (const igi::MessageTypeInfo& info : igi::AllMessageTypes()) {
    bool seen = false;
    for (const std::string& t : types_seen) seen = seen || t == info.type;
    CHECK_MSG(seen, "no golden vector for " << info.type);
  }
  std::cout << "    " << vectors.size() << " valid vectors checked" << std::endl;
}

TEST(conformance_lenient_vectors_decode_to_canonical_maps) {
  igi::ValueArray vectors = LoadVectors("lenient.msgpack");
  for (const igi::Value& raw : vectors) {
    Entry e = ReadEntry(raw);
    try {
      igi::Envelope env = igi::UnpackFrames(e.key, e.frames);
      const igi::MessageTypeInfo* info = igi::FindMessageType(env.header.type);
      REQUIRE(info != nullptr);
      CHECK_MSG(igi::Encode(igi::StructToValue(env.header)) == igi::Encode(*e.header), e.name << ": header");
      igi::Value canonical = info->canonicalize(env.content);
      CHECK_MSG(igi::Encode(canonical) == igi::Encode(*e.content),
                e.name << ": content " << canonical.ToString() << " != " << e.content->ToString());
    } catch (const igi::IgiError& err) {
      CHECK_MSG(false, e.name << ": rejected: " << err.what());
    }
  }
  std::cout << "    " << vectors.size() << " lenient vectors checked" << std::endl;
}

TEST(conformance_invalid_vectors_are_classified) {
  igi::ValueArray vectors = LoadVectors("invalid.msgpack");
  for (const igi::Value& raw : vectors) {
    Entry e = ReadEntry(raw);
    std::string got = "accepted";
    try {
      igi::UnpackFrames(e.key, e.frames);
    } catch (const igi::WireError& err) {
      got = err.classification();
    } catch (const std::exception& err) {
      got = std::string("unexpected exception: ") + err.what();
    }
    CHECK_MSG(got == e.expect, e.name << ": expected " << e.expect << ", got " << got);
  }
  std::cout << "    " << vectors.size() << " invalid vectors checked" << std::endl;
}

TEST(conformance_connection_files_give_endpoint_and_handshake_credential) {
  igi::ValueArray vectors = LoadVectors("connection.msgpack");
  auto text = [](const igi::Value* v) { return v == nullptr || v->is_nil() ? std::string("<nil>") : v->as_str(); };
  for (const igi::Value& raw : vectors) {
    std::string name = raw.Find("name")->as_str();
    std::string file = raw.Find("file")->as_str();
    if (raw.Find("expect")->as_str() == "refused") {
      CHECK_THROWS_AS(igi::ParseConnectionInfo(file), igi::ConnectionFileError);
      continue;
    }
    igi::ConnectionInfo info;
    try {
      info = igi::ParseConnectionInfo(file);
    } catch (const std::exception& e) {
      CHECK_MSG(false, name << ": refused: " << e.what());
      continue;
    }
    CHECK_MSG(info.Endpoint() == text(raw.Find("endpoint")), name << ": endpoint " << info.Endpoint());
    CHECK_MSG(info.zmq_mechanism == text(raw.Find("zmq_mechanism")), name << ": mechanism " << info.zmq_mechanism);
    std::optional<std::string> password = info.PlainPassword();
    CHECK_MSG(password.value_or("<nil>") == text(raw.Find("plain_password")), name << ": PLAIN password");
    CHECK_MSG((password ? std::string(igi::kPlainUsername) : "<nil>") == text(raw.Find("plain_username")),
              name << ": PLAIN username");
  }
  std::cout << "    " << vectors.size() << " connection vectors checked" << std::endl;
}
