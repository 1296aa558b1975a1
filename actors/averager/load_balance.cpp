#include "actors/averager/load_balance.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace starling::actors::averager {

using starling::fail;
using starling::result;

result<std::vector<double>> optimal_fractions(const std::vector<double>& bandwidths) {
  const auto n = bandwidths.size();
  std::vector<size_t> active;
  for (size_t i = 0; i < n; ++i) {
    auto b = bandwidths[i];
    if (!std::isfinite(b) || b < 0)
      return fail(fmt::format("bandwidth of peer {} must be finite and >= 0, got {}", i, b));
    if (b > 0)
      active.push_back(i);
  }
  if (active.empty())
    return fail(fmt::format("all {} peers have zero bandwidth: nobody can reduce a part", n));
  std::vector<double> w(n, 0.0);
  // With two peers or fewer, each peer's traffic is one vector whatever its share: every split
  // costs the same; split by bandwidth, which also minimizes reducing time.
  if (n <= 2) {
    double total = 0;
    for (auto i : active)
      total += bandwidths[i];
    for (auto i : active)
      w[i] = bandwidths[i] / total;
    return w;
  }
  const double coeff = static_cast<double>(n) - 2.0;
  std::stable_sort(active.begin(), active.end(),
                   [&](size_t a, size_t b) { return bandwidths[a] > bandwidths[b]; });
  // Try k = 1, 2, ... fastest peers receiving a part: sum_{j<k} (xi b_j - 1) = n - 2 gives
  // xi = (n - 2 + k) / sum_{j<k} b_j; it is the answer when the k-th peer's part is positive and
  // the next peer's would not be.
  double xi = 0, sum_b = 0;
  size_t k = 0;
  for (; k < active.size(); ++k) {
    sum_b += bandwidths[active[k]];
    xi = (coeff + static_cast<double>(k + 1)) / sum_b;
    if (k + 1 == active.size() || xi * bandwidths[active[k + 1]] <= 1.0)
      break;
  }
  double total = 0;
  for (size_t j = 0; j <= k; ++j) {
    auto i = active[j];
    w[i] = std::max(0.0, (xi * bandwidths[i] - 1.0) / coeff);
    total += w[i];
  }
  // Renormalize away floating-point drift; the sum is 1 up to rounding.
  for (auto& x : w)
    x /= total;
  return w;
}

std::vector<int64_t> largest_remainder(const std::vector<double>& fractions, int64_t size) {
  std::vector<int64_t> parts(fractions.size(), 0);
  std::vector<std::pair<double, size_t>> remainders;
  int64_t assigned = 0;
  for (size_t i = 0; i < fractions.size(); ++i) {
    auto exact = fractions[i] * static_cast<double>(size);
    parts[i] = static_cast<int64_t>(std::floor(exact));
    assigned += parts[i];
    if (fractions[i] > 0)
      remainders.emplace_back(exact - static_cast<double>(parts[i]), i);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](auto& a, auto& b) { return a.first > b.first; });
  // Floating-point sums can leave the floors a little off either way; correct in remainder order.
  for (size_t j = 0; assigned < size && !remainders.empty(); j = (j + 1) % remainders.size()) {
    ++parts[remainders[j].second];
    ++assigned;
  }
  for (size_t j = remainders.size(); assigned > size && j-- > 0;) {
    auto i = remainders[j].second;
    if (parts[i] > 0) {
      --parts[i];
      --assigned;
    }
  }
  return parts;
}

result<std::vector<int64_t>> balance_parts(const std::vector<double>& bandwidths, int64_t size,
                                           int64_t min_part) {
  if (size < 0)
    return fail(fmt::format("vector size must be >= 0, got {}", size));
  auto b = bandwidths;
  for (;;) {
    auto w = optimal_fractions(b);
    if (!w)
      return w.error();
    auto parts = largest_remainder(*w, size);
    // The smallest non-empty part below the minimum, if any peer besides it has a part.
    size_t smallest = parts.size();
    size_t nonempty = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i] == 0)
        continue;
      ++nonempty;
      if (parts[i] < min_part && (smallest == parts.size() || parts[i] < parts[smallest]))
        smallest = i;
    }
    if (smallest == parts.size() || nonempty <= 1)
      return parts;
    // Dropping its bandwidth keeps the peer in the group (it still sends and receives) but gives
    // it no part; the re-solve spreads its share over the others by their bandwidth.
    b[smallest] = 0.0;
  }
}

double communication_time(const std::vector<double>& bandwidths, const std::vector<int64_t>& parts,
                          int64_t size) {
  const double coeff = static_cast<double>(bandwidths.size()) - 2.0;
  double worst = 0;
  for (size_t i = 0; i < bandwidths.size(); ++i) {
    if (!(bandwidths[i] > 0))
      continue;
    auto w = size > 0 ? static_cast<double>(parts[i]) / static_cast<double>(size) : 0.0;
    worst = std::max(worst, (1.0 + std::max(coeff, 0.0) * w) / bandwidths[i]);
  }
  return worst;
}

} // namespace starling::actors::averager
