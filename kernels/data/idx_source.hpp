// Labeled images (Fashion-MNIST from idx files) as samples.
#pragma once

#include "kernels/data/data_source.hpp"
#include "kernels/data/idx.hpp"

#include <memory>

namespace starling::kernels {

/// Where the images come from and how they are shaped.
struct idx_source_options {
  /// Folder with the four Fashion-MNIST files (Debian's dataset-fashion-mnist installs them
  /// here).
  std::string dir = "/usr/share/datasets/fashion-mnist";
  /// The training split (train-*), else the test split (t10k-*).
  bool train = true;
  /// Read only the first images (0: all).
  std::size_t max_items = 0;
  /// Images as [B, rows·cols] (for MLPs), else [B, 1, rows, cols] (for CNNs).
  bool flatten = true;
  /// When the files are absent, use `make_synthetic_images` (28×28, 10 classes, `max_items` or
  /// 60000/10000 images) instead of failing; off by default so a missing data set is noticed.
  bool synthetic_when_absent = false;
  /// Seed of the synthetic stand-in's prototypes.
  uint64_t synthetic_seed = 0;
};

/// Sample i is image i with its label: inputs float32 pixels in [0, 1], targets int64 [B].
class idx_source : public data_source {
public:
  /// A source over `images`; fails on an empty set.
  static result<std::shared_ptr<const idx_source>> make(std::shared_ptr<const image_set> images,
                                                        bool flatten = true);

  /// Loads the split `opts` names (see `load_fashion_mnist` for its errors), or the synthetic
  /// stand-in when allowed and the files are absent.
  static result<std::shared_ptr<const idx_source>> load(const idx_source_options& opts);

  /// Number of images.
  uint64_t size() const override { return images_->count; }

  /// "images <source> (N of RxC, K classes)".
  std::string describe() const override;

  /// {rows·cols} (flattened) or {1, rows, cols} pixels; the set's classes.
  sample_shape shape() const override;

  /// The images and labels `ids`.
  result<sample_batch> batch(const std::vector<uint64_t>& ids) const override;

  /// The images.
  const image_set& images() const noexcept { return *images_; }

private:
  idx_source(std::shared_ptr<const image_set> images, bool flatten);

  std::shared_ptr<const image_set> images_;
  bool flatten_;
};

} // namespace starling::kernels
