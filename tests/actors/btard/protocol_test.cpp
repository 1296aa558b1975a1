#include "actors/btard/protocol.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/auth/identity.hpp"
#include "support/btard_fixtures.hpp"

namespace starling::test::btard_protocol {

namespace btard = starling::actors::btard;
using starling::actors::auth::key_pair;

namespace {

std::shared_ptr<const btard::task> tiny_task() { return starling::testing::tiny_btard_task(); }

btard::group_options options(uint64_t seed) {
  btard::group_options o;
  o.run_id = "test-run";
  o.tau = 1.0;
  o.lr = 0.05;
  o.seed = seed;
  return o;
}

std::vector<key_pair> keys(size_t n, uint64_t seed) {
  std::vector<key_pair> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(key_pair::from_test_seed(seed * 1000 + i));
  return out;
}

std::unique_ptr<btard::simulated_group> group(const btard::group_options& o,
                                              std::vector<btard::peer_spec> specs, uint64_t seed) {
  auto n = specs.size();
  auto g = btard::simulated_group::make(o, tiny_task(), std::move(specs), keys(n, seed));
  REQUIRE_MESSAGE(g, (g ? "" : g.error().what));
  return std::move(*g);
}

/// Every honest peer still in the run holds the same parameters after the step, and every honest
/// peer the same bans.
void honest_agree(const btard::simulated_group& g, const btard::step_record& rec) {
  std::optional<btard::digest> first;
  size_t compared = 0;
  for (auto& [key, d] : rec.params) {
    if (g.spec_of(*g.index_of(key)).byzantine())
      continue;
    if (!first)
      first = d;
    CHECK((d == *first));
    ++compared;
  }
  CHECK(compared >= 1);
  const std::map<std::string, std::string>* bans = nullptr;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g.spec_of(i).byzantine())
      continue;
    if (!bans) {
      bans = &g.bans_of(i);
      continue;
    }
    std::set<std::string> a, b;
    for (auto& [k, w] : g.bans_of(i))
      a.insert(k);
    for (auto& [k, w] : *bans)
      b.insert(k);
    CHECK(a == b);
  }
}

std::set<size_t> banned_indices(const btard::simulated_group& g) {
  std::set<size_t> out;
  for (size_t i = 0; i < g.size(); ++i)
    if (!g.spec_of(i).byzantine()) {
      for (auto& [k, why] : g.bans_of(i))
        out.insert(*g.index_of(k));
      break;
    }
  return out;
}

} // namespace

TEST_CASE("clean steps: no bans, every aggregation checks, honest peers identical") {
  for (uint64_t seed : {1, 2}) {
    auto g = group(options(seed), std::vector<btard::peer_spec>(8), seed);
    auto before = tiny_task()->evaluate(g->model());
    for (int s = 0; s < 15; ++s) {
      auto rec = g->step();
      REQUIRE_MESSAGE(rec, (rec ? "" : rec.error().what));
      CHECK(rec->applied);
      REQUIRE(rec->attempts.size() == 1);
      CHECK(rec->attempts[0].r.has_value());
      CHECK(rec->attempts[0].validations.size() == 1);
      for (auto& c : rec->attempts[0].checks)
        CHECK(c.accepted);
      CHECK(rec->params.size() == 8);
      honest_agree(*g, *rec);
    }
    CHECK(banned_indices(*g).empty());
    auto after = tiny_task()->evaluate(g->model());
    CHECK(after.loss < before.loss);
  }
}

TEST_CASE("an aggregate the iteration cap stopped fails the check and is verified by recomputation") {
  auto o = options(5);
  o.max_iterations = 1; // no part converges to the tolerance in one iteration
  o.tolerance = 1e-9;
  std::vector<btard::peer_spec> specs(6);
  specs[4].gradient.kind = btard::attack_kind::sign_flip; // far inputs, clipped
  auto g = group(o, specs, 5);
  size_t recomputed = 0, rejected = 0;
  for (int s = 0; s < 3; ++s) {
    auto rec = g->step();
    REQUIRE_MESSAGE(rec, (rec ? "" : rec.error().what));
    CHECK(rec->applied);
    honest_agree(*g, *rec);
    for (auto& a : rec->attempts)
      for (auto& c : a.checks) {
        rejected += c.accepted ? 0 : 1;
        recomputed += c.recomputed ? 1 : 0;
        CHECK_FALSE((c.accepted && c.recomputed));
      }
  }
  CHECK(rejected > 0);
  // Every rejected check was either blamed on someone (the sign flipper's bans are validators'
  // matter, not the check's) or verified by recomputation; no honest peer is banned for it.
  CHECK(recomputed > 0);
  for (auto i : banned_indices(*g))
    CHECK(i == 4);
}

TEST_CASE("every protocol attack is caught in its step and its attacker banned") {
  for (auto attack : btard::protocol_attacks()) {
    CAPTURE(btard::protocol_attack_name(attack));
    std::vector<btard::peer_spec> specs(6);
    specs[2].protocol = attack;
    specs[2].protocol_step = 1;
    auto g = group(options(7), specs, 7);
    auto attacker = g->key_of(2);
    for (int s = 0; s < 3; ++s) {
      auto rec = g->step();
      REQUIRE_MESSAGE(rec, (rec ? "" : rec.error().what));
      CHECK(rec->applied);
      honest_agree(*g, *rec);
      if (s == 1) {
        // Banned within the step, so the step's applied aggregation no longer has it.
        CHECK(rec->attempts.size() >= 2);
        CHECK(rec->attempts.back().applied);
        auto& m = rec->attempts.back().members;
        CHECK(std::find(m.begin(), m.end(), attacker) == m.end());
      }
    }
    auto banned = banned_indices(*g);
    CHECK(banned.count(2) == 1);
    // Honest peers leave only by the remove-both rule of a disputed delivery, one per attacker.
    bool dispute = attack == btard::protocol_attack::missing_part
                   || attack == btard::protocol_attack::part_not_committed
                   || attack == btard::protocol_attack::different_results;
    CHECK(banned.size() == (dispute ? 2u : 1u));
  }
}

TEST_CASE("gradient attackers are banned by validators; honest peers never") {
  using K = btard::attack_kind;
  for (auto kind : {K::sign_flip, K::random_direction, K::label_flip, K::delayed, K::ipm, K::alie}) {
    CAPTURE(btard::attack_name(kind));
    std::vector<btard::peer_spec> specs(8);
    for (size_t i : {1, 4, 6}) {
      specs[i].gradient.kind = kind;
      specs[i].gradient.direction_seed = 5;
      if (kind == K::delayed) // gradients of 15 steps earlier, for 15 steps
        specs[i].gradient.start_step = specs[i].gradient.delay = specs[i].gradient.duration = 15;
    }
    auto o = options(11);
    o.validators = 3;
    auto g = group(o, specs, 11);
    for (int s = 0; s < 60 && banned_indices(*g).size() < 3; ++s) {
      auto rec = g->step();
      REQUIRE_MESSAGE(rec, (rec ? "" : rec.error().what));
      honest_agree(*g, *rec);
    }
    CHECK(banned_indices(*g) == std::set<size_t>{1, 4, 6});
  }
}

TEST_CASE("the same seed gives the same steps") {
  std::vector<btard::peer_spec> specs(6);
  specs[3].gradient.kind = btard::attack_kind::sign_flip;
  specs[5].protocol = btard::protocol_attack::lie_projection;
  specs[5].protocol_step = 2;
  auto a = group(options(3), specs, 3);
  auto b = group(options(3), specs, 3);
  for (int s = 0; s < 6; ++s) {
    auto ra = a->step();
    auto rb = b->step();
    REQUIRE(ra);
    REQUIRE(rb);
    CHECK((ra->params == rb->params));
    CHECK(ra->attempts.size() == rb->attempts.size());
    CHECK((ra->attempts.back().r == rb->attempts.back().r));
  }
  CHECK((a->model() == b->model()));
}

TEST_CASE("a crashed peer is removed for its step, rejoins after the cool-down; repeated silence "
          "is a ban") {
  std::vector<btard::peer_spec> specs(5);
  specs[1].crash_at = 2;
  specs[1].crash_steps = 2;
  specs[3].crash_at = 1; // away at steps 1, 5, 9, ...: silent each time it is back
  specs[3].crash_steps = 1;
  specs[3].crash_every = 4;
  auto o = options(5);
  o.membership.cool_down = 2;
  o.membership.silences_to_ban = 3;
  auto g = group(o, specs, 5);
  std::vector<size_t> contributors;
  for (int s = 0; s < 14; ++s) {
    auto rec = g->step();
    REQUIRE_MESSAGE(rec, (rec ? "" : rec.error().what));
    CHECK(rec->applied);
    contributors.push_back(rec->contributors);
    honest_agree(*g, *rec);
  }
  CHECK(contributors[0] == 5);
  CHECK(contributors[2] == 3); // both away
  CHECK(banned_indices(*g) == std::set<size_t>{3});
  CHECK(contributors.back() == 4); // peer 1 is back, peer 3 banned
  CHECK((g->params_of(1) == g->params_of(0)));
}

TEST_CASE("plain rules: the mean breaks under sign flips, CenteredClip holds") {
  std::vector<btard::peer_spec> specs(8);
  specs[0].gradient.kind = btard::attack_kind::sign_flip;
  specs[5].gradient.kind = btard::attack_kind::sign_flip;
  std::map<btard::aggregation_rule, double> loss;
  for (auto rule : {btard::aggregation_rule::mean, btard::aggregation_rule::centered_clip}) {
    auto o = options(9);
    o.rule = rule;
    auto g = group(o, specs, 9);
    for (int s = 0; s < 15; ++s)
      REQUIRE(g->step());
    auto ev = tiny_task()->evaluate(g->model());
    loss[rule] = std::isfinite(ev.loss) ? ev.loss : 1e30;
    CHECK(banned_indices(*g).empty());
  }
  CHECK(loss[btard::aggregation_rule::centered_clip] < 3.0);
  CHECK(loss[btard::aggregation_rule::mean] > 10 * loss[btard::aggregation_rule::centered_clip]);
}

TEST_CASE("ban steps of a lone sign-flip attacker over 20 seeds fit the closed form (h/n)/(n-1)") {
  // n = 8 peers, 1 attacker, m = 1 validator: the attacker is validated by an honest peer with
  // chance p = (7/8)·(1/7) = 1/8 per step, so its ban step (1-based) is geometric with mean 8.
  const double p = (7.0 / 8.0) / 7.0;
  double sum = 0;
  size_t within_8 = 0;
  for (uint64_t seed = 100; seed < 120; ++seed) {
    std::vector<btard::peer_spec> specs(8);
    specs[seed % 8].gradient.kind = btard::attack_kind::sign_flip;
    auto g = group(options(seed), specs, seed);
    uint64_t banned_at = 0;
    for (uint64_t s = 0; s < 100 && banned_at == 0; ++s) {
      auto rec = g->step();
      REQUIRE(rec);
      if (!banned_indices(*g).empty()) {
        CHECK(banned_indices(*g) == std::set<size_t>{seed % 8});
        banned_at = s + 1;
      }
    }
    REQUIRE(banned_at > 0);
    sum += static_cast<double>(banned_at);
    within_8 += banned_at <= 8 ? 1 : 0;
  }
  double mean = sum / 20;
  MESSAGE("mean ban step " << mean << " (closed form " << 1 / p << "), " << within_8
                           << "/20 within 8 steps (closed form "
                           << 20 * (1 - std::pow(1 - p, 8)) << ")");
  // The mean of 20 geometric draws has standard deviation sqrt(1-p)/p/sqrt(20) = 1.67.
  CHECK(mean > 1 / p - 3 * 1.67);
  CHECK(mean < 1 / p + 3 * 1.67);
}

TEST_CASE("no honest peer is banned over 100 clean steps x 10 seeds") {
  for (uint64_t seed = 200; seed < 210; ++seed) {
    auto g = group(options(seed), std::vector<btard::peer_spec>(8), seed);
    for (int s = 0; s < 100; ++s) {
      auto rec = g->step();
      REQUIRE(rec);
      REQUIRE(rec->attempts.size() == 1);
    }
    CHECK(banned_indices(*g).empty());
  }
}

TEST_CASE("a banned peer's statements and parts are refused and counted, also after it restarts") {
  std::vector<btard::peer_spec> specs(5);
  specs[4].protocol = btard::protocol_attack::lie_projection;
  specs[4].protocol_step = 0;
  specs[4].crash_at = 2; // restarts after step 2, with the same key
  specs[4].crash_steps = 1;
  auto g = group(options(13), specs, 13);
  std::vector<size_t> refused;
  for (int s = 0; s < 5; ++s) {
    auto rec = g->step();
    REQUIRE(rec);
    refused.push_back(rec->refused_statements);
    if (s >= 1 && s != 2) {
      CHECK(rec->refused_parts == 4);
      CHECK(rec->contributors == 4);
    }
  }
  CHECK(banned_indices(*g) == std::set<size_t>{4});
  CHECK(refused == std::vector<size_t>{0, 1, 0, 1, 1});
}

TEST_CASE("bad options and inputs are refused with a reason") {
  auto o = options(1);
  o.tau = 0;
  CHECK_FALSE(btard::simulated_group::make(o, tiny_task(), std::vector<btard::peer_spec>(3), keys(3, 1)));
  CHECK_FALSE(btard::simulated_group::make(options(1), tiny_task(), std::vector<btard::peer_spec>(3),
                                           keys(2, 1)));
  CHECK_FALSE(btard::simulated_group::make(options(1), tiny_task(), std::vector<btard::peer_spec>(1),
                                           keys(1, 1)));
  CHECK_FALSE(btard::parse_protocol_attack("nonsense"));
  CHECK(btard::parse_protocol_attack("lie_projection"));
  CHECK_FALSE(btard::parse_rule("median"));
}

} // namespace starling::test::btard_protocol
