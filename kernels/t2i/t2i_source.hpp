// The text-to-image demo's training data: Fashion-MNIST images as [caption | separator | image
// tokens] sequences (kernels/t2i/captions.hpp) for the built-in GPT, the image tokens from a
// patch codebook every process fits from the same images and seed (its digest checked against
// the one the run's file pins, when it pins one). A data source like the others, so the
// data-parallel peer trains it unchanged.
#pragma once

#include "kernels/data/data_source.hpp"
#include "kernels/data/idx.hpp"
#include "kernels/data/idx_source.hpp"
#include "kernels/t2i/captions.hpp"
#include "kernels/t2i/codebook.hpp"
#include "kernels/t2i/tokenizer.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace starling::kernels {

/// Where the demo's images come from and how they become tokens.
struct t2i_data_options {
  /// The training images (`dir`, `max_items`, the synthetic stand-in); `train` is ignored: the
  /// training split trains, the test split is held out.
  idx_source_options images;
  /// The codebook's fit (K, patch side, images it is fit on, iterations, seed).
  codebook_options codebook;
  /// The digest the codebook must have (64 hex digits; empty: not checked). A process whose fit
  /// gives another digest (other images, another seed, another LibTorch build) refuses to start.
  std::string codebook_digest;
  /// Seed of each sample's caption phrasing.
  uint64_t caption_seed = 0;
  /// Held-out test images (the first ones; 0: all).
  std::size_t eval_images = 1000;
};

/// Checks the options that do not need the data (K, patch, iterations, the digest's form).
status validate(const t2i_data_options& opts);

/// Sample i is image i as one sequence: inputs sequence[0, n-1) and targets sequence[1, n), int64
/// [B, n-1]; its caption is its class's in phrasing `phrasing_for(caption_seed, i)`.
class t2i_source : public data_source {
public:
  /// A source over `images` with `codebook`; fails on an empty set, on images the codebook's
  /// patch does not tile, or on an invalid codebook.
  static result<std::shared_ptr<const t2i_source>>
  make(std::shared_ptr<const image_set> images, std::shared_ptr<const patch_codebook> codebook,
       uint64_t caption_seed);

  /// Number of images.
  uint64_t size() const override { return images_->count; }

  /// "captioned images <source> (N of RxC as T tokens, K codes)".
  std::string describe() const override;

  /// {n - 1} tokens; the vocabulary as the class count.
  sample_shape shape() const override;

  /// The sequences of `ids`, tokenized as they are read.
  result<sample_batch> batch(const std::vector<uint64_t>& ids) const override;

  /// The images.
  const image_set& images() const noexcept { return *images_; }
  /// The codebook.
  const patch_codebook& codebook() const noexcept { return *codebook_; }
  /// The token layout (K codes, tokens per image).
  const t2i_layout& layout() const noexcept { return layout_; }

private:
  t2i_source(std::shared_ptr<const image_set> images,
             std::shared_ptr<const patch_codebook> codebook, t2i_layout layout,
             uint64_t caption_seed);

  std::shared_ptr<const image_set> images_;
  std::shared_ptr<const patch_codebook> codebook_;
  t2i_layout layout_;
  uint64_t caption_seed_;
};

/// The training source, the held-out one and what fitting the codebook reported.
struct t2i_split {
  std::shared_ptr<const t2i_source> train;
  std::shared_ptr<const t2i_source> eval;
  /// Lloyd iterations, mean squared error, patches.
  codebook_fit fit;
  /// `codebook_digest` of the codebook.
  std::string digest;
  /// Seconds the fit took.
  double fit_seconds = 0;
};

/// Loads both splits, fits the codebook on the training images (the same images and seed give
/// the same codebook on one build), checks its digest against `opts.codebook_digest` when set
/// (the failure names both digests), and makes the two sources.
result<t2i_split> make_t2i_split(const t2i_data_options& opts);

/// A key that differs between options that make different splits (for caches).
std::string cache_key(const t2i_data_options& opts);

} // namespace starling::kernels
