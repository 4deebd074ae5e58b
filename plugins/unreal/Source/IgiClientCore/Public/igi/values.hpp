// igi/values.hpp - IgiClientCore, messages layer: nested value objects carried inside messages.
//
// Field order is wire order (ipc/PROTOCOL.md); defaults are the spec's defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "igi/wire_fields.hpp"

namespace igi {

/// Sampling parameters of a session or of one generation (llama.cpp sampler vocabulary).
struct Sampling {
  double temperature = 0.7;  ///< 0 = greedy
  double top_p = 0.95;
  std::int64_t top_k = 40;  ///< 0 = disabled
  std::optional<std::int64_t> seed;  ///< uint32; nullopt = random
  std::int64_t max_tokens = 128;
  std::vector<std::string> stop;

  template <class V>
  void Visit(V& v) {
    v.Def("temperature", temperature, rules::Range(0.0, 5.0));
    Rule top_p_rule = rules::Range(0.0, 1.0);
    top_p_rule.min_exclusive = true;
    v.Def("top_p", top_p, top_p_rule);
    v.Def("top_k", top_k, rules::kNonNeg);
    v.Def("seed", seed, rules::kU32);
    v.Def("max_tokens", max_tokens, rules::kPositive);
    v.Def("stop", stop, rules::MaxLen(8));
  }
};

/// Limits the daemon enforces, announced in hello_reply.
struct Limits {
  std::int64_t max_frame_bytes = 1048576;
  std::int64_t max_prompt_tokens = 4096;
  std::int64_t max_sessions = 64;
  std::int64_t max_queue_depth = 16;

  template <class V>
  void Visit(V& v) {
    v.Def("max_frame_bytes", max_frame_bytes, rules::Range(1024.0, 9.2233720368547758e18));
    v.Def("max_prompt_tokens", max_prompt_tokens, rules::kPositive);
    v.Def("max_sessions", max_sessions, rules::kPositive);
    v.Def("max_queue_depth", max_queue_depth, rules::kPositive);
  }
};

/// The loaded model.
struct ModelInfo {
  std::string path;
  std::string architecture;
  std::int64_t n_layer = 0;
  std::optional<std::int64_t> n_params;
  double file_mib = 0.0;
  std::int64_t n_ctx = 0;

  template <class V>
  void Visit(V& v) {
    v.Req("path", path);
    v.Req("architecture", architecture);
    v.Req("n_layer", n_layer, rules::kNonNeg);
    v.Def("n_params", n_params, rules::kNonNeg);
    v.Req("file_mib", file_mib, rules::kNonNeg);
    v.Req("n_ctx", n_ctx, rules::kNonNeg);
  }
};

/// Summary of the placement plan in force (or proposed).
struct Plan {
  std::string strategy;  ///< e.g. "cpu_only", "full_gpu", "layer_split"
  double gpu_mib = 0.0;
  double cpu_mib = 0.0;
  std::optional<std::int64_t> n_gpu_layers;
  std::string summary;

  template <class V>
  void Visit(V& v) {
    v.Req("strategy", strategy);
    v.Req("gpu_mib", gpu_mib, rules::kNonNeg);
    v.Req("cpu_mib", cpu_mib, rules::kNonNeg);
    v.Def("n_gpu_layers", n_gpu_layers, rules::kNonNeg);
    v.Def("summary", summary);
  }
};

/// How the daemon paces token generation to protect the game's frame time.
struct Throttle {
  std::optional<std::int64_t> tokens_per_frame;  ///< nullopt = unlimited
  double sleep_ms_between_tokens = 0.0;

  template <class V>
  void Visit(V& v) {
    v.Def("tokens_per_frame", tokens_per_frame, rules::kNonNeg);
    v.Def("sleep_ms_between_tokens", sleep_ms_between_tokens, rules::kNonNeg);
  }
};

/// Token counts of one generation.
struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;

  template <class V>
  void Visit(V& v) {
    v.Req("prompt_tokens", prompt_tokens, rules::kNonNeg);
    v.Req("completion_tokens", completion_tokens, rules::kNonNeg);
  }
};

}  // namespace igi
