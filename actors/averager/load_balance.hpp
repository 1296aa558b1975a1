// Part sizes for butterfly all-reduce that minimize the slowest peer's communication time.
#pragma once

#include "kernels/result.hpp"

#include <cstdint>
#include <vector>

namespace starling::actors::averager {

/// Fractions w (summing to 1) minimizing max over peers with bandwidth > 0 of
/// (1 + (n - 2) w_i) / b_i, with w_i = 0 where b_i = 0 (client mode), n = bandwidths.size().
/// Solved exactly by water-filling: at the optimum w_i = max(0, (xi b_i - 1) / (n - 2)), and the
/// xi making them sum to 1 has a closed form once the set of peers with w_i > 0 (a prefix of the
/// peers sorted by bandwidth) is known. Fails when no bandwidth is positive or one is negative or
/// not finite.
starling::result<std::vector<double>> optimal_fractions(const std::vector<double>& bandwidths);

/// Whole-element part sizes for a vector of `size` elements: `optimal_fractions`, rounded by
/// largest remainder; then, while some non-empty part is smaller than `min_part`, the smallest
/// such peer gets no part and the fractions are re-solved without it (its elements merge into the
/// others'). Sizes are >= 0 and sum to `size`; clients get 0.
starling::result<std::vector<int64_t>> balance_parts(const std::vector<double>& bandwidths,
                                                     int64_t size, int64_t min_part = 1);

/// Communication time of the slowest peer with bandwidth > 0 for the given parts, in units of
/// "vector sizes per bandwidth unit": max_i (1 + (n - 2) parts_i / size) / b_i.
double communication_time(const std::vector<double>& bandwidths, const std::vector<int64_t>& parts,
                          int64_t size);

/// Largest-remainder (Hamilton) rounding of `fractions` of `size` to whole numbers summing to
/// `size`; ties go to the lower index.
std::vector<int64_t> largest_remainder(const std::vector<double>& fractions, int64_t size);

} // namespace starling::actors::averager
