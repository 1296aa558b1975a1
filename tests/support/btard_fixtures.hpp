// The tiny BTARD task the protocol tests share: an 8-pixel MLP (hidden 16, batch 8) on synthetic
// images, built once per process.
#pragma once

#include <memory>

#include <doctest/doctest.h>

#include "actors/btard/task.hpp"
#include "kernels/data/idx.hpp"
#include "kernels/data/idx_source.hpp"

namespace starling::testing {

inline std::shared_ptr<const actors::btard::task> tiny_btard_task() {
  static std::shared_ptr<const actors::btard::task> t = [] {
    auto train = kernels::idx_source::make(
      std::make_shared<const kernels::image_set>(kernels::make_synthetic_images(512, 8, 10, 3, 0)));
    auto eval = kernels::idx_source::make(
      std::make_shared<const kernels::image_set>(kernels::make_synthetic_images(256, 8, 10, 3, 1)));
    REQUIRE(train);
    REQUIRE(eval);
    actors::btard::mlp_task_options o;
    o.hidden = 16;
    o.batch = 8;
    o.seed = 1;
    auto made = actors::btard::make_mlp_task(*train, *eval, o);
    REQUIRE(made);
    return *made;
  }();
  return t;
}

} // namespace starling::testing
