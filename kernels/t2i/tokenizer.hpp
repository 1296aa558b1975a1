// Images as patch tokens: the k-means codebook over image patches (fit once by the run's first
// node), image → tokens (nearest code per patch, row-major over the patch grid) and tokens →
// image. LibTorch stays in the source; callers pass plain vectors.
#pragma once

#include "kernels/data/idx.hpp"
#include "kernels/result.hpp"
#include "kernels/t2i/codebook.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace starling::kernels {

/// How the codebook is fit (k-means++ seeding, then Lloyd iterations).
struct codebook_options {
  /// Number of codes K (the demo uses 256–512).
  std::size_t codes = 256;
  /// Patch side in pixels; must divide the image's rows and columns.
  uint32_t patch = 4;
  /// Use at most this many images (the first ones; 0: all).
  std::size_t max_images = 10000;
  /// k-means++ draws its seeds from at most this many patches, chosen by the seed (0: all).
  std::size_t seeding_pool = 65536;
  /// At most this many Lloyd iterations.
  int max_iterations = 25;
  /// Stop when an iteration lowers the mean squared distance by less than this fraction.
  double tolerance = 1e-4;
  /// Seed of the seeding pool, the k-means++ draws and nothing else.
  uint64_t seed = 0;
};

/// What fitting reports besides the codebook.
struct codebook_fit {
  /// The codes.
  patch_codebook codebook;
  /// Lloyd iterations run.
  int iterations = 0;
  /// Mean squared distance of a patch pixel to its code's (per pixel) after the last iteration.
  double mse = 0.0;
  /// Empty clusters re-seeded over all iterations.
  std::size_t reseeded = 0;
  /// Patches the codebook was fit on.
  std::size_t patches = 0;
};

/// Fits a codebook to the patches of `images`: k-means++ seeds from a seeded pool of patches,
/// then Lloyd iterations (assignments by squared distance, means accumulated in double) until the
/// cap or the tolerance. An empty cluster takes the patch farthest from its code among those not
/// yet taken, so the result depends on the inputs and the seed only (on one build and thread
/// count; floating-point sums are not promised to be equal across BLAS builds). Fails on invalid
/// options (codes < 1 or above the patch count, patch not dividing the image).
result<codebook_fit> fit_codebook(const image_set& images, const codebook_options& opts);

/// Tokens per image: (rows / patch) × (cols / patch).
std::size_t tokens_per_image(const patch_codebook& cb, std::size_t rows, std::size_t cols);

/// The tokens of `count` images (`pixels` count × rows × cols, row-major): per image its patches
/// in row-major order of the patch grid, each the index of its nearest code (the lowest index on a
/// tie). Fails when the patch does not divide rows and cols or `pixels` has the wrong size.
result<std::vector<int64_t>> tokenize_images(const patch_codebook& cb,
                                             const std::vector<float>& pixels, std::size_t count,
                                             std::size_t rows, std::size_t cols);

/// The images of `tokens` (a whole number of images' worth), each patch its code's pixels;
/// fails on a token outside [0, K) or a count not a multiple of the tokens per image.
result<std::vector<float>> detokenize_images(const patch_codebook& cb,
                                             const std::vector<int64_t>& tokens, std::size_t rows,
                                             std::size_t cols);

} // namespace starling::kernels
