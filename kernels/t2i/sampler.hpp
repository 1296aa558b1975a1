// Generating images from captions with a trained GPT over the text-to-image vocabulary
// (kernels/t2i/captions.hpp): the prompt [caption | separator], then one image token at a time.
#pragma once

#include "kernels/result.hpp"
#include "kernels/t2i/captions.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace starling::kernels {

class stage_module;

/// How the next image token is drawn.
struct sampling_options {
  /// Divides the logits; 0 picks the most likely token (greedy, no randomness).
  double temperature = 1.0;
  /// Draw among the k most likely image tokens only (0: all K).
  int64_t top_k = 0;
  /// Seed of the draws: the same model, caption, options and seed give the same tokens.
  uint64_t seed = 0;
};

/// `samples` images' tokens (samples × image_tokens, image after image) for `caption`, drawn from
/// `gpt` (a whole model: first and last stage) restricted to image tokens [0, K). Fails on a bad
/// caption, on invalid options, on a model whose vocabulary is not the layout's, or on one whose
/// sequence length cannot hold the prompt and the image. Leaves the model in eval mode.
result<std::vector<int64_t>> sample_image_tokens(stage_module& gpt, const t2i_layout& layout,
                                                 const std::string& caption, std::size_t samples,
                                                 const sampling_options& opts);

/// `samples` images' tokens for each of `captions` at once (one batch of captions × samples
/// sequences: 49 forward passes whatever the captions' count), as `sample_image_tokens` would
/// draw them except that the draws of all captions come from one generator seeded by
/// `opts.seed`. Result r holds caption r's samples × image_tokens tokens.
result<std::vector<std::vector<int64_t>>> sample_captions(stage_module& gpt,
                                                          const t2i_layout& layout,
                                                          const std::vector<std::string>& captions,
                                                          std::size_t samples,
                                                          const sampling_options& opts);

/// Makes `gpt`'s loss the mean cross-entropy over the image positions only (inputs are
/// sequence[0, n-1), targets sequence[1, n); positions from the separator on predict image
/// tokens): the captions are given, not learned. Its target check wants int64 targets of the
/// input's shape and length `layout.sequence_length() - 1`, each in [0, vocab).
void use_image_loss(stage_module& gpt, const t2i_layout& layout);

} // namespace starling::kernels
