#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>

#include <torch/torch.h>

#include "actors/vi/adversarial.hpp"
#include "actors/vi/masha.hpp"

namespace starling::test::actors_adversarial_test {

using namespace starling;
using namespace starling::actors::vi;

namespace {

/// 2 workers × 5 generated 3 × 3 images of 3 classes: small enough to check every coordinate.
adversarial_problem tiny_problem() {
  adversarial_options o;
  o.workers = 2;
  o.train_per_worker = 5;
  o.test_images = 6;
  o.epsilon = 0.3;
  o.lambda = 0.02;
  o.beta = 0.05;
  o.synthetic = true;
  o.synthetic_side = 3;
  o.synthetic_classes = 3;
  o.seed = 4;
  auto p = adversarial_problem::make(o);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().what));
  return std::move(*p);
}

/// A random point with δ inside the ball.
std::vector<double> random_point(const adversarial_problem& p, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::normal_distribution<double> normal{0.0, 0.7};
  std::vector<double> z(p.dim());
  for (auto& v : z)
    v = normal(rng);
  p.prox(z);
  return z;
}

} // namespace

TEST_CASE("the adversarial operator is (grad_theta f_m, -grad_delta f_m) as autograd and finite "
          "differences compute it") {
  auto p = tiny_problem();
  const auto c = static_cast<int64_t>(p.classes());
  const auto px = static_cast<int64_t>(p.pixels());
  CHECK(p.dim() == static_cast<std::size_t>(c * px + c + px));
  for (uint64_t seed : {1u, 2u}) {
    const auto z = random_point(p, seed);
    for (std::size_t m = 0; m < p.workers(); ++m) {
      // The objective written out independently, differentiated by autograd.
      const auto& s = p.shard(m);
      auto x = torch::from_blob(const_cast<float*>(s.pixels.data()),
                                {static_cast<int64_t>(s.count), px}, torch::kFloat32)
                 .to(torch::kFloat64);
      auto labels = torch::tensor(std::vector<int64_t>(s.labels.begin(), s.labels.end()));
      auto zt = torch::tensor(z, torch::kFloat64);
      auto w = zt.slice(0, 0, c * px).view({c, px}).clone().requires_grad_(true);
      auto b = zt.slice(0, c * px, c * px + c).clone().requires_grad_(true);
      auto d = zt.slice(0, c * px + c).clone().requires_grad_(true);
      auto logits = (x + d).matmul(w.t()) + b;
      auto f = torch::nn::functional::cross_entropy(logits, labels) +
               0.5 * p.options().lambda * w.pow(2).sum() - 0.5 * p.options().beta * d.pow(2).sum();
      f.backward();
      auto expected =
        torch::cat({w.grad().reshape({-1}), b.grad(), -d.grad()}).contiguous();
      std::vector<double> got;
      p.apply(m, z, got);
      REQUIRE(got.size() == p.dim());
      double max_diff = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        max_diff = std::max(max_diff, std::abs(got[i] - expected[static_cast<int64_t>(i)].item<double>()));
      CHECK(max_diff < 2e-6); // the operator computes in float32
      // The shard keeps float32 pixels, loss() the float64 ones: equal to float rounding.
      CHECK(p.loss(m, z) == doctest::Approx(f.item<double>()).epsilon(1e-6));
      // And by central finite differences of f_m itself, every coordinate.
      const double h = 1e-6;
      double fd_diff = 0;
      for (std::size_t i = 0; i < z.size(); ++i) {
        auto zp = z, zm = z;
        zp[i] += h;
        zm[i] -= h;
        const double grad = (p.loss(m, zp) - p.loss(m, zm)) / (2 * h);
        const double sign = i >= p.delta_offset() ? -1.0 : 1.0;
        fd_diff = std::max(fd_diff, std::abs(sign * grad - got[i]));
      }
      CHECK(fd_diff < 2e-6);
    }
  }
}

TEST_CASE("the adversarial prox projects only the perturbation onto the L-inf ball") {
  auto p = tiny_problem();
  std::vector<double> z(p.dim(), 5.0);
  z.back() = -5.0;
  p.prox(z);
  for (std::size_t i = 0; i < p.delta_offset(); ++i)
    CHECK(z[i] == 5.0);
  for (std::size_t i = p.delta_offset(); i + 1 < z.size(); ++i)
    CHECK(z[i] == doctest::Approx(0.3));
  CHECK(z.back() == doctest::Approx(-0.3));
}

TEST_CASE("adversarial problem options and data are validated") {
  adversarial_options o;
  o.synthetic = true;
  o.synthetic_side = 4;
  o.workers = 0;
  CHECK_FALSE(adversarial_problem::make(o).ok());
  o.workers = 2;
  o.epsilon = -1;
  CHECK_FALSE(adversarial_problem::make(o).ok());
  o.epsilon = 0.1;
  o.synthetic_classes = 1;
  CHECK_FALSE(adversarial_problem::make(o).ok());
  o.synthetic_classes = 10;
  auto train = kernels::make_synthetic_images(10, 4, 10, 1);
  auto test = kernels::make_synthetic_images(10, 5, 10, 1);
  o.train_per_worker = 5;
  auto r = adversarial_problem::make(o, train, test);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().what.find("expected equal sizes") != std::string::npos);
  o.train_per_worker = 6; // 12 images needed, 10 given
  CHECK_FALSE(adversarial_problem::make(o, train, train).ok());
  // Absent data set: the generated stand-in, and the problem says so.
  adversarial_options absent;
  absent.data_dir = "/nonexistent/fashion-mnist";
  absent.workers = 2;
  absent.train_per_worker = 5;
  absent.test_images = 5;
  auto fb = adversarial_problem::make(absent);
  REQUIRE(fb.ok());
  CHECK(fb->fell_back());
  CHECK(fb->pixels() == 28 * 28);
}

TEST_CASE("a short extragradient run improves adversarial accuracy and loss on the stand-in data") {
  adversarial_options o;
  o.workers = 4;
  o.train_per_worker = 50;
  o.test_images = 200;
  o.epsilon = 0.1;
  o.synthetic = true;
  o.synthetic_side = 8;
  o.seed = 2;
  auto made = adversarial_problem::make(o);
  REQUIRE(made.ok());
  auto p = std::make_shared<const adversarial_problem>(std::move(*made));
  method_options mo;
  mo.method = method_kind::extragradient;
  mo = recommended_options(mo, *p);
  CHECK(mo.gamma == doctest::Approx(0.5 / p->lipschitz()));
  std::vector<double> z;
  auto st = run_cores(p, mo, 150, [&](const worker_core& w0) {
    z = w0.z();
    return true;
  });
  REQUIRE(st.ok());
  REQUIRE(z.size() == p->dim());
  const auto before = p->evaluate(std::vector<double>(p->dim(), 0.0));
  const auto after = p->evaluate(z);
  MESSAGE("before: clean " << before.clean_accuracy << " adversarial " << before.adversarial_accuracy
                           << " loss " << before.adversarial_loss << "; after 150 iterations: clean "
                           << after.clean_accuracy << " adversarial " << after.adversarial_accuracy
                           << " loss " << after.adversarial_loss);
  CHECK(before.adversarial_accuracy <= 0.15); // the zero model predicts one class
  CHECK(after.adversarial_accuracy > before.adversarial_accuracy + 0.3);
  CHECK(after.adversarial_loss < before.adversarial_loss - 0.3);
  CHECK(after.adversarial_accuracy <= after.clean_accuracy);
  for (std::size_t i = p->delta_offset(); i < z.size(); ++i)
    CHECK(std::abs(z[i]) <= o.epsilon + 1e-15);
}

} // namespace starling::test::actors_adversarial_test
