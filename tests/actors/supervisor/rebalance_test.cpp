#include "actors/supervisor/rebalance.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>

namespace starling::test::actors_rebalance_test {

using namespace starling::actors::supervisor;

namespace {

/// A simulated swarm: each peer has a speed; a stage's cost factor scales the samples/second any
/// peer achieves there (a "slow" stage holds heavier layers).
struct swarm {
  std::vector<double> stage_cost; // throughput multiplier per stage
  std::vector<size_t> peer_stage; // current stage of each peer
  std::vector<double> peer_speed; // base speed of each peer

  double peer_throughput(size_t p) const { return peer_speed[p] * stage_cost[peer_stage[p]]; }

  std::vector<stage_report> reports() const {
    std::vector<stage_report> r(stage_cost.size());
    for (size_t p = 0; p < peer_stage.size(); ++p) {
      r[peer_stage[p]].throughput += peer_throughput(p);
      r[peer_stage[p]].peers += 1;
    }
    return r;
  }

  double min_throughput() const {
    auto r = reports();
    return std::min_element(r.begin(), r.end(),
                            [](auto& a, auto& b) { return a.throughput < b.throughput; })
        ->throughput;
  }

  /// One rebalancing period: peers decide in order on fresh reports; at most one peer leaves any
  /// stage per period. Returns the moves made as (peer, from, to).
  std::vector<std::tuple<size_t, size_t, size_t>> period(const rebalance_options& opts) {
    std::vector<std::tuple<size_t, size_t, size_t>> moves;
    std::vector<bool> left(stage_cost.size(), false);
    for (size_t p = 0; p < peer_stage.size(); ++p) {
      auto from = peer_stage[p];
      if (left[from])
        continue;
      auto to = decide_migration(reports(), {from, peer_throughput(p)}, opts);
      if (!to)
        continue;
      peer_stage[p] = *to;
      left[from] = true;
      moves.emplace_back(p, from, *to);
    }
    return moves;
  }
};

/// Best achievable minimum stage throughput for identical peers, by brute force over counts.
double best_min_identical(const std::vector<double>& cost, int peers) {
  double best = 0;
  for (int a = 0; a <= peers; ++a)
    for (int b = 0; a + b <= peers; ++b) {
      int c = peers - a - b;
      best = std::max(best, std::min({a * cost[0], b * cost[1], c * cost[2]}));
    }
  return best;
}

} // namespace

TEST_CASE("a peer moves from a surplus stage to the bottleneck only when the minimum rises") {
  // Stage 1 is the bottleneck (4 vs 10 and 9).
  std::vector<stage_report> s{{10.0, 5}, {4.0, 2}, {9.0, 4}};
  CHECK(decide_migration(s, {0, 2.0}) == std::optional<size_t>{1});
  // From the bottleneck itself: never.
  CHECK_FALSE(decide_migration(s, {1, 2.0}));
  // A peer so fast that its stage would become the new, lower bottleneck stays.
  CHECK_FALSE(decide_migration(s, {2, 7.0}));
  // A gain below the threshold is not worth a move.
  std::vector<stage_report> close{{10.0, 10}, {9.9, 10}};
  CHECK_FALSE(decide_migration(close, {0, 1.0}));
  // Nothing to do with a single stage or a peer that measured nothing.
  CHECK_FALSE(decide_migration({{5.0, 1}}, {0, 1.0}));
  CHECK_FALSE(decide_migration(s, {0, 0.0}));
}

TEST_CASE("the expected throughput in another stage scales with the stages' per-peer rates") {
  std::vector<stage_report> s{{12.0, 4}, {3.0, 3}, {0.0, 0}};
  CHECK(throughput_in(s, {0, 3.0}, 1) == doctest::Approx(1.0));
  CHECK(throughput_in(s, {0, 3.0}, 2) == doctest::Approx(3.0)); // empty stage: no comparison
}

TEST_CASE("tied bottlenecks are relieved one at a time") {
  std::vector<stage_report> s{{3.0, 3}, {3.0, 3}, {9.0, 9}};
  CHECK(decide_migration(s, {2, 1.0}) == std::optional<size_t>{0});
}

TEST_CASE("new peers join the bottleneck stage") {
  CHECK(stage_for_new_peer({{5.0, 2}, {2.0, 1}, {7.0, 3}}) == std::optional<size_t>{1});
  CHECK_FALSE(stage_for_new_peer({}));
}

TEST_CASE("repeated decisions never oscillate on a stable load") {
  std::mt19937_64 gen(3);
  std::lognormal_distribution<double> speed(0.0, 0.5);
  std::uniform_int_distribution<size_t> stage(0, 3);
  for (int trial = 0; trial < 20; ++trial) {
    CAPTURE(trial);
    swarm s;
    s.stage_cost = {1.0, 0.7, 1.3, 1.0};
    for (int p = 0; p < 24; ++p) {
      s.peer_speed.push_back(speed(gen));
      s.peer_stage.push_back(stage(gen));
    }
    double last_min = s.min_throughput();
    int periods_with_moves = 0;
    for (int period = 0; period < 60; ++period) {
      auto moves = s.period({});
      auto now_min = s.min_throughput();
      CHECK(now_min >= last_min - 1e-12); // never worse
      last_min = now_min;
      if (moves.empty())
        break;
      ++periods_with_moves;
    }
    // Settles: a period without moves comes, and stays (the load is stable).
    CHECK(periods_with_moves < 60);
    for (int period = 0; period < 5; ++period)
      CHECK(s.period({}).empty());
  }
}

TEST_CASE("with one stage made slow, peers move there until the stages balance") {
  swarm s;
  s.stage_cost = {1.0, 0.5, 1.0}; // stage 1 does twice the work per sample
  for (size_t p = 0; p < 18; ++p) {
    s.peer_speed.push_back(1.0);
    s.peer_stage.push_back(p % 3);
  }
  CHECK(s.min_throughput() == doctest::Approx(3.0));
  for (int period = 0; period < 30 && !s.period({}).empty(); ++period) {
  }
  auto r = s.reports();
  CHECK(r[1].peers > r[0].peers);
  CHECK(r[1].peers > r[2].peers);
  CHECK(s.min_throughput() == doctest::Approx(best_min_identical(s.stage_cost, 18)));
}

TEST_CASE("a stage that loses half its peers gets them back from the others") {
  swarm s;
  s.stage_cost = {1.0, 1.0, 1.0};
  for (size_t p = 0; p < 15; ++p) {
    s.peer_speed.push_back(1.0);
    s.peer_stage.push_back(p % 3);
  }
  // Preemption: stage 2 keeps 2 of its 5 peers; the others never come back.
  for (size_t p = 2, removed = 0; p < s.peer_stage.size() && removed < 3;) {
    if (s.peer_stage[p] == 2) {
      s.peer_stage.erase(s.peer_stage.begin() + static_cast<long>(p));
      s.peer_speed.erase(s.peer_speed.begin() + static_cast<long>(p));
      ++removed;
    } else {
      ++p;
    }
  }
  CHECK(s.min_throughput() == doctest::Approx(2.0));
  int periods = 0;
  while (periods < 10 && !s.period({}).empty())
    ++periods;
  CHECK(periods <= 3);
  CHECK(s.min_throughput() == doctest::Approx(4.0)); // 12 peers over 3 stages
}

TEST_CASE("claims are weighted so that fast peers move first") {
  rebalance_options o;
  // Increasing in the relative speed, certain from claim_full on, positive for any peer.
  CHECK(claim_probability(2.0, o) == 1.0);
  CHECK(claim_probability(5.0, o) == 1.0);
  CHECK(claim_probability(1.0, o) < claim_probability(1.5, o));
  CHECK(claim_probability(0.5, o) < claim_probability(1.0, o));
  CHECK(claim_probability(0.1, o) > 0.0);
  CHECK(claim_probability(0.0, o) == 0.0);
  rebalance_options unweighted;
  unweighted.claim_full = 0;
  CHECK(claim_probability(0.3, unweighted) == 1.0);
  // A stage of 100 peers with lognormal speeds, all wanting to move; they check in a random order
  // and the first that claims gets the period's one move (the board's lease). Over many periods
  // the movers are mostly fast peers: faster on average than the stage, and the mean mover
  // faster than the unweighted (first checker) mover.
  std::mt19937_64 rng{5};
  std::lognormal_distribution<double> speed{0.0, 0.5};
  std::vector<double> v(100);
  double mean = 0;
  for (auto& x : v)
    mean += x = speed(rng);
  mean /= static_cast<double>(v.size());
  std::uniform_real_distribution<double> u{0.0, 1.0};
  double weighted = 0;
  double plain = 0;
  const int periods = 2000;
  for (int k = 0; k < periods; ++k) {
    std::vector<size_t> order(v.size());
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    plain += v[order[0]];
    for (auto i : order)
      if (u(rng) < claim_probability(v[i] / mean, o)) {
        weighted += v[i];
        break;
      }
  }
  weighted /= periods;
  plain /= periods;
  CHECK(plain == doctest::Approx(mean).epsilon(0.1));
  CHECK(weighted > 1.3 * mean);
  CHECK(weighted > 1.3 * plain);
}

TEST_CASE("a large imbalance lets several peers leave a stage in one period, never all") {
  using starling::actors::supervisor::moves_allowed;
  // Stage 0: 20 peers at 1 sample/s each; stage 1: 2 peers at 1 each. Leveling takes 9 moves
  // (11 and 11): half of them, 4, in one period.
  std::vector<stage_report> s{{20.0, 20}, {2.0, 2}};
  CHECK(moves_allowed(s, 0, 1) == 4);
  // Nearly level: one at a time, as before.
  CHECK(moves_allowed({{5.0, 5}, {4.0, 4}}, 0, 1) == 1);
  // The source never empties, and a lone peer or a slower source gives one.
  CHECK(moves_allowed({{100.0, 3}, {1.0, 1}}, 0, 1) == 1);
  CHECK(moves_allowed({{100.0, 1}, {1.0, 1}}, 0, 1) == 1);
  CHECK(moves_allowed({{1.0, 4}, {2.0, 4}}, 0, 1) == 1);
  // A stage with costlier samples (half the per-peer rate) gains less per mover: more moves.
  std::vector<stage_report> costly{{20.0, 20}, {1.0, 2}};
  CHECK(moves_allowed(costly, 0, 1) == 6); // level at (20 - 1) / (1 + 0.5) = 12.7 moves
  CHECK(moves_allowed(s, 0, 0) == 1);
  CHECK(moves_allowed(s, 0, 7) == 1);
}

} // namespace starling::test::actors_rebalance_test
