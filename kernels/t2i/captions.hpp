// Captions of the text-to-image demo and the joint sequence the GPT learns. Captions come from
// the Fashion-MNIST class in a few phrasings ("a photo of an ankle boot"); their words come from a
// small fixed vocabulary (every word of every phrasing: no out-of-vocabulary case, and 8 tokens
// per caption instead of ~30 bytes, which matters for a GPT trained on 2 CPU cores).
//
// Vocabulary layout (size K + 2 + words):
//   [0, K)            image tokens (codebook indices)
//   K                 separator: "the image starts here"
//   K + 1             padding after a caption's last word
//   K + 2 + w         caption word w of `caption_words()`
// Sequence: [caption words, padded to `caption_tokens` | separator | tokens_per_image image
// tokens]. The GPT is trained on sequence[0, n-1) → sequence[1, n) with the loss on the image
// positions only, and generates the image tokens after [caption | separator].
#pragma once

#include "kernels/result.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace starling::kernels {

/// Number of classes with captions (Fashion-MNIST's ten).
inline constexpr std::size_t caption_classes = 10;
/// Number of phrasings of each class's caption.
inline constexpr std::size_t caption_phrasings = 4;
/// Caption tokens in a sequence (the longest caption's words, then padding).
inline constexpr std::size_t caption_tokens = 8;

/// Class `label`'s noun with its article ("an ankle boot"); empty for a label ≥ 10.
std::string class_noun(std::size_t label);

/// Class `label`'s caption in phrasing `phrasing` (modulo the phrasings): "a photo of an ankle
/// boot", "a picture of an ankle boot", "an image of an ankle boot", "an ankle boot"; fails for a
/// label ≥ 10.
result<std::string> caption_for(std::size_t label, std::size_t phrasing);

/// The phrasing of sample `sample` for `seed`: a seeded hash modulo the phrasings, so every peer
/// pairs a sample with the same caption.
std::size_t phrasing_for(uint64_t seed, uint64_t sample);

/// The caption vocabulary, in token order (its index w is token K + 2 + w).
const std::vector<std::string>& caption_words();

/// Token layout for a codebook of `codes` entries and images of `image_tokens` tokens.
struct t2i_layout {
  /// K: image tokens are [0, K).
  int64_t codes = 256;
  /// Image tokens per image (49 for 28×28 images of 4×4 patches).
  int64_t image_tokens = 49;

  /// The separator token.
  int64_t separator() const noexcept { return codes; }
  /// The padding token.
  int64_t padding() const noexcept { return codes + 1; }
  /// The token of caption word w.
  int64_t word(std::size_t w) const noexcept { return codes + 2 + static_cast<int64_t>(w); }
  /// The vocabulary size the GPT needs.
  int64_t vocab() const noexcept;
  /// Tokens of [caption | separator] (the prompt).
  int64_t prompt_length() const noexcept { return static_cast<int64_t>(caption_tokens) + 1; }
  /// Tokens of a whole sequence (the GPT's seq_len must be at least this minus one).
  int64_t sequence_length() const noexcept { return prompt_length() + image_tokens; }
};

/// The caption's tokens, padded to `caption_tokens`; fails on a word not in the vocabulary or
/// more words than `caption_tokens`.
result<std::vector<int64_t>> caption_to_tokens(const t2i_layout& layout, const std::string& text);

/// [caption tokens | separator]: the prompt the sampler continues.
result<std::vector<int64_t>> prompt_tokens(const t2i_layout& layout, const std::string& caption);

/// [caption tokens | separator | image tokens]; fails on a bad caption, a wrong number of image
/// tokens or an image token outside [0, K).
result<std::vector<int64_t>> joint_sequence(const t2i_layout& layout, const std::string& caption,
                                            const std::vector<int64_t>& image_tokens);

} // namespace starling::kernels
