// MNIST-style idx files (gzip'd or plain) and labeled image sets: the Fashion-MNIST loader with
// strict validation, and a small deterministic generated stand-in for when the data set is absent.
// No LibTorch: plain vectors, so headers that include this stay light.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::kernels {

/// An idx array of unsigned bytes (element type 0x08, the only one MNIST-style files use).
struct idx_array {
  /// Sizes, outermost first (dims[0] is the item count; only the items read are counted).
  std::vector<uint32_t> dims;
  /// The elements, row-major.
  std::vector<uint8_t> data;
};

/// Reads an idx file, gzip'd or plain (zlib reads plain files through). Reads only the first
/// `max_items` items along dims[0] when `max_items` > 0 and the file has more (dims[0] is then
/// `max_items`). Fails with a message naming the file on: a missing file, a bad magic number
/// (first two bytes not zero, element type not 0x08, 0 or more than 4 dimensions), a zero or
/// oversized dimension, fewer data bytes than the header announces (truncated), and — when the
/// whole file is read — bytes after the last item.
result<idx_array> read_idx(const std::string& path, std::size_t max_items = 0);

/// Labeled grayscale images.
struct image_set {
  /// Number of images.
  std::size_t count = 0;
  /// Image height.
  std::size_t rows = 0;
  /// Image width.
  std::size_t cols = 0;
  /// Number of classes; every label is below it.
  std::size_t classes = 10;
  /// count × rows × cols values, row-major per image (in [0, 1] as loaded).
  std::vector<float> pixels;
  /// count labels.
  std::vector<uint8_t> labels;
  /// Where it came from (a path or "generated(seed ...)"), for logs.
  std::string source;

  /// rows × cols.
  std::size_t pixels_per_image() const { return rows * cols; }
};

/// Images from an idx3 file and labels from an idx1 file, the first `max_items` of each (all
/// when 0), pixels scaled to [0, 1]. Fails on any `read_idx` failure, on wrong ranks (images
/// need 3 dimensions, labels 1), on different image and label counts, and on a label ≥ 10.
result<image_set> load_idx_images(const std::string& images_path, const std::string& labels_path,
                                  std::size_t max_items = 0);

/// Fashion-MNIST's training (`train` = true: train-images-idx3-ubyte.gz, ...) or test
/// (t10k-...) split from `dir` (Debian's dataset-fashion-mnist installs it under
/// /usr/share/datasets/fashion-mnist), first `max_items` images.
result<image_set> load_fashion_mnist(const std::string& dir, bool train, std::size_t max_items = 0);

/// True when `dir` holds the four Fashion-MNIST files.
bool fashion_mnist_present(const std::string& dir);

/// A deterministic stand-in: `classes` smooth random prototype images of side × side pixels (one
/// per class, from `seed`), each image its class's prototype plus Gaussian noise of std `noise`,
/// clamped to [0, 1]; labels cycle through the classes. The noise is drawn from a stream chosen by
/// `stream` (e.g. 0 for training, 1 for test images of the same prototypes). Same arguments, same
/// images.
image_set make_synthetic_images(std::size_t count, std::size_t side, std::size_t classes,
                                uint64_t seed, uint64_t stream = 0, double noise = 0.35);

} // namespace starling::kernels
