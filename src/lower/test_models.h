// Fixtures shared by the lowering tests (private to src/lower's tests): a
// small Llama config whose shapes keep the tests quick to read and run, and a
// GPU without cuBLAS workspaces, so that only what the lowering emits counts.
#pragma once

#include <cstdint>

#include <gtest/gtest.h>

#include "vramscope/gpu.h"
#include "vramscope/model.h"

namespace vramscope::lower_testing {

inline constexpr const char* kTinyLlama = R"({
  "model_type": "llama", "architectures": ["LlamaForCausalLM"],
  "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
  "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
  "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"
})";

inline GpuSpec TestGpu() {
  GpuSpec g;
  g.name = "test";
  g.usable_bytes = uint64_t{80} << 30;
  g.cublas_workspace_bytes = 0;
  return g;
}

inline ModelSpec Tiny() {
  auto m = ParseModelConfig(kTinyLlama, "tiny");
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return *m;
}

}  // namespace vramscope::lower_testing
