// How good the demo's generated images are: a small Fashion-MNIST classifier (an MLP trained on
// CPU from a seed) and its accuracy on real test images, on their codebook reconstructions (the
// ceiling generated images can reach) and on the images generated per caption (each labeled with
// its caption's class); `quality.json` holds the three.
#pragma once

#include "kernels/data/idx.hpp"
#include "kernels/result.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace starling::kernels {

/// How the classifier is trained.
struct classifier_options {
  /// Hidden layer width of the MLP (pixels → hidden → ReLU → hidden → ReLU → classes).
  int64_t hidden = 256;
  /// Passes over the training images.
  int epochs = 3;
  /// Images per step.
  int64_t batch = 128;
  /// Adam's learning rate.
  double learning_rate = 1e-3;
  /// Seed of the initial weights and the order of the images.
  uint64_t seed = 0;
};

/// A trained image classifier (LibTorch inside; the header stays light).
class image_classifier {
public:
  /// Trains on `train` (its pixels flattened); fails on an empty set or invalid options.
  static result<image_classifier> train(const image_set& train, const classifier_options& opts);

  image_classifier(image_classifier&&) noexcept;
  image_classifier& operator=(image_classifier&&) noexcept;
  ~image_classifier();

  /// The predicted class of each of `count` images (`pixels` count × pixels per image); fails on
  /// a size mismatch.
  result<std::vector<int64_t>> predict(const std::vector<float>& pixels, std::size_t count) const;

  /// The fraction of `labels.size()` images in `pixels` predicted as their label.
  result<double> accuracy(const std::vector<float>& pixels,
                          const std::vector<uint8_t>& labels) const;

  /// Pixels per image it takes.
  std::size_t input_size() const noexcept;

private:
  struct impl;
  explicit image_classifier(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// The accuracy on the images generated for one caption.
struct caption_quality {
  /// The caption.
  std::string caption;
  /// Its class (the label the generated images should get).
  std::size_t label = 0;
  /// Images generated.
  std::size_t samples = 0;
  /// Fraction the classifier put in `label`.
  double accuracy = 0.0;
};

/// What `quality.json` holds.
struct quality_report {
  /// Accuracy on real test images.
  double real = 0.0;
  /// Accuracy on the codebook reconstructions of the same test images: the ceiling.
  double reconstruction = 0.0;
  /// Test images both were measured on.
  std::size_t test_images = 0;
  /// Accuracy per caption on generated images.
  std::vector<caption_quality> generated;
  /// Digest of the codebook used (kernels/t2i/codebook.hpp).
  std::string codebook_digest;

  /// Mean of the per-caption accuracies (0 when none).
  double generated_mean() const noexcept;
};

/// The report as JSON text: {"classifier_accuracy": {"real", "reconstruction", "generated"},
/// "test_images", "codebook_digest", "per_caption": [{"caption", "label", "samples",
/// "accuracy"}...]}.
std::string quality_json(const quality_report& report);

/// Writes `quality_json(report)` to `path`.
status write_quality_json(const std::string& path, const quality_report& report);

} // namespace starling::kernels
