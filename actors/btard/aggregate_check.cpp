#include "actors/btard/aggregate_check.hpp"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "actors/btard/vectorize.hpp"
#include "kernels/seeded_hash.hpp"

namespace starling::actors::btard {

namespace {

using detail::lane_total;
using detail::sum_lanes;

constexpr double unit_roundoff_f32 = 0x1p-24;
constexpr double unit_roundoff_f64 = 0x1p-53;
constexpr double smallest_subnormal_f32 = 0x1p-149;
constexpr double two_pi = 6.283185307179586476925286766559;

/// γ_k = k·u / (1 − k·u) for fp64 (infinite when k·u >= 1).
double gamma_f64(double k) {
  double ku = k * unit_roundoff_f64;
  return ku < 1.0 ? ku / (1.0 - ku) : std::numeric_limits<double>::infinity();
}

/// A 53-bit uniform in [0, 1).
double unit_draw(kernels::splitmix64_stream& rng) {
  return static_cast<double>(rng.next() >> 11) * 0x1p-53;
}

} // namespace

std::vector<double> gaussian_direction(uint64_t seed, size_t size) {
  std::vector<double> z(size);
  kernels::splitmix64_stream rng{seed};
  for (size_t i = 0; i < size; i += 2) {
    double u1 = 1.0 - unit_draw(rng); // (0, 1]: the log stays finite
    double u2 = unit_draw(rng);
    double r = std::sqrt(-2.0 * std::log(u1));
    z[i] = r * std::cos(two_pi * u2);
    if (i + 1 < size)
      z[i + 1] = r * std::sin(two_pi * u2);
  }
  return z;
}

STARLING_BTARD_VECTORIZE double norm_of(const double* v, size_t size) {
  double lane[sum_lanes] = {};
  size_t i = 0;
  for (; i + sum_lanes <= size; i += sum_lanes)
    for (size_t l = 0; l < sum_lanes; ++l)
      lane[l] += v[i + l] * v[i + l];
  for (; i < size; ++i)
    lane[i % sum_lanes] += v[i] * v[i];
  return std::sqrt(lane_total(lane));
}

STARLING_BTARD_VECTORIZE double norm_of(const float* v, size_t size) {
  double lane[sum_lanes] = {};
  size_t i = 0;
  for (; i + sum_lanes <= size; i += sum_lanes)
    for (size_t l = 0; l < sum_lanes; ++l) {
      auto x = static_cast<double>(v[i + l]);
      lane[l] += x * x;
    }
  for (; i < size; ++i) {
    auto x = static_cast<double>(v[i]);
    lane[i % sum_lanes] += x * x;
  }
  return std::sqrt(lane_total(lane));
}

STARLING_BTARD_VECTORIZE projection project(const double* z, const float* g, const float* agg,
                                            size_t size) {
  double s[sum_lanes] = {};
  double sq[sum_lanes] = {};
  size_t i = 0;
  for (; i + sum_lanes <= size; i += sum_lanes)
    for (size_t l = 0; l < sum_lanes; ++l) {
      double d = static_cast<double>(g[i + l]) - static_cast<double>(agg[i + l]);
      s[l] += z[i + l] * d;
      sq[l] += d * d;
    }
  for (; i < size; ++i) {
    double d = static_cast<double>(g[i]) - static_cast<double>(agg[i]);
    s[i % sum_lanes] += z[i] * d;
    sq[i % sum_lanes] += d * d;
  }
  return projection{lane_total(s), std::sqrt(lane_total(sq))};
}

result<aggregate_check_outcome> check_aggregate(const std::map<std::string, projection>& pairs,
                                                const part_facts& part,
                                                const aggregate_check_options& options) {
  const auto& o = options;
  if (!(o.tau > 0.0) || !std::isfinite(o.tau))
    return fail(fmt::format("aggregate check: tau is {}, expected a finite value > 0", o.tau));
  if (!(o.tolerance >= 0.0) || !std::isfinite(o.tolerance))
    return fail(
        fmt::format("aggregate check: tolerance is {}, expected a finite value >= 0", o.tolerance));
  if (!(o.sigmas > 0.0) || !std::isfinite(o.sigmas))
    return fail(
        fmt::format("aggregate check: sigmas is {}, expected a finite value > 0", o.sigmas));
  if (!(o.projection_rel_tolerance >= 0.0) || !(o.projection_rel_tolerance < 1.0))
    return fail(fmt::format("aggregate check: projection_rel_tolerance is {}, expected [0, 1)",
                            o.projection_rel_tolerance));
  if (!std::isfinite(part.aggregate_norm) || part.aggregate_norm < 0.0 ||
      !std::isfinite(part.direction_norm) || part.direction_norm < 0.0)
    return fail(fmt::format("aggregate check: norms of the aggregate ({}) and direction ({}) "
                            "must be finite and >= 0",
                            part.aggregate_norm, part.direction_norm));
  if (pairs.empty())
    return fail("aggregate check: no projections");
  const auto n = static_cast<double>(pairs.size());
  const auto d = static_cast<double>(part.size);
  const double gamma = gamma_f64(d + n + 4.0);
  aggregate_check_outcome out;
  double sum = 0.0;
  double clipped_norms = 0.0; // A = Σ_j min(n_j, τ)
  for (const auto& [key, p] : pairs) {
    if (!std::isfinite(p.s) || !std::isfinite(p.n) || p.n < 0.0)
      return fail(fmt::format("aggregate check: a projection needs finite s and n >= 0, got "
                              "s = {}, n = {}",
                              p.s, p.n));
    // Cauchy–Schwarz: |⟨z, v⟩| <= ‖z‖·‖v‖, up to the rounding and slack granted to s and n.
    double slack = (2.0 * gamma + 2.0 * o.projection_rel_tolerance) * part.direction_norm * p.n;
    if (std::abs(p.s) > part.direction_norm * p.n + slack)
      out.impossible.push_back(key);
    double c = p.n > o.tau ? o.tau / p.n : 1.0;
    sum += p.s * c;
    clipped_norms += p.n > o.tau ? o.tau : p.n;
  }
  out.residual = std::abs(sum);
  double bound_f = n * (2.0 * o.tolerance + 2.0 * unit_roundoff_f32 * part.aggregate_norm +
                        std::sqrt(d) * smallest_subnormal_f32) +
                   n * gamma * o.tau;
  out.bound = o.sigmas * bound_f +
              (gamma + o.projection_rel_tolerance) * part.direction_norm * clipped_norms;
  out.accepted = out.impossible.empty() && out.residual <= out.bound;
  return out;
}

bool projection_matches(const projection& published, const projection& own, double direction_norm,
                        double rel_tolerance) {
  if (!std::isfinite(published.s) || !std::isfinite(published.n) || published.n < 0.0)
    return false;
  return std::abs(published.s - own.s) <= rel_tolerance * direction_norm * own.n &&
         std::abs(published.n - own.n) <= rel_tolerance * own.n;
}

result<size_t> centered_clip_iterations_bound(double tau, double tolerance, size_t clipped,
                                              size_t n) {
  if (!(tau > 0.0) || !std::isfinite(tau) || !(tolerance > 0.0) || !std::isfinite(tolerance))
    return fail(fmt::format("iterations bound: tau ({}) and tolerance ({}) must be finite and "
                            "> 0",
                            tau, tolerance));
  if (n == 0 || clipped >= n)
    return fail(fmt::format("iterations bound: {} clipped of {} inputs; the bound needs fewer "
                            "clipped than inputs",
                            clipped, n));
  if (tau <= tolerance)
    return size_t{1};
  if (clipped == 0)
    return size_t{2};
  double k = std::ceil(std::log(tau / tolerance) /
                       std::log(static_cast<double>(n) / static_cast<double>(clipped)));
  return static_cast<size_t>(k) + 1;
}

} // namespace starling::actors::btard
