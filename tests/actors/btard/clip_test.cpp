#include "actors/btard/clip.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/seeded_hash.hpp"

namespace starling::test::btard_clip {

namespace btard = starling::actors::btard;

namespace {

using rows = std::vector<std::vector<float>>;

double uniform(kernels::splitmix64_stream& rng) {
  return static_cast<double>(rng.next() >> 11) * 0x1p-53;
}

double normal(kernels::splitmix64_stream& rng) {
  double u1 = 1.0 - uniform(rng);
  double u2 = uniform(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

std::vector<const float*> pointers(const rows& g) {
  std::vector<const float*> out;
  for (auto& r : g)
    out.push_back(r.data());
  return out;
}

/// Sum of squares of `d` in the stated lanes: lane k mod 8 in index order, lanes in order.
struct lanes {
  double lane[8] = {};
  void add(size_t k, double v) { lane[k % 8] += v; }
  double total() const {
    double s = 0.0;
    for (double l : lane)
      s += l;
    return s;
  }
};

struct reference_outcome {
  std::vector<float> value;
  size_t iterations = 0;
  bool converged = false;
  size_t clipped = 0;
};

/// clip.hpp's function written out plainly (std::sort for the median, one loop per quantity),
/// for a bit-for-bit comparison with the kernel's fused, vectorized passes.
reference_outcome reference(const rows& g, double tau, size_t max_iterations, double tol) {
  const size_t n = g.size(), d = g[0].size();
  std::vector<double> x(d), col(n);
  for (size_t k = 0; k < d; ++k) {
    for (size_t j = 0; j < n; ++j)
      col[j] = g[j][k];
    std::sort(col.begin(), col.end());
    x[k] = n % 2 == 1 ? col[n / 2] : (col[n / 2 - 1] + col[n / 2]) / 2.0;
  }
  auto distances = [&] {
    std::vector<double> out(n);
    for (size_t j = 0; j < n; ++j) {
      lanes l;
      for (size_t k = 0; k < d; ++k) {
        double diff = static_cast<double>(g[j][k]) - x[k];
        l.add(k, diff * diff);
      }
      out[j] = std::sqrt(l.total());
    }
    return out;
  };
  reference_outcome out;
  auto dist = distances();
  for (size_t it = 0; it < max_iterations; ++it) {
    std::vector<double> step(d, 0.0);
    for (size_t j = 0; j < n; ++j) {
      double w = dist[j] > tau ? tau / dist[j] : 1.0;
      for (size_t k = 0; k < d; ++k)
        step[k] += w * (static_cast<double>(g[j][k]) - x[k]);
    }
    lanes s2;
    for (size_t k = 0; k < d; ++k) {
      step[k] /= static_cast<double>(n);
      x[k] += step[k];
      s2.add(k, step[k] * step[k]);
    }
    dist = distances();
    out.iterations = it + 1;
    if (std::sqrt(s2.total()) <= tol) {
      out.converged = true;
      break;
    }
  }
  for (double v : dist)
    out.clipped += v > tau ? 1 : 0;
  out.value.assign(x.begin(), x.end());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// n rows of d values around a common centre, the first b of them far away.
rows random_rows(kernels::splitmix64_stream& rng, size_t n, size_t d, size_t b) {
  std::vector<double> centre(d);
  for (auto& c : centre)
    c = normal(rng);
  rows g(n, std::vector<float>(d));
  for (size_t j = 0; j < n; ++j)
    for (size_t k = 0; k < d; ++k)
      g[j][k] = static_cast<float>(centre[k] + 0.3 * normal(rng) + (j < b ? 20.0 : 0.0));
  return g;
}

} // namespace

TEST_CASE("the median network sorts every input of 0s and 1s (n <= 16) and random inputs") {
  for (size_t n = 1; n <= 16; ++n) {
    auto net = btard::sorting_network(n);
    // The 0-1 principle: a comparator network that sorts every 0/1 input sorts every input.
    for (uint32_t bits = 0; bits < (uint32_t{1} << n); ++bits) {
      std::vector<int> v(n);
      for (size_t i = 0; i < n; ++i)
        v[i] = (bits >> i) & 1;
      for (auto [a, b] : net)
        if (v[b] < v[a])
          std::swap(v[a], v[b]);
      CAPTURE(n);
      CAPTURE(bits);
      REQUIRE(std::is_sorted(v.begin(), v.end()));
    }
  }
  CHECK(btard::sorting_network(16).size() == 63); // Batcher's count for 16
  kernels::splitmix64_stream rng{4201};
  for (size_t n : {17, 23, 31, 33, 64, 100, 255, 256}) {
    auto net = btard::sorting_network(n);
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<double> v(n);
      for (auto& x : v)
        x = normal(rng);
      auto want = v;
      std::sort(want.begin(), want.end());
      for (auto [a, b] : net) {
        REQUIRE(a < b);
        REQUIRE(b < n);
        if (v[b] < v[a])
          std::swap(v[a], v[b]);
      }
      CAPTURE(n);
      REQUIRE(v == want);
    }
  }
}

TEST_CASE("centered_clip_fp64 is the stated function bit for bit, for any size and count") {
  kernels::splitmix64_stream rng{4202};
  // Sizes around the lane (8) and block (256) edges, counts odd and even, with outliers.
  for (size_t d : {1, 3, 8, 9, 255, 256, 257, 1000, 2053})
    for (size_t n : {1, 2, 3, 8, 16, 17}) {
      size_t b = n >= 3 ? (n - 1) / 2 : 0;
      auto g = random_rows(rng, n, d, b);
      double tau = 0.5 * std::sqrt(static_cast<double>(d));
      auto want = reference(g, tau, 200, 1e-9);
      auto got = btard::centered_clip_fp64(pointers(g), d, tau, 200, 1e-9);
      REQUIRE(got);
      CAPTURE(d);
      CAPTURE(n);
      CHECK(same_bits(got->value, want.value));
      CHECK(got->iterations == want.iterations);
      CHECK(got->converged == want.converged);
      CHECK(got->clipped == want.clipped);
      if (b > 0 && d >= 8)
        CHECK(got->clipped >= b); // the outliers end clipped
    }
}

TEST_CASE("centered_clip_fp64: one input is its own aggregate; the cap stops a slow one") {
  rows one{{1.5f, -2.0f, 3.25f}};
  auto c = btard::centered_clip_fp64(pointers(one), 3, 1.0, 10, 1e-6);
  REQUIRE(c);
  CHECK(same_bits(c->value, one[0]));
  CHECK(c->converged);
  CHECK(c->iterations == 1);
  // No inputs clipped: the first step lands on the mean, the second is 0.
  rows three{{0.0f, 0.0f}, {0.5f, 0.0f}, {0.0f, 0.25f}};
  auto m = btard::centered_clip_fp64(pointers(three), 2, 10.0, 10, 1e-12);
  REQUIRE(m);
  CHECK(m->converged);
  CHECK(m->iterations == 2);
  CHECK(m->value[0] == doctest::Approx(0.5 / 3));
  CHECK(m->value[1] == doctest::Approx(0.25 / 3));
  kernels::splitmix64_stream rng{4203};
  auto g = random_rows(rng, 16, 100, 7);
  auto capped = btard::centered_clip_fp64(pointers(g), 100, 1.0, 2, 1e-12);
  REQUIRE(capped);
  CHECK_FALSE(capped->converged);
  CHECK(capped->iterations == 2);
  // Empty parts (a model smaller than the group) have an empty aggregate.
  auto empty = btard::centered_clip_fp64({nullptr, nullptr}, 0, 1.0, 5, 1e-6);
  REQUIRE(empty);
  CHECK(empty->value.empty());
  CHECK(empty->converged);
}

TEST_CASE("centered_clip_fp64 and mean_fp64 refuse bad inputs with a reason") {
  rows g{{1.0f}, {2.0f}};
  CHECK_FALSE(btard::centered_clip_fp64({}, 1, 1.0, 5, 1e-6));
  CHECK_FALSE(btard::centered_clip_fp64({g[0].data(), nullptr}, 1, 1.0, 5, 1e-6));
  CHECK_FALSE(btard::centered_clip_fp64(pointers(g), 1, 0.0, 5, 1e-6));
  CHECK_FALSE(btard::centered_clip_fp64(pointers(g), 1, NAN, 5, 1e-6));
  CHECK_FALSE(btard::centered_clip_fp64(pointers(g), 1, 1.0, 5, -1.0));
  CHECK_FALSE(btard::centered_clip_fp64(pointers(g), 1, 1.0, 5, INFINITY));
  CHECK_FALSE(btard::mean_fp64({}, 1));
  CHECK_FALSE(btard::mean_fp64({nullptr}, 1));
  auto bad = btard::centered_clip_fp64({nullptr}, 1, 1.0, 5, 1e-6);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().what.find("without values") != std::string::npos);
}

TEST_CASE("mean_fp64 sums in fp64 in input order and rounds once") {
  kernels::splitmix64_stream rng{4204};
  for (size_t d : {1, 7, 256, 300}) {
    auto g = random_rows(rng, 16, d, 0);
    std::vector<float> want(d);
    for (size_t k = 0; k < d; ++k) {
      double acc = 0.0;
      for (auto& r : g)
        acc += r[k];
      want[k] = static_cast<float>(acc / 16.0);
    }
    auto got = btard::mean_fp64(pointers(g), d);
    REQUIRE(got);
    CHECK(same_bits(*got, want));
  }
}

} // namespace starling::test::btard_clip
