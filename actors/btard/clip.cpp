#include "actors/btard/clip.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "actors/btard/vectorize.hpp"

namespace starling::actors::btard {

namespace {

using detail::lane_total;
using detail::sum_lanes;

/// Eight float32 values, one per coordinate of a group of eight (GCC vector extension: lowered
/// to two SSE registers in the baseline clone, one AVX register in the AVX2 clone). Aligned to 4
/// only: a std::vector of it need not start on 32 bytes, so loads and stores are unaligned ones.
typedef float clip_f8 __attribute__((vector_size(32), aligned(4)));

/// Coordinates per block of the fused iteration: n·block float32 inputs (16 KiB at n = 16)
/// stay in L1/L2 between the step loop and the distance loop over the same block.
constexpr size_t clip_block = 256;
static_assert(clip_block % sum_lanes == 0, "blocks keep each coordinate in lane k mod 8");

using clip_comparator = std::pair<uint16_t, uint16_t>;

/// The median of each coordinate into `x`, and the squared distances of every input to it into
/// `d2` (n × lanes partial sums, zeroed by the caller). One pass: eight coordinates at a time,
/// the inputs' eight values are sorted by the network lane-wise.
STARLING_BTARD_VECTORIZE void median_pass(const float* const* in, size_t n, size_t dim,
                                          const clip_comparator* net, size_t net_size, double* x,
                                          double* d2, clip_f8* orig, clip_f8* v) {
  const size_t h = n / 2;
  const bool odd = n % 2 == 1;
  for (size_t k = 0; k < dim; k += sum_lanes) {
    const size_t r = std::min(sum_lanes, dim - k);
    if (r == sum_lanes) {
      for (size_t j = 0; j < n; ++j)
        std::memcpy(&orig[j], in[j] + k, sizeof(clip_f8));
    } else {
      for (size_t j = 0; j < n; ++j) {
        float tail[sum_lanes] = {};
        std::memcpy(tail, in[j] + k, r * sizeof(float));
        std::memcpy(&orig[j], tail, sizeof(clip_f8));
      }
    }
    for (size_t j = 0; j < n; ++j)
      v[j] = orig[j];
    for (size_t c = 0; c < net_size; ++c) {
      clip_f8 a = v[net[c].first];
      clip_f8 b = v[net[c].second];
      auto lt = b < a;
      v[net[c].first] = lt ? b : a;
      v[net[c].second] = lt ? a : b;
    }
    double xs[sum_lanes];
    for (size_t l = 0; l < sum_lanes; ++l)
      xs[l] = odd ? static_cast<double>(v[h][l])
                  : (static_cast<double>(v[h - 1][l]) + static_cast<double>(v[h][l])) / 2.0;
    for (size_t l = 0; l < r; ++l)
      x[k + l] = xs[l];
    for (size_t j = 0; j < n; ++j) {
      double* dl = d2 + j * sum_lanes;
      for (size_t l = 0; l < r; ++l) {
        double d = static_cast<double>(orig[j][l]) - xs[l];
        dl[l] += d * d;
      }
    }
  }
}

/// One CenteredClip iteration with weights `w`: x += step; returns the lanes of ‖step‖² in
/// `s2`, and the squared distances of every input to the new x in `d2` (zeroed by the caller).
STARLING_BTARD_VECTORIZE void iteration_pass(const float* const* in, size_t n, size_t dim,
                                             const double* w, double* x, double* d2, double* s2,
                                             double* acc) {
  const double count = static_cast<double>(n);
  for (size_t b0 = 0; b0 < dim; b0 += clip_block) {
    const size_t m = std::min(clip_block, dim - b0);
    double* xb = x + b0;
    for (size_t k = 0; k < m; ++k)
      acc[k] = 0.0;
    for (size_t j = 0; j < n; ++j) {
      const float* g = in[j] + b0;
      const double wj = w[j];
      for (size_t k = 0; k < m; ++k)
        acc[k] += wj * (static_cast<double>(g[k]) - xb[k]);
    }
    size_t k = 0;
    for (; k + sum_lanes <= m; k += sum_lanes)
      for (size_t l = 0; l < sum_lanes; ++l) {
        double s = acc[k + l] / count;
        xb[k + l] += s;
        s2[l] += s * s;
      }
    for (; k < m; ++k) {
      double s = acc[k] / count;
      xb[k] += s;
      s2[k % sum_lanes] += s * s;
    }
    for (size_t j = 0; j < n; ++j) {
      const float* g = in[j] + b0;
      double* dl = d2 + j * sum_lanes;
      k = 0;
      for (; k + sum_lanes <= m; k += sum_lanes)
        for (size_t l = 0; l < sum_lanes; ++l) {
          double d = static_cast<double>(g[k + l]) - xb[k + l];
          dl[l] += d * d;
        }
      for (; k < m; ++k) {
        double d = static_cast<double>(g[k]) - xb[k];
        dl[k % sum_lanes] += d * d;
      }
    }
  }
}

STARLING_BTARD_VECTORIZE void mean_pass(const float* const* in, size_t n, size_t dim, float* out,
                                        double* acc) {
  const double count = static_cast<double>(n);
  for (size_t b0 = 0; b0 < dim; b0 += clip_block) {
    const size_t m = std::min(clip_block, dim - b0);
    for (size_t k = 0; k < m; ++k)
      acc[k] = 0.0;
    for (size_t j = 0; j < n; ++j) {
      const float* g = in[j] + b0;
      for (size_t k = 0; k < m; ++k)
        acc[k] += static_cast<double>(g[k]);
    }
    for (size_t k = 0; k < m; ++k)
      out[b0 + k] = static_cast<float>(acc[k] / count);
  }
}

status clip_check_inputs(const std::vector<const float*>& inputs, size_t dim, const char* what) {
  if (inputs.empty())
    return fail(fmt::format("{} of no inputs", what));
  if (inputs.size() > max_clip_inputs)
    return fail(fmt::format("{} of {} inputs; at most {}", what, inputs.size(), max_clip_inputs));
  if (dim > 0)
    for (auto* p : inputs)
      if (p == nullptr)
        return fail(fmt::format("{}: an input without values", what));
  return {};
}

} // namespace

std::vector<std::pair<uint16_t, uint16_t>> sorting_network(size_t n) {
  std::vector<clip_comparator> out;
  if (n < 2 || n > max_clip_inputs)
    return out;
  size_t size = 1;
  while (size < n)
    size <<= 1;
  // Batcher's odd–even merge sort, iteratively: merge runs of p into runs of 2p.
  for (size_t p = 1; p < size; p <<= 1)
    for (size_t k = p; k >= 1; k >>= 1) {
      for (size_t j = k % p; j + k < size; j += 2 * k)
        for (size_t i = 0; i < k && i + j + k < size; ++i)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p) && i + j + k < n)
            out.emplace_back(static_cast<uint16_t>(i + j), static_cast<uint16_t>(i + j + k));
    }
  return out;
}

result<clip_outcome> centered_clip_fp64(const std::vector<const float*>& inputs, size_t dim,
                                        double tau, size_t max_iterations, double tolerance) {
  if (auto st = clip_check_inputs(inputs, dim, "centered clip"); !st)
    return fail(st.what());
  if (!(tau > 0) || !std::isfinite(tau))
    return fail(fmt::format("centered clip: tau is {}, expected a finite value > 0", tau));
  if (!(tolerance >= 0) || !std::isfinite(tolerance))
    return fail(
        fmt::format("centered clip: tolerance is {}, expected a finite value >= 0", tolerance));
  const size_t n = inputs.size();
  const auto net = sorting_network(n);
  std::vector<double> x(dim), d2(n * sum_lanes, 0.0), w(n), acc(clip_block);
  std::vector<clip_f8> orig(n), v(n);
  median_pass(inputs.data(), n, dim, net.data(), net.size(), x.data(), d2.data(), orig.data(),
              v.data());
  clip_outcome out;
  for (size_t it = 0; it < max_iterations; ++it) {
    for (size_t j = 0; j < n; ++j) {
      double dist = std::sqrt(lane_total(&d2[j * sum_lanes]));
      w[j] = dist > tau ? tau / dist : 1.0;
    }
    std::fill(d2.begin(), d2.end(), 0.0);
    double s2[sum_lanes] = {};
    iteration_pass(inputs.data(), n, dim, w.data(), x.data(), d2.data(), s2, acc.data());
    out.iterations = it + 1;
    out.last_step = std::sqrt(lane_total(s2));
    if (out.last_step <= tolerance) {
      out.converged = true;
      break;
    }
  }
  for (size_t j = 0; j < n; ++j)
    if (std::sqrt(lane_total(&d2[j * sum_lanes])) > tau)
      ++out.clipped;
  out.value.resize(dim);
  for (size_t k = 0; k < dim; ++k)
    out.value[k] = static_cast<float>(x[k]);
  return out;
}

result<std::vector<float>> mean_fp64(const std::vector<const float*>& inputs, size_t dim) {
  if (auto st = clip_check_inputs(inputs, dim, "mean"); !st)
    return fail(st.what());
  std::vector<float> out(dim);
  std::vector<double> acc(clip_block);
  mean_pass(inputs.data(), inputs.size(), dim, out.data(), acc.data());
  return out;
}

} // namespace starling::actors::btard
