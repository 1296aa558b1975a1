#include "kernels/data/idx_source.hpp"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace starling::kernels {

idx_source::idx_source(std::shared_ptr<const image_set> images, bool flatten)
    : images_(std::move(images)), flatten_(flatten) {}

result<std::shared_ptr<const idx_source>> idx_source::make(std::shared_ptr<const image_set> images,
                                                           bool flatten) {
  if (images == nullptr || images->count == 0 || images->pixels_per_image() == 0)
    return fail("image source: no images");
  if (images->pixels.size() != images->count * images->pixels_per_image() ||
      images->labels.size() != images->count)
    return fail(fmt::format("image source {}: {} pixels and {} labels for {} images of {}x{}",
                            images->source, images->pixels.size(), images->labels.size(),
                            images->count, images->rows, images->cols));
  return std::shared_ptr<const idx_source>(new idx_source(std::move(images), flatten));
}

result<std::shared_ptr<const idx_source>> idx_source::load(const idx_source_options& opts) {
  if (opts.synthetic_when_absent && !fashion_mnist_present(opts.dir)) {
    const std::size_t count = opts.max_items > 0 ? opts.max_items : opts.train ? 60000 : 10000;
    auto set = make_synthetic_images(count, 28, 10, opts.synthetic_seed, opts.train ? 0 : 1);
    return make(std::make_shared<const image_set>(std::move(set)), opts.flatten);
  }
  auto set = load_fashion_mnist(opts.dir, opts.train, opts.max_items);
  if (!set)
    return set.error();
  return make(std::make_shared<const image_set>(std::move(*set)), opts.flatten);
}

std::string idx_source::describe() const {
  return fmt::format("images {} ({} of {}x{}, {} classes)", images_->source, images_->count,
                     images_->rows, images_->cols, images_->classes);
}

sample_shape idx_source::shape() const {
  auto rows = static_cast<int64_t>(images_->rows);
  auto cols = static_cast<int64_t>(images_->cols);
  auto classes = static_cast<int64_t>(images_->classes);
  if (flatten_)
    return {{rows * cols}, classes};
  return {{1, rows, cols}, classes};
}

result<sample_batch> idx_source::batch(const std::vector<uint64_t>& ids) const {
  const auto b = static_cast<int64_t>(ids.size());
  const auto p = images_->pixels_per_image();
  auto inputs = torch::empty({b, static_cast<int64_t>(p)}, torch::kFloat32);
  auto targets = torch::empty({b}, torch::kLong);
  auto* x = inputs.data_ptr<float>();
  auto* y = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const uint64_t id = ids[static_cast<std::size_t>(i)];
    if (id >= images_->count)
      return fail(fmt::format("image source {}: sample {} requested, it has {} images",
                              images_->source, id, images_->count));
    std::memcpy(x + i * static_cast<int64_t>(p), images_->pixels.data() + id * p,
                p * sizeof(float));
    y[i] = images_->labels[id];
  }
  if (!flatten_)
    inputs = inputs.view(
        {b, 1, static_cast<int64_t>(images_->rows), static_cast<int64_t>(images_->cols)});
  return sample_batch{inputs, targets};
}

} // namespace starling::kernels
