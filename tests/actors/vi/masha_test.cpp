#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "actors/vi/compressor.hpp"
#include "actors/vi/masha.hpp"
#include "actors/vi/problem.hpp"

namespace starling::test::actors_masha_test {

using namespace starling::actors::vi;
using starling::messages::vi_codec;
using starling::messages::vi_vector;

namespace {

std::shared_ptr<const bilinear_problem> default_problem() {
  static auto p = std::make_shared<const bilinear_problem>(*bilinear_problem::make({}));
  return p;
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (auto x : v)
    s += x * x;
  return std::sqrt(s);
}

/// Bits one worker transmits (uplink) and moves in both directions until `target`.
std::pair<double, double> bits_to(const run_report& r, double target) {
  for (const auto& p : r.trace)
    if (p.relative_error <= target)
      return {static_cast<double>(p.bits_up), static_cast<double>(p.bits_up + p.bits_down)};
  return {0, 0};
}

} // namespace

TEST_CASE("the bilinear problem's z* is the saddle point: F(z*) = 0, min over x, max over y") {
  auto p = default_problem();
  const auto& z = p->solution();
  std::vector<double> f;
  p->apply_mean(z, f);
  CHECK(norm(f) < 1e-9 * norm(z));
  const double at_star = p->objective(z);
  const auto n = p->dim() / 2;
  std::mt19937_64 rng{5};
  std::normal_distribution<double> normal;
  for (int trial = 0; trial < 5; ++trial) {
    auto zx = z;
    auto zy = z;
    for (std::size_t i = 0; i < n; ++i) {
      zx[i] += 0.1 * normal(rng);
      zy[n + i] += 0.1 * normal(rng);
    }
    CHECK(p->objective(zx) > at_star); // moving x raises f: x* minimizes
    CHECK(p->objective(zy) < at_star); // moving y lowers f: y* maximizes
  }
}

TEST_CASE("Rand-k is unbiased and sends only a seed and k values, Top-k keeps the largest") {
  std::vector<double> v(200);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = std::sin(0.37 * static_cast<double>(i)) * (1.0 + static_cast<double>(i % 7));
  auto rk = make_rand_k(20);
  CHECK(rk->parameter(200) == doctest::Approx(10.0));
  std::mt19937_64 rng{1};
  std::vector<double> mean(v.size(), 0.0);
  const int draws = 20000;
  for (int t = 0; t < draws; ++t) {
    auto c = rk->compress(v, rng);
    CHECK(c.bits == 20u * 32u + 64u);
    for (std::size_t i = 0; i < v.size(); ++i)
      mean[i] += c.seen[i] / draws;
  }
  std::vector<double> diff(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    diff[i] = mean[i] - v[i];
  // Per coordinate the estimator's std is ~|v_i| sqrt(q − 1) / sqrt(draws) ≈ 0.02 |v_i|.
  CHECK(norm(diff) < 0.05 * norm(v));

  auto tk = make_top_k(3);
  std::vector<double> w{0.5, -9.0, 1.0, 4.0, -4.5, 0.0};
  auto c = tk->compress(w, rng);
  CHECK(c.bits == 3u * 64u);
  CHECK(c.seen == std::vector<double>{0.0, -9.0, 0.0, 4.0, -4.5, 0.0});
}

TEST_CASE("decoding rejects malformed vi vectors") {
  vi_vector v;
  v.codec = static_cast<uint8_t>(vi_codec::dense);
  v.dim = 4;
  v.values = {1, 2, 3};
  CHECK_FALSE(decode(v, 4).ok());
  v.values.push_back(4);
  CHECK(decode(v, 4).ok());
  CHECK_FALSE(decode(v, 5).ok());
  v.codec = static_cast<uint8_t>(vi_codec::top_k);
  v.indices = {0, 1, 2, 4};
  CHECK_FALSE(decode(v, 4).ok());
  v.codec = static_cast<uint8_t>(vi_codec::rand_k);
  v.indices.clear();
  v.values.assign(5, 1.0f);
  CHECK_FALSE(decode(v, 4).ok());
  v.codec = 9;
  CHECK_FALSE(decode(v, 4).ok());
}

TEST_CASE("every method converges linearly to relative error 1e-8 on the bilinear problem") {
  auto p = default_problem();
  const std::size_t k = p->dim() / 10;
  struct config {
    method_kind method;
    codec_spec codec;
  };
  for (auto c : {config{method_kind::extragradient, {codec_kind::dense, 0}},
                 config{method_kind::masha1, {codec_kind::rand_k, k}},
                 config{method_kind::masha2, {codec_kind::top_k, k}}}) {
    auto o = recommended_options(c.method, *p, c.codec, c.codec, 7);
    auto r = run_pure(p, o, {200000, 1e-8});
    REQUIRE(r.ok());
    MESSAGE(to_string(c.method) << ": " << r->iterations << " iterations, gamma " << o.gamma
                                << ", tau " << o.tau);
    CHECK(r->reached);
    // Linear: the error at the halfway iteration is already at most sqrt(1e-8) (×10 slack for
    // the noise of a compressed run), i.e. the log-error falls at a steady rate, not sublinearly.
    const auto& half = r->trace[r->trace.size() / 2];
    CHECK(half.relative_error < 1e-3);
  }
}

// What MASHA saves on the default problem (M = 10, L̃ ≈ 1.17 L) at k = 10% of d, with the
// theory's γ and τ (README, "Why MASHA1 does not save bits in both directions"):
// - MASHA1 with a dense downlink saves bits on the uplink only (measured ~2x); its dense
//   broadcast makes the total larger than extragradient's;
// - bidirectional MASHA1 gains nothing over extragradient in total (theory: ratio
//   sqrt(q / C_q) ≤ 1); shared-seed Rand-k brings it to parity, independent Rand-k on the
//   server (the paper's Algorithm 1) stays below, its q_s multiplying the variance;
// - MASHA2 (Top-k with error feedback) saves a little in both directions.
TEST_CASE("at k = 10% MASHA1 saves uplink bits, MASHA2 saves bits in both directions, "
          "bidirectional MASHA1 only matches extragradient") {
  auto p = default_problem();
  const std::size_t k = p->dim() / 10;
  const run_limits limits{200000, 1e-6};
  auto eg = run_pure(p, recommended_options(method_kind::extragradient, *p, {}, {}, 3), limits);
  method_options m1;
  m1.method = method_kind::masha1;
  m1.worker_codec = {codec_kind::rand_k, k};
  m1.server_codec = {codec_kind::dense, 0};
  m1.seed = 3;
  auto up_only = run_pure(p, recommended_options(m1, *p), limits);
  m1.server_codec = {codec_kind::rand_k, k};
  m1.shared_randomness = true;
  auto shared = run_pure(p, recommended_options(m1, *p), limits);
  m1.shared_randomness = false;
  auto independent = run_pure(p, recommended_options(m1, *p), limits);
  auto m2 = run_pure(p,
                     recommended_options(method_kind::masha2, *p, {codec_kind::top_k, k},
                                         {codec_kind::top_k, k}, 3),
                     limits);
  for (auto* r : {&eg, &up_only, &shared, &independent, &m2}) {
    REQUIRE(r->ok());
    REQUIRE((*r)->reached);
  }
  auto [up_eg, all_eg] = bits_to(*eg, 1e-6);
  auto [up_a, all_a] = bits_to(*up_only, 1e-6);
  auto [up_s, all_s] = bits_to(*shared, 1e-6);
  auto [up_i, all_i] = bits_to(*independent, 1e-6);
  auto [up_m2, all_m2] = bits_to(*m2, 1e-6);
  MESSAGE("EG/method bits per worker to 1e-6 (uplink, both directions): MASHA1 dense down "
          << up_eg / up_a << ", " << all_eg / all_a << "; MASHA1 shared seed " << up_eg / up_s
          << ", " << all_eg / all_s << "; MASHA1 independent " << up_eg / up_i << ", "
          << all_eg / all_i << "; MASHA2 " << up_eg / up_m2 << ", " << all_eg / all_m2);
  CHECK(up_eg / up_a > 1.5);
  CHECK(all_a > all_eg);
  CHECK(all_eg / all_s > 0.7);
  CHECK(all_eg / all_s < 1.5);
  CHECK(all_i > all_s);
  CHECK(up_m2 < up_eg);
  CHECK(all_m2 < all_eg);
}

TEST_CASE(
    "turning server compression off adds exactly 32(d - k) - 64 downlink bits per iteration") {
  auto p = default_problem();
  const std::size_t k = p->dim() / 10;
  const std::size_t iters = 300;
  auto on = recommended_options(method_kind::masha1, *p, {codec_kind::rand_k, k},
                                {codec_kind::rand_k, k}, 11);
  auto off = on;
  off.server_codec = {codec_kind::dense, 0};
  auto r_on = run_pure(p, on, {iters, 0});
  auto r_off = run_pure(p, off, {iters, 0});
  REQUIRE(r_on.ok());
  REQUIRE(r_off.ok());
  const auto& a = r_on->trace.back();
  const auto& b = r_off->trace.back();
  REQUIRE(a.iteration == iters);
  REQUIRE(b.iteration == iters);
  // Same seed: same coins, so the same full rounds; uplinks are identical in size.
  CHECK(a.bits_up == b.bits_up);
  const uint64_t per_iteration = 32u * (p->dim() - k) - 64u;
  CHECK(b.bits_down - a.bits_down == iters * per_iteration);
  MESSAGE("downlink bits/worker over " << iters << " iterations: server compression on "
                                       << a.bits_down << ", off " << b.bits_down);
}

TEST_CASE("with shared randomness the server's Rand-k forwards the workers' average exactly") {
  auto p = default_problem();
  const std::size_t k = p->dim() / 10;
  const std::size_t iters = 300;
  method_options base;
  base.method = method_kind::masha1;
  base.worker_codec = {codec_kind::rand_k, k};
  base.server_codec = {codec_kind::rand_k, k};
  base.shared_randomness = true;
  base.seed = 5;
  auto sparse = recommended_options(base, *p);
  auto dense = sparse;
  dense.server_codec = {codec_kind::dense, 0};
  auto r_sparse = run_pure(p, sparse, {iters, 0});
  auto r_dense = run_pure(p, dense, {iters, 0});
  REQUIRE(r_sparse.ok());
  REQUIRE(r_dense.ok());
  // The same trajectory: the k-sparse forward loses nothing but float32 rounding.
  for (std::size_t i = 0; i < iters; i += 50) {
    const double a = r_sparse->trace[i].relative_error;
    const double b = r_dense->trace[i].relative_error;
    CHECK(std::fabs(a - b) <= 1e-4 * b);
  }
  // ... at the price of k values and a seed per compressed round instead of d values.
  const auto& a = r_sparse->trace.back();
  const auto& b = r_dense->trace.back();
  CHECK(a.bits_up == b.bits_up);
  CHECK(b.bits_down - a.bits_down == iters * (32u * (p->dim() - k) - 64u));
  // Independent seeds on the server add q_s to L_Q, so the theory's step is smaller.
  auto independent = base;
  independent.shared_randomness = false;
  independent = recommended_options(independent, *p);
  CHECK(independent.gamma < sparse.gamma);
}

TEST_CASE("with shared randomness the server rejects a worker that used another Rand-k seed") {
  auto p = default_problem();
  method_options o;
  o.method = method_kind::masha1;
  o.worker_codec = {codec_kind::rand_k, 20};
  o.server_codec = {codec_kind::rand_k, 20};
  o.shared_randomness = true;
  o = recommended_options(o, *p);
  std::vector<worker_core> workers;
  for (std::size_t i = 0; i < 2; ++i)
    workers.emplace_back(p, i, o, std::vector<double>(p->dim(), 0.0));
  server_core server{p->dim(), o};
  // The full round first, then one compressed round where worker 1's seed is tampered with.
  std::vector<starling::messages::vi_uplink> ups{workers[0].uplink(), workers[1].uplink()};
  auto down = server.aggregate(ups);
  REQUIRE(down.ok());
  for (auto& w : workers)
    REQUIRE(w.downlink(*down).ok());
  ups = {workers[0].uplink(), workers[1].uplink()};
  CHECK(ups[0].payload.seed == ups[1].payload.seed);
  ups[1].payload.seed ^= 1;
  auto bad = server.aggregate(ups);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().what.find("shared seed") != std::string::npos);
}

} // namespace starling::test::actors_masha_test
