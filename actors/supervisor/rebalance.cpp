#include "actors/supervisor/rebalance.hpp"

#include <algorithm>
#include <cmath>

namespace starling::actors::supervisor {

namespace {

size_t bottleneck(const std::vector<stage_report>& stages) {
  size_t best = 0;
  for (size_t i = 1; i < stages.size(); ++i)
    if (stages[i].throughput < stages[best].throughput)
      best = i;
  return best;
}

double minimum(const std::vector<stage_report>& stages) {
  return stages[bottleneck(stages)].throughput;
}

int64_t at_or_below(const std::vector<stage_report>& stages, double level) {
  return std::count_if(stages.begin(), stages.end(),
                       [&](const stage_report& s) { return s.throughput <= level; });
}

} // namespace

double throughput_in(const std::vector<stage_report>& stages, const migration_candidate& me,
                     size_t target) {
  auto& from = stages.at(me.stage);
  auto& to = stages.at(target);
  if (target == me.stage || from.peers <= 0 || to.peers <= 0 || from.throughput <= 0 ||
      to.throughput <= 0)
    return me.throughput;
  auto per_peer_from = from.throughput / static_cast<double>(from.peers);
  auto per_peer_to = to.throughput / static_cast<double>(to.peers);
  return me.throughput * per_peer_to / per_peer_from;
}

std::optional<size_t> decide_migration(const std::vector<stage_report>& stages,
                                       const migration_candidate& me,
                                       const rebalance_options& opts) {
  if (stages.size() < 2 || me.stage >= stages.size() || !(me.throughput > 0))
    return std::nullopt;
  auto target = bottleneck(stages);
  if (target == me.stage)
    return std::nullopt;
  auto old_min = minimum(stages);
  auto after = stages;
  after[me.stage].throughput = std::max(0.0, after[me.stage].throughput - me.throughput);
  after[me.stage].peers -= 1;
  after[target].throughput += throughput_in(stages, me, target);
  after[target].peers += 1;
  auto new_min = minimum(after);
  auto band = old_min * (1.0 + opts.threshold);
  if (new_min > band)
    return target;
  // Ties: the minimum is held by several stages. Relieving one of them does not raise the
  // minimum yet, but it is progress as long as the minimum does not drop.
  if (new_min >= old_min && at_or_below(after, band) < at_or_below(stages, band))
    return target;
  return std::nullopt;
}

double claim_probability(double relative, const rebalance_options& opts) {
  if (!(opts.claim_full > 0))
    return 1.0;
  if (!(relative > 0))
    return 0.0;
  if (relative >= opts.claim_full)
    return 1.0;
  return std::pow(relative / opts.claim_full, std::max(0.0, opts.claim_exponent));
}

std::optional<size_t> stage_for_new_peer(const std::vector<stage_report>& stages) {
  if (stages.empty())
    return std::nullopt;
  return bottleneck(stages);
}

uint64_t moves_allowed(const std::vector<stage_report>& stages, size_t from, size_t to) {
  if (from >= stages.size() || to >= stages.size() || from == to)
    return 1;
  auto& f = stages[from];
  auto& t = stages[to];
  if (f.peers <= 1 || f.throughput <= t.throughput)
    return 1;
  auto per_from = f.throughput / static_cast<double>(f.peers);
  auto gained = throughput_in(stages, migration_candidate{from, per_from}, to);
  if (!(per_from > 0) || !(gained > 0))
    return 1;
  // m movers: from loses m * per_from, to gains m * gained; level at m*.
  auto level = (f.throughput - t.throughput) / (per_from + gained);
  auto half = static_cast<int64_t>(std::floor(level / 2));
  // Never empty the source stage.
  half = std::min<int64_t>(half, f.peers - 1);
  return static_cast<uint64_t>(std::max<int64_t>(1, half));
}

} // namespace starling::actors::supervisor
