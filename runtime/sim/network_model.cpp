#include "runtime/sim/network_model.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/seeded_hash.hpp"

namespace starling::runtime::sim {

network_model::network_model(link_options defaults, uint64_t seed)
  : defaults_(defaults), seed_(seed), rng_(seed) {
  // nop
}

void network_model::set_link(int from, int to, const link_options& opts) {
  links_[{from, to}] = opts;
}

const link_options& network_model::link(int from, int to) const {
  auto i = links_.find({from, to});
  return i == links_.end() ? defaults_ : i->second;
}

void network_model::set_latency_range(std::chrono::nanoseconds lo, std::chrono::nanoseconds hi) {
  latency_lo_ns_ = std::max<int64_t>(0, std::min(lo.count(), hi.count()));
  latency_hi_ns_ = std::max<int64_t>(0, std::max(lo.count(), hi.count()));
}

int64_t network_model::latency_ns(int from, int to) const {
  if (latency_lo_ns_ < 0 || links_.count({from, to}) > 0)
    return link(from, to).latency.count();
  // splitmix64 of (seed, min, max): a stable per-link draw that needs no table.
  auto key = seed_ ^ (static_cast<uint64_t>(std::min(from, to)) << 32) ^
             static_cast<uint64_t>(static_cast<uint32_t>(std::max(from, to)));
  auto x = kernels::splitmix64_mix(key);
  auto span = static_cast<uint64_t>(latency_hi_ns_ - latency_lo_ns_) + 1;
  return latency_lo_ns_ + static_cast<int64_t>(x % span);
}

void network_model::partition(int a, int b) {
  cut_.insert({std::min(a, b), std::max(a, b)});
}

void network_model::heal(int a, int b) {
  cut_.erase({std::min(a, b), std::max(a, b)});
}

bool network_model::partitioned(int a, int b) const {
  return cut_.count({std::min(a, b), std::max(a, b)}) > 0;
}

transfer_result network_model::transfer(int from, int to, uint64_t bytes, int64_t now_ns) {
  if (partitioned(from, to))
    return {0, drop_reason::partition};
  const auto& l = link(from, to);
  if (l.loss > 0) {
    // Draw only when loss is configured so that lossless runs consume no randomness.
    std::uniform_real_distribution<double> u{0.0, 1.0};
    if (u(rng_) < l.loss)
      return {0, drop_reason::loss};
  }
  auto& busy = busy_until_[{from, to}];
  auto start = std::max(busy, now_ns);
  auto tx = static_cast<int64_t>(std::llround(static_cast<double>(bytes) * 1e9 / l.bandwidth));
  busy = start + tx;
  return {busy + latency_ns(from, to), drop_reason::none};
}

void network_model::reset_node(int n) {
  for (auto i = busy_until_.begin(); i != busy_until_.end();)
    i = (i->first.first == n || i->first.second == n) ? busy_until_.erase(i) : std::next(i);
}

} // namespace starling::runtime::sim
