// The end of a text-to-image run: from the trained GPT, `grid.png` (a row per caption, its
// samples side by side) and `quality.json` (a classifier trained here on the training images:
// its accuracy on real test images, on their codebook reconstructions, and on the images
// generated per caption). LibTorch stays in the source.
#pragma once

#include "kernels/result.hpp"
#include "kernels/t2i/quality.hpp"
#include "kernels/t2i/t2i_source.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace starling::kernels {

class stage_module;

/// What the demo's outputs sample and measure.
struct t2i_demo_options {
  /// Samples per caption in grid.png (the first ones drawn).
  std::size_t grid_samples = 8;
  /// Samples per caption the classifier judges (at least `grid_samples` are drawn either way).
  std::size_t quality_samples = 32;
  /// Sampling temperature (0: greedy).
  double temperature = 1.0;
  /// Draw among the k most likely image tokens (0: all).
  int64_t top_k = 0;
  /// Test images the real and reconstruction accuracies are measured on (the first ones).
  std::size_t test_images = 1000;
  /// The classifier (trained on the training source's images).
  classifier_options classifier;
  /// Seed of the samples (caption c draws from splitmix64_combine(seed, c)).
  uint64_t seed = 0;
};

/// Checks the options (samples ≥ 1, temperature finite and ≥ 0, top_k ≥ 0, test images ≥ 1,
/// classifier epochs and batch ≥ 1).
status validate(const t2i_demo_options& o);

/// What the outputs hold, and where they went.
struct t2i_demo_outputs {
  /// The three accuracies (and the codebook's digest).
  quality_report report;
  /// Paths written.
  std::string grid_png, quality_json;
  /// Seconds spent training the classifier and sampling.
  double classifier_seconds = 0, sampling_seconds = 0;
};

/// Writes `dir`/grid.png and `dir`/quality.json for `gpt` (a whole GPT over `train`'s layout):
/// one row per Fashion-MNIST class captioned in phrasing 0 ("a photo of a ..."), in class order.
result<t2i_demo_outputs> write_t2i_demo(stage_module& gpt, const t2i_source& train,
                                        const t2i_source& test, const std::string& digest,
                                        const t2i_demo_options& o, const std::string& dir);

} // namespace starling::kernels
