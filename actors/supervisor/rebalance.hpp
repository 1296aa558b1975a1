// Adaptive rebalancing (SWARM): should a stage peer migrate to the bottleneck stage? Pure: the
// supervisor feeds it throughputs read from the DHT and acts on the answer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace starling::actors::supervisor {

/// What the DHT says about one stage.
struct stage_report {
  /// Sum of the live peers' throughputs, samples/second.
  double throughput = 0.0;
  /// Live peers.
  int64_t peers = 0;
};

/// Tunables of the rebalancing decision.
struct rebalance_options {
  /// A move must raise the pipeline's minimum stage throughput by more than this fraction of it
  /// (measurements are noisy; small gains are not worth a state download).
  double threshold = 0.05;
  /// Claim weighting (`claim_probability`): a peer at least `claim_full` times as fast as its
  /// stage's average claims a wanted move whenever it checks; a slower one with probability
  /// (relative speed / claim_full) ^ `claim_exponent`.
  double claim_full = 2.0;
  double claim_exponent = 2.0;
};

/// The peer considering a move.
struct migration_candidate {
  /// Its current stage.
  size_t stage = 0;
  /// Its measured throughput there, samples/second.
  double throughput = 0.0;
};

/// The candidate's expected throughput in `target`: its current throughput scaled by the ratio of
/// the two stages' per-peer throughputs (stages cost differently per sample); unchanged when
/// either stage has no peers to compare with.
double throughput_in(const std::vector<stage_report>& stages, const migration_candidate& me,
                     size_t target);

/// The stage `me` should move to, or nullopt to stay. It moves only to the bottleneck stage (the
/// slowest; the lowest index among ties) and only if, once moved, the minimum stage throughput
/// rises by more than `threshold` of it, or stays no lower while fewer stages sit within the
/// threshold of the minimum (so several tied bottlenecks are resolved one at a time). Each move
/// thus strictly improves (minimum, -stages at the minimum): repeated decisions cannot cycle.
std::optional<size_t> decide_migration(const std::vector<stage_report>& stages,
                                       const migration_candidate& me,
                                       const rebalance_options& opts = {});

/// The probability that a peer that wants to move claims the move out of its stage at this
/// check, from its throughput relative to its stage's average peer. Only one move out of a stage
/// is granted per period (the first claim), and a move costs the same state download whoever
/// makes it while a faster peer relieves the bottleneck more: weighting the claims makes the fast
/// peers move first. 1 for `relative >= claim_full`, increasing, positive for any positive
/// speed; 1 when `claim_full` is not positive (unweighted).
double claim_probability(double relative, const rebalance_options& opts = {});

/// How many peers may move from stage `from` to stage `to` in one period: half the moves that
/// would level the two stages' throughputs (each mover taking `from`'s average per-peer
/// throughput, scaled to `to` like `throughput_in`), at least 1. A large imbalance (the start of a
/// run, a region lost) is then undone in a few periods instead of one move per period.
uint64_t moves_allowed(const std::vector<stage_report>& stages, size_t from, size_t to);

/// The stage a newly joining peer should serve: the bottleneck; nullopt when there are no stages.
std::optional<size_t> stage_for_new_peer(const std::vector<stage_report>& stages);

} // namespace starling::actors::supervisor
