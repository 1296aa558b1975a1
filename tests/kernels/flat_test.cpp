#include "kernels/flat.hpp"
#include "kernels/models/mlp.hpp"

#include <doctest/doctest.h>

namespace starling::test::kernels_flat_test {

using namespace starling::kernels;

TEST_CASE("parameters flatten to one fp32 vector and back") {
  mlp_config cfg;
  auto a = make_mlp(cfg).value();
  cfg.seed = 5;
  auto b = make_mlp(cfg).value();
  auto pa = a->ordered_parameters();
  auto flat = flatten_parameters(pa);
  CHECK(flat.dim() == 1);
  CHECK((flat.scalar_type() == torch::kFloat));
  CHECK(flat.numel() == total_numel(pa));
  REQUIRE(unflatten_parameters(flat, b->ordered_parameters()).ok());
  auto pb = b->ordered_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    CHECK(torch::equal(pa[i], pb[i]));
}

TEST_CASE("a flat vector of the wrong size changes nothing") {
  auto m = make_mlp({}).value();
  auto params = m->ordered_parameters();
  auto before = flatten_parameters(params);
  CHECK_FALSE(unflatten_parameters(torch::zeros({before.numel() - 1}), params).ok());
  CHECK_FALSE(unflatten_parameters(torch::zeros({before.numel()}, torch::kLong), params).ok());
  CHECK_FALSE(unflatten_gradients(torch::zeros({1, before.numel()}), params).ok());
  CHECK(torch::equal(flatten_parameters(params), before));
}

TEST_CASE("gradients flatten with absent ones as zeros and load back") {
  auto m = make_mlp({}).value();
  auto params = m->ordered_parameters();
  auto n = total_numel(params);
  CHECK(torch::equal(flatten_gradients(params), torch::zeros({n})));
  auto values = torch::arange(n, torch::kFloat);
  REQUIRE(unflatten_gradients(values, params).ok());
  CHECK(torch::equal(flatten_gradients(params), values));
  REQUIRE(unflatten_gradients(2 * values, params).ok()); // overwrites existing gradients
  CHECK(torch::equal(flatten_gradients(params), 2 * values));
}

} // namespace starling::test::kernels_flat_test
