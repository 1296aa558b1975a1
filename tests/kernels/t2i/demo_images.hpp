// Images for the text-to-image tests: Fashion-MNIST when installed (scripts/install-deps installs
// dataset-fashion-mnist), else the deterministic synthetic stand-in of the same shape.
#pragma once

#include "kernels/data/idx.hpp"

#include <string>

namespace starling::test {

/// The first `count` images of the training (`train`) or test split, 28×28, 10 classes.
inline kernels::image_set demo_images(std::size_t count, bool train) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (kernels::fashion_mnist_present(dir))
    if (auto s = kernels::load_fashion_mnist(dir, train, count); s.ok())
      return std::move(*s);
  return kernels::make_synthetic_images(count, 28, 10, 3, train ? 0 : 1);
}

} // namespace starling::test
