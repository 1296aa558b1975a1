// A small GPT-style decoder-only transformer over bytes, buildable as whole or as pipeline stages.
#pragma once

#include "kernels/models/stage_module.hpp"
#include "kernels/result.hpp"

#include <cstdint>
#include <memory>

namespace starling::kernels {

/// Shape and initialization of a byte-level GPT.
struct gpt_config {
  /// Vocabulary size; 256 for bytes.
  int64_t vocab = 256;
  /// Number of transformer blocks (the unit stages are cut by).
  int64_t layers = 4;
  /// Model width (embedding dimension).
  int64_t width = 128;
  /// Attention heads; must divide `width`.
  int64_t heads = 4;
  /// Longest sequence (size of the position embedding).
  int64_t seq_len = 128;
  /// Dropout on the embedding, attention weights and residual branches; masks come from the
  /// per-call seed given to `stage_module`, so the recomputation in `backward` is exact.
  double dropout = 0.0;
  /// Block i is initialized from a generator seeded with `seed + i`; the embedding and head from
  /// seeds mixed from `seed`, so every stage of a split gets the unsplit model's parameters.
  uint64_t seed = 0;
};

/// Checks a config (positive sizes, heads dividing width, dropout in [0, 1)).
status validate(const gpt_config& cfg);

/// The stage holding blocks [begin, end) (with the embedding when begin == 0 and the final norm,
/// head and loss when end == cfg.layers). Its first-stage input is int64 tokens [B, T] (T <=
/// seq_len); other stages take float activations [B, T, width]; the last also takes int64 targets
/// [B, T] and returns the mean cross-entropy per byte.
result<std::shared_ptr<stage_module>> make_gpt_stage(const gpt_config& cfg, int64_t begin,
                                                     int64_t end);

/// The whole model: the one stage holding every block.
result<std::shared_ptr<stage_module>> make_gpt(const gpt_config& cfg);

} // namespace starling::kernels
