#include "actors/btard/aggregate_check.hpp"
#include "actors/btard/clip.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "kernels/seeded_hash.hpp"

namespace starling::test::btard_aggregate_check {

namespace btard = starling::actors::btard;

namespace {

using rows = std::vector<std::vector<float>>;

/// A 32-byte key for member j.
std::string member(size_t j) {
  return std::string(30, 'm') + static_cast<char>('A' + j / 26) + static_cast<char>('a' + j % 26);
}

double uniform(kernels::splitmix64_stream& rng) {
  return static_cast<double>(rng.next() >> 11) * 0x1p-53;
}

double normal(kernels::splitmix64_stream& rng) {
  double u1 = 1.0 - uniform(rng);
  double u2 = uniform(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

struct clip_result {
  std::vector<double> x;
  size_t iterations = 0;
  bool converged = false;
};

/// kernels::centered_clip in fp64 with weights 1 (that kernel needs LibTorch): the coordinate
/// median, then x += Σ (g − x)·min(1, τ/‖g − x‖) / n until a step is at most `tol`.
clip_result reference_clip(const rows& g, double tau, double tol, size_t max_iterations,
                           std::optional<size_t> leave_out = std::nullopt) {
  std::vector<const std::vector<float>*> in;
  for (size_t j = 0; j < g.size(); ++j)
    if (!leave_out || *leave_out != j)
      in.push_back(&g[j]);
  const size_t n = in.size();
  const size_t d = g[0].size();
  clip_result out;
  out.x.resize(d);
  std::vector<double> col(n);
  for (size_t k = 0; k < d; ++k) {
    for (size_t j = 0; j < n; ++j)
      col[j] = (*in[j])[k];
    std::sort(col.begin(), col.end());
    out.x[k] = n % 2 == 1 ? col[n / 2] : (col[n / 2 - 1] + col[n / 2]) / 2.0;
  }
  std::vector<double> step(d);
  for (size_t it = 0; it < max_iterations; ++it) {
    std::fill(step.begin(), step.end(), 0.0);
    for (const auto* row : in) {
      double sq = 0;
      for (size_t k = 0; k < d; ++k) {
        double diff = (*row)[k] - out.x[k];
        sq += diff * diff;
      }
      double dist = std::sqrt(sq);
      double c = dist > tau ? tau / dist : 1.0;
      for (size_t k = 0; k < d; ++k)
        step[k] += ((*row)[k] - out.x[k]) * c;
    }
    double norm = 0;
    for (size_t k = 0; k < d; ++k) {
      step[k] /= static_cast<double>(n);
      out.x[k] += step[k];
      norm += step[k] * step[k];
    }
    out.iterations = it + 1;
    if (std::sqrt(norm) <= tol) {
      out.converged = true;
      break;
    }
  }
  return out;
}

std::vector<float> to_float(const std::vector<double>& x) {
  return std::vector<float>(x.begin(), x.end());
}

std::vector<float> plain_mean(const rows& g) {
  std::vector<double> m(g[0].size(), 0.0);
  for (const auto& row : g)
    for (size_t k = 0; k < m.size(); ++k)
      m[k] += row[k];
  for (auto& v : m)
    v /= static_cast<double>(g.size());
  return to_float(m);
}

/// A random group: honest inputs around a centre, and b < n/2 Byzantine ones far away (so
/// clipping is active whenever b > 0).
struct group {
  rows g;
  std::vector<char> is_byzantine;
  double tau = 1.0;
  double tol = 1e-6;
  size_t byzantine = 0;
  double spread = 1.0; // σ·√D of the honest inputs
};

/// `need_byzantine`: at least one outlier (clipping active). `max_log_tol`: the tolerance is
/// spread·10^u with u uniform in [−9, max_log_tol]. τ is spread·(min_tau + 3u), u uniform in
/// [0, 1).
group random_group(kernels::splitmix64_stream& rng, bool need_byzantine, double max_log_tol,
                   double min_tau) {
  group out;
  const size_t n = 3 + static_cast<size_t>(rng.below(14));
  const size_t d = 1 + static_cast<size_t>(rng.below(64));
  const size_t max_b = (n - 1) / 2;
  out.byzantine = need_byzantine ? 1 + static_cast<size_t>(rng.below(max_b))
                                 : static_cast<size_t>(rng.below(max_b + 1));
  const double scale = std::pow(10.0, -3.0 + 6.0 * uniform(rng));
  // Gradient-like: the noise about as large as the mean.
  const double sigma = scale * (0.5 + uniform(rng));
  out.spread = sigma * std::sqrt(static_cast<double>(d));
  // τ from the honest spread, sometimes below it (honest inputs clipped too).
  out.tau = out.spread * (min_tau + 3.0 * uniform(rng));
  out.tol = out.spread * std::pow(10.0, -9.0 + (max_log_tol + 9.0) * uniform(rng));
  std::vector<double> centre(d);
  for (auto& c : centre)
    c = scale * normal(rng);
  // The attack: 50 spreads away along a unit direction, so the outliers are always clipped.
  std::vector<double> attack(d);
  double attack_norm = 0.0;
  while (attack_norm == 0.0) {
    for (auto& a : attack)
      a = normal(rng);
    attack_norm = std::sqrt(std::inner_product(attack.begin(), attack.end(), attack.begin(), 0.0));
  }
  for (size_t j = 0; j < n; ++j) {
    std::vector<float> row(d);
    bool byz = j < out.byzantine;
    for (size_t k = 0; k < d; ++k)
      row[k] =
          static_cast<float>(centre[k] + (byz ? 50.0 * out.spread * attack[k] / attack_norm : 0.0) +
                             sigma * normal(rng));
    out.g.push_back(std::move(row));
    out.is_byzantine.push_back(byz ? 1 : 0);
  }
  // Byzantine rows first would make them the low keys every time: shuffle.
  for (size_t i = out.g.size(); i > 1; --i) {
    auto j = static_cast<size_t>(rng.below(i));
    std::swap(out.g[i - 1], out.g[j]);
    std::swap(out.is_byzantine[i - 1], out.is_byzantine[j]);
  }
  return out;
}

/// Every member's pair for aggregate `agg` along the direction of `seed`, and the check.
btard::aggregate_check_outcome check(const group& gr, const std::vector<float>& agg, uint64_t seed,
                                     double tau) {
  const size_t d = agg.size();
  auto z = btard::gaussian_direction(seed, d);
  std::map<std::string, btard::projection> pairs;
  for (size_t j = 0; j < gr.g.size(); ++j)
    pairs[member(j)] = btard::project(z.data(), gr.g[j].data(), agg.data(), d);
  btard::part_facts facts{d, btard::norm_of(agg.data(), d), btard::norm_of(z.data(), d)};
  btard::aggregate_check_options opt;
  opt.tau = tau;
  opt.tolerance = gr.tol;
  auto out = btard::check_aggregate(pairs, facts, opt);
  REQUIRE(out);
  return *out;
}

} // namespace

TEST_CASE("gaussian_direction: a pure function of its seed with mean 0 and variance 1") {
  auto z = btard::gaussian_direction(7, 200001);
  CHECK(z == btard::gaussian_direction(7, 200001));
  CHECK(btard::gaussian_direction(8, 16) != btard::gaussian_direction(7, 16));
  // A prefix of a longer draw is the shorter draw (pairs are drawn in order).
  auto short_z = btard::gaussian_direction(7, 11);
  CHECK(std::equal(short_z.begin(), short_z.end(), z.begin()));
  double mean = 0;
  double sq = 0;
  double fourth = 0;
  for (double v : z) {
    mean += v;
    sq += v * v;
    fourth += v * v * v * v;
  }
  const auto n = static_cast<double>(z.size());
  mean /= n;
  sq /= n;
  fourth /= n;
  CHECK(std::abs(mean) < 0.01);        // sd of the mean: 0.0022
  CHECK(std::abs(sq - 1.0) < 0.015);   // sd: 0.0032
  CHECK(std::abs(fourth - 3.0) < 0.1); // a Gaussian's kurtosis, not a Rademacher's 1
}

TEST_CASE("project computes s and n in fp64") {
  std::vector<double> z{1.0, -2.0, 0.5};
  std::vector<float> g{1.0f, 2.0f, 3.0f};
  std::vector<float> a{0.5f, 2.5f, -1.0f};
  auto p = btard::project(z.data(), g.data(), a.data(), 3);
  CHECK(p.s == doctest::Approx(0.5 + 1.0 + 2.0));
  CHECK(p.n == doctest::Approx(std::sqrt(0.25 + 0.25 + 16.0)));
  CHECK(btard::norm_of(g.data(), 3) == doctest::Approx(std::sqrt(14.0)));
}

TEST_CASE("1,000 random honest CenteredClip aggregates pass the check (reference and kernel)") {
  kernels::splitmix64_stream rng{4101};
  double worst = 0.0;
  size_t clipped_cases = 0;
  for (int c = 0; c < 1000; ++c) {
    auto gr = random_group(rng, false, -3.0, 0.3);
    auto cc = reference_clip(gr.g, gr.tau, gr.tol, 100000);
    REQUIRE(cc.converged);
    auto agg = to_float(cc.x);
    const uint64_t direction = rng.next();
    auto out = check(gr, agg, direction, gr.tau);
    CAPTURE(c);
    CHECK(out.accepted);
    CHECK(out.impossible.empty());
    worst = std::max(worst, out.residual / out.bound);
    // The aggregators' kernel (clip.hpp: lane sums, fused passes) passes the same check.
    std::vector<const float*> in;
    for (auto& row : gr.g)
      in.push_back(row.data());
    auto fast = btard::centered_clip_fp64(in, gr.g[0].size(), gr.tau, 100000, gr.tol);
    REQUIRE(fast);
    REQUIRE(fast->converged);
    auto fast_out = check(gr, fast->value, direction, gr.tau);
    CHECK(fast_out.accepted);
    CHECK(fast_out.impossible.empty());
    worst = std::max(worst, fast_out.residual / fast_out.bound);
    clipped_cases += gr.byzantine > 0 ? 1 : 0;
  }
  MESSAGE("largest residual / bound over honest aggregates: " << worst);
  CHECK(clipped_cases > 500); // most cases exercise clipping
}

TEST_CASE("wrong aggregates are rejected: gross, another tau, one input left out, plain mean") {
  kernels::splitmix64_stream rng{4102};
  const int per_kind = 250;
  int rejected[4] = {0, 0, 0, 0};
  double closest = 1e300;
  for (int c = 0; c < per_kind; ++c) {
    // The check's power scales with the tolerance: a wrong aggregate passes with chance about
    // √(2/π)·bound/‖F_w‖. A CenteredClip tolerance of 1e-6 spreads and below keeps it < 1e-4.
    // τ above the honest spread, as a run sets it: with every input clipped the fixed point is
    // the geometric median whatever τ, and another τ is then no wrong aggregate.
    auto gr = random_group(rng, true, -6.0, 1.5);
    const size_t d = gr.g[0].size();
    // Gross: the honest aggregate moved by 10 τ in a random direction.
    auto honest = reference_clip(gr.g, gr.tau, gr.tol, 100000);
    REQUIRE(honest.converged);
    auto gross = to_float(honest.x);
    for (size_t k = 0; k < d; ++k)
      gross[k] += static_cast<float>(10.0 * gr.tau * normal(rng) / std::sqrt(double(d)));
    // Another τ: twice or half the run's, computed to convergence.
    double other_tau = rng.below(2) == 0 ? 2.0 * gr.tau : 0.5 * gr.tau;
    auto other = reference_clip(gr.g, other_tau, gr.tol, 100000);
    REQUIRE(other.converged);
    // One input left out: a Byzantine one, or an honest one while the honest stay a majority
    // (else the rest is no honest aggregate of anything and need not converge).
    std::vector<size_t> may_leave;
    for (size_t j = 0; j < gr.g.size(); ++j)
      if (gr.is_byzantine[j] || 2 * gr.byzantine < gr.g.size() - 1)
        may_leave.push_back(j);
    auto left = reference_clip(gr.g, gr.tau, gr.tol, 100000,
                               may_leave[static_cast<size_t>(rng.below(may_leave.size()))]);
    REQUIRE(left.converged);
    const std::vector<float> wrong[4] = {gross, to_float(other.x), to_float(left.x),
                                         plain_mean(gr.g)};
    for (int kind = 0; kind < 4; ++kind) {
      auto out = check(gr, wrong[kind], rng.next(), gr.tau);
      CAPTURE(c);
      CAPTURE(kind);
      CHECK_FALSE(out.accepted);
      rejected[kind] += out.accepted ? 0 : 1;
      closest = std::min(closest, out.residual / out.bound);
    }
  }
  for (int kind = 0; kind < 4; ++kind)
    CHECK(rejected[kind] == per_kind);
  MESSAGE("smallest residual / bound over wrong aggregates: " << closest);
}

TEST_CASE("an aggregate stopped by the iteration cap before converging is rejected") {
  kernels::splitmix64_stream rng{4103};
  int rejected = 0;
  int cases = 0;
  for (int c = 0; c < 200; ++c) {
    auto gr = random_group(rng, true, -6.0, 0.3);
    auto cut = reference_clip(gr.g, gr.tau, gr.tol, 1);
    auto out = check(gr, to_float(cut.x), rng.next(), gr.tau);
    // Stopped one step short, the residual is about n times the next step; a cut aggregate
    // that happens to sit within the bound of the fixed point is no wrong aggregate.
    auto next = reference_clip(gr.g, gr.tau, 0.0, 2);
    double next_step = 0.0;
    for (size_t k = 0; k < next.x.size(); ++k)
      next_step += (next.x[k] - cut.x[k]) * (next.x[k] - cut.x[k]);
    if (std::sqrt(next_step) * static_cast<double>(gr.g.size()) < 1e4 * out.bound)
      continue;
    ++cases;
    CAPTURE(c);
    CHECK_FALSE(out.accepted);
    rejected += out.accepted ? 0 : 1;
  }
  CHECK(cases > 150);
  CHECK(rejected == cases);
}

TEST_CASE("the iteration bound holds for a clustered group with far outliers") {
  auto b = btard::centered_clip_iterations_bound(1.0, 1e-6, 7, 16);
  REQUIRE(b);
  CHECK(*b == 18);
  CHECK(*btard::centered_clip_iterations_bound(1.0, 1e-6, 0, 16) == 2);
  CHECK(*btard::centered_clip_iterations_bound(1e-7, 1e-6, 3, 16) == 1);
  CHECK_FALSE(btard::centered_clip_iterations_bound(1.0, 1e-6, 16, 16));
  CHECK_FALSE(btard::centered_clip_iterations_bound(0.0, 1e-6, 1, 16));
  CHECK_FALSE(btard::centered_clip_iterations_bound(1.0, 0.0, 1, 16));
  kernels::splitmix64_stream rng{4104};
  for (int c = 0; c < 50; ++c) {
    // Honest inputs within 0.05 of the origin, τ = 1, b outliers 100 away: only they are clipped.
    const size_t n = 16;
    const size_t byz = 1 + static_cast<size_t>(rng.below(7));
    const size_t d = 8;
    rows g;
    for (size_t j = 0; j < n; ++j) {
      std::vector<float> row(d);
      for (auto& v : row)
        v = static_cast<float>(j < byz ? 100.0 / std::sqrt(double(d)) : 0.01 * normal(rng));
      g.push_back(row);
    }
    auto cc = reference_clip(g, 1.0, 1e-9, 1000);
    REQUIRE(cc.converged);
    CHECK(cc.iterations <= *btard::centered_clip_iterations_bound(1.0, 1e-9, byz, n));
  }
}

TEST_CASE("a pair with |s| > |z| n convicts its signer; the aggregate is then not accepted") {
  std::map<std::string, btard::projection> pairs{
      {member(0), {0.5, 1.0}}, {member(1), {-0.5, 1.0}}, {member(2), {3.0, 1.0}}};
  btard::part_facts facts{4, 1.0, 2.0}; // ‖z‖ = 2: |s| <= 2·n
  btard::aggregate_check_options opt;
  opt.tau = 10.0;
  auto out = btard::check_aggregate(pairs, facts, opt);
  REQUIRE(out);
  CHECK_FALSE(out->accepted);
  CHECK(out->impossible == std::vector<std::string>{member(2)});
  pairs[member(2)] = {0.0, 1.0};
  out = btard::check_aggregate(pairs, facts, opt);
  REQUIRE(out);
  CHECK(out->accepted);
  CHECK(out->residual == 0.0);
}

TEST_CASE("the residual weighs each s by min(1, tau/n) in key order") {
  std::map<std::string, btard::projection> pairs{{member(0), {1.0, 4.0}}, {member(1), {-1.0, 1.0}}};
  btard::part_facts facts{2, 0.0, 1.0};
  btard::aggregate_check_options opt;
  opt.tau = 2.0;
  opt.tolerance = 0.0;
  auto out = btard::check_aggregate(pairs, facts, opt);
  REQUIRE(out);
  CHECK(out->residual == doctest::Approx(0.5)); // 1·(2/4) − 1·1
  CHECK_FALSE(out->accepted);
  opt.tau = 1.0; // 1·(1/4) − 1 = −0.75
  out = btard::check_aggregate(pairs, facts, opt);
  REQUIRE(out);
  CHECK(out->residual == doctest::Approx(0.75));
}

TEST_CASE("check_aggregate refuses invalid options and values") {
  std::map<std::string, btard::projection> pairs{{member(0), {0.0, 1.0}}};
  btard::part_facts facts{1, 1.0, 1.0};
  btard::aggregate_check_options opt;
  CHECK(btard::check_aggregate(pairs, facts, opt));
  CHECK_FALSE(btard::check_aggregate({}, facts, opt));
  auto bad = opt;
  bad.tau = 0.0;
  CHECK_FALSE(btard::check_aggregate(pairs, facts, bad));
  bad = opt;
  bad.tolerance = -1.0;
  CHECK_FALSE(btard::check_aggregate(pairs, facts, bad));
  bad = opt;
  bad.sigmas = std::nan("");
  CHECK_FALSE(btard::check_aggregate(pairs, facts, bad));
  auto nan_pair = pairs;
  nan_pair[member(0)].s = std::nan("");
  CHECK_FALSE(btard::check_aggregate(nan_pair, facts, opt));
  auto negative = pairs;
  negative[member(0)].n = -1.0;
  CHECK_FALSE(btard::check_aggregate(negative, facts, opt));
  CHECK_FALSE(btard::check_aggregate(pairs, btard::part_facts{1, -1.0, 1.0}, opt));
}

TEST_CASE("the aggregator's per-peer check takes its own pair and refuses a lie") {
  kernels::splitmix64_stream rng{4105};
  const size_t d = 1000;
  std::vector<float> g(d);
  std::vector<float> a(d);
  for (size_t k = 0; k < d; ++k) {
    g[k] = static_cast<float>(normal(rng));
    a[k] = static_cast<float>(normal(rng));
  }
  auto z = btard::gaussian_direction(11, d);
  auto zn = btard::norm_of(z.data(), d);
  auto own = btard::project(z.data(), g.data(), a.data(), d);
  const double rel = 1e-9;
  CHECK(btard::projection_matches(own, own, zn, rel));
  // Rounding-level differences pass.
  auto near = own;
  near.s += 1e-12 * zn * own.n;
  near.n *= 1.0 + 1e-12;
  CHECK(btard::projection_matches(near, own, zn, rel));
  // Lies fail: s or n off by a millionth, a sign, a NaN.
  auto lie = own;
  lie.s += 1e-6 * zn * own.n;
  CHECK_FALSE(btard::projection_matches(lie, own, zn, rel));
  lie = own;
  lie.n *= 1.0 + 1e-6;
  CHECK_FALSE(btard::projection_matches(lie, own, zn, rel));
  lie = own;
  lie.s = -own.s;
  CHECK_FALSE(btard::projection_matches(lie, own, zn, rel));
  lie = own;
  lie.s = std::nan("");
  CHECK_FALSE(btard::projection_matches(lie, own, zn, rel));
  // Computed from another part (the peer sent one thing and projected another).
  auto g2 = g;
  g2[17] += 0.01f;
  CHECK_FALSE(
      btard::projection_matches(btard::project(z.data(), g2.data(), a.data(), d), own, zn, rel));
}

} // namespace starling::test::btard_aggregate_check
