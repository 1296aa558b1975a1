#include <doctest/doctest.h>
#include <torch/torch.h>

#include "kernels/aggregate/aggregate.hpp"

namespace starling::test::kernels_aggregate_test {

using namespace starling::kernels;

namespace {

constexpr int64_t dim = 1000;
constexpr int n_honest = 9;
constexpr int n_bad = 7;

struct scenario {
  std::vector<at::Tensor> inputs;
  at::Tensor honest_mean;
  double honest_radius = 0; // r = max over honest i of ‖gᵢ − honest mean‖
};

/// 9 honest vectors around a common center plus 7 outliers made by `make_bad`.
template <class MakeBad>
scenario make_scenario(uint64_t seed, MakeBad make_bad) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto center = torch::randn({dim}, gen, torch::kFloat64);
  scenario s;
  std::vector<at::Tensor> honest;
  for (int i = 0; i < n_honest; ++i)
    honest.push_back(center + 0.5 * torch::randn({dim}, gen, torch::kFloat64));
  s.honest_mean = torch::stack(honest).mean(0);
  for (auto& h : honest)
    s.honest_radius = std::max(s.honest_radius, (h - s.honest_mean).norm().item<double>());
  s.inputs = honest;
  for (int i = 0; i < n_bad; ++i)
    s.inputs.push_back(make_bad(gen, center));
  return s;
}

/// Runs CenteredClip on a scenario and checks the bound derived below.
///
/// Derivation. CenteredClip stops after a step from x of norm ‖Σᵢ wᵢ cᵢ (gᵢ − x)‖ / W ≤ tol, where
/// cᵢ = min(1, τ/‖gᵢ − x‖) and W = Σ wᵢ. Split the inputs into honest H and bad B. If every honest
/// input is unclipped at x (cᵢ = 1, i.e. ‖gᵢ − x‖ ≤ τ), the honest terms sum to W_H (μ_H − x),
/// where μ_H is the honest mean; each bad term has norm wᵢ cᵢ ‖gᵢ − x‖ ≤ wᵢ τ whatever the
/// outlier. Hence W_H ‖x − μ_H‖ ≤ W_B τ + W tol, i.e.
///     ‖x − μ_H‖ ≤ (W_B τ + W tol) / W_H   (= 7τ/9 + 16 tol/9 for unit weights here),
/// and the returned point x + step is at most tol farther.
/// The precondition holds if τ ≥ r + 7τ/9 (r = max honest ‖gᵢ − μ_H‖), i.e. τ ≥ 4.5 r; we take
/// τ = 5 r and also check the precondition on the result, so the bound is not assumed blindly.
/// With outliers along one common direction the bound is nearly attained (each pulls with τ in the
/// same direction), so it is the honest worst case, not a loose guess.
void check_clip_bound(const scenario& s) {
  const double tau = 5.0 * s.honest_radius;
  const double tol = 1e-6;
  std::vector<double> w(s.inputs.size(), 1.0);
  auto out = centered_clip(s.inputs, w, {tau, 1000, tol});
  REQUIRE(out.ok());
  CHECK(out->converged);
  const auto& x = out->value;
  for (int i = 0; i < n_honest; ++i)
    CHECK((s.inputs[i] - x).norm().item<double>() <= tau);
  const double bound = (n_bad * tau + (n_honest + n_bad) * tol) / n_honest + tol;
  const double err = (x - s.honest_mean).norm().item<double>();
  MESSAGE("CenteredClip error " << err << ", derived bound " << bound << ", r " << s.honest_radius);
  CHECK(err <= bound);
  auto plain = weighted_mean(s.inputs, w);
  REQUIRE(plain.ok());
  const double plain_err = (*plain - s.honest_mean).norm().item<double>();
  MESSAGE("plain mean error " << plain_err);
  // The plain mean is dragged by 7/16 of the outliers' ~1000x norm: far outside the bound.
  CHECK(plain_err > 50.0 * bound);
}

} // namespace

TEST_CASE("CenteredClip stays near the honest mean with 7 of 16 inputs scaled by 1000") {
  auto s = make_scenario(7, [](at::Generator& gen, const at::Tensor& center) {
    return 1000.0 * (center + 0.5 * torch::randn({dim}, gen, torch::kFloat64));
  });
  check_clip_bound(s);
}

TEST_CASE("CenteredClip stays near the honest mean with 7 outliers along a common direction") {
  auto gen0 = at::make_generator<at::CPUGeneratorImpl>(99);
  auto dir = torch::randn({dim}, gen0, torch::kFloat64);
  dir /= dir.norm();
  auto s = make_scenario(11, [&](at::Generator&, const at::Tensor& center) {
    return center + 1000.0 * center.norm() * dir;
  });
  check_clip_bound(s);
}

TEST_CASE("CenteredClip without outliers and a large tau equals the weighted mean") {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  std::vector<at::Tensor> in;
  std::vector<double> w;
  for (int i = 0; i < 16; ++i) {
    in.push_back(torch::randn({8, 16}, gen));
    w.push_back(1.0 + i % 3);
  }
  auto out = centered_clip(in, w, {1e9, 100, 1e-9});
  auto mean = weighted_mean(in, w);
  REQUIRE(out.ok());
  REQUIRE(mean.ok());
  CHECK((out->value.sizes() == in[0].sizes()));
  CHECK((out->value.scalar_type() == torch::kFloat32));
  CHECK((out->value - *mean).abs().max().item<double>() < 1e-5);
}

TEST_CASE("weighted mean, median and trimmed mean on a hand-made example") {
  std::vector<at::Tensor> in{torch::tensor({1.0, 10.0}), torch::tensor({2.0, 20.0}),
                             torch::tensor({3.0, 30.0}), torch::tensor({100.0, -1000.0})};
  auto mean = weighted_mean(in, {1, 1, 2, 0});
  REQUIRE(mean.ok());
  CHECK(torch::allclose(*mean, torch::tensor({2.25, 22.5}).to(torch::kFloat32)));
  auto med = coordinate_median(in);
  REQUIRE(med.ok());
  // Even count: the mean of the two middle values per coordinate.
  CHECK(torch::allclose(*med, torch::tensor({2.5, 15.0}).to(torch::kFloat32)));
  auto trimmed = trimmed_mean(in, 0.25);
  REQUIRE(trimmed.ok());
  CHECK(torch::allclose(*trimmed, torch::tensor({2.5, 15.0}).to(torch::kFloat32)));
  auto untrimmed = trimmed_mean(in, 0.0);
  REQUIRE(untrimmed.ok());
  CHECK(torch::allclose(*untrimmed, torch::tensor({26.5, -235.0}).to(torch::kFloat32)));
}

TEST_CASE("aggregation rejects empty input, mismatched shapes and bad weights") {
  std::vector<at::Tensor> none;
  CHECK_FALSE(weighted_mean(none, {}).ok());
  CHECK_FALSE(coordinate_median(none).ok());
  CHECK_FALSE(trimmed_mean(none, 0.1).ok());
  CHECK_FALSE(centered_clip(none, {}, {}).ok());

  std::vector<at::Tensor> mixed{torch::zeros({2, 3}), torch::zeros({3, 2})};
  auto r = weighted_mean(mixed, {1, 1});
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().what.find("[3, 2]") != std::string::npos);
  CHECK_FALSE(coordinate_median(mixed).ok());
  CHECK_FALSE(centered_clip(mixed, {1, 1}, {}).ok());

  std::vector<at::Tensor> two{torch::zeros({3}), torch::ones({3})};
  auto neg = centered_clip(two, {1, -1}, {});
  REQUIRE_FALSE(neg.ok());
  CHECK(neg.error().what.find("weight 1") != std::string::npos);
  CHECK_FALSE(weighted_mean(two, {1}).ok());
  CHECK_FALSE(weighted_mean(two, {0, 0}).ok());
  CHECK_FALSE(centered_clip(two, {1, 1}, {0.0, 10, 1e-6}).ok());
  CHECK_FALSE(trimmed_mean(two, 0.5).ok());
}

} // namespace starling::test::kernels_aggregate_test
