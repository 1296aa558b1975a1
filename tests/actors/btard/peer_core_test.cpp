#include "actors/btard/peer_core.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "actors/auth/identity.hpp"
#include "support/btard_fixtures.hpp"

namespace starling::test::btard_peer_core {

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

/// Peers that meet only through a shared board: what one publishes, every other reads (all of
/// it, every round, as readers that re-store would); a crashed peer publishes and reads nothing.
/// When no live peer's wait is over, the deadline of those that have waited longest passes.
/// The runs where a crashed peer comes back: a cool-down of one step, a window of 10 steps.
btard::group_options comeback_options(uint64_t silences_to_ban) {
  auto o = options(9);
  o.membership.cool_down = 1;
  o.membership.silences_to_ban = silences_to_ban;
  o.membership.silence_window = 10;
  return o;
}

std::vector<std::string> public_keys(const std::vector<key_pair>& ks) {
  std::vector<std::string> out;
  for (auto& k : ks)
    out.push_back(k.public_key());
  return out;
}

/// Every one of the `n` peers took the step in one aggregation of all `n`, nobody silent.
void one_attempt_nobody_silent(std::map<size_t, btard::step_record>& recs, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    REQUIRE(recs.count(i));
    CHECK(recs[i].applied);
    CHECK(recs[i].attempts.size() == 1);
    CHECK(recs[i].attempts.front().silent.empty());
    CHECK(recs[i].attempts.front().members.size() == n);
  }
}

struct board_run {
  std::vector<std::unique_ptr<btard::peer_core>> peers;
  std::vector<btard::signed_statement> statements;
  std::map<btard::data_ref, std::vector<float>> data;
  std::set<size_t> crashed;
  /// Peers that crash once they reach (step, phase): mid-step crashes.
  std::map<size_t, std::pair<uint64_t, btard::peer_phase>> crash_at;
  /// Deadlines that passed (waits that ended without every marker).
  size_t deadlines = 0;
  /// Statements a reader does not see (yet): a board whose replicas lag for that reader.
  std::function<bool(size_t reader, const btard::signed_statement&)> hide;
  /// As the DHT driver does (board_actor.cpp): a peer whose deadline comes while most of its
  /// group is past the wait waits again, at most `max_extensions` times per wait; counted here.
  size_t max_extensions = 0;
  size_t extensions = 0;
  std::map<std::tuple<size_t, uint64_t, uint32_t, int>, size_t> extended;
  /// As the DHT driver does: a step's first wait in which only members coming back are missing
  /// runs one more deadline, once per peer and step (`only_coming_back_missing`); counted here.
  bool coming_back_grace = false;
  size_t graces = 0;
  std::set<std::pair<size_t, uint64_t>> graced;

  board_run(const btard::group_options& o, std::vector<btard::peer_core_options> specs,
            uint64_t seed) {
    auto ks = keys(specs.size(), seed);
    std::vector<std::string> members;
    for (auto& k : ks)
      members.push_back(k.public_key());
    for (size_t i = 0; i < specs.size(); ++i) {
      specs[i].group = o;
      auto p = btard::peer_core::make(specs[i], tiny_task(), ks[i], members);
      REQUIRE_MESSAGE(p, (p ? "" : p.error().what));
      peers.push_back(std::move(*p));
    }
  }

  bool running(size_t i) const {
    auto ph = peers[i]->phase();
    return !crashed.count(i) && ph != btard::peer_phase::idle && ph != btard::peer_phase::banned;
  }

  void collect(size_t i) {
    for (auto& s : peers[i]->take_statements())
      statements.push_back(s);
    for (auto& [ref, v] : peers[i]->take_data())
      data[ref] = v;
  }

  /// One step of every live peer; the records of those that ran it, by peer index.
  std::map<size_t, btard::step_record> step() {
    std::map<size_t, btard::step_record> out;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (crashed.count(i) || peers[i]->phase() == btard::peer_phase::banned)
        continue;
      auto st = peers[i]->begin_step();
      REQUIRE_MESSAGE(st, st.what());
      collect(i);
      if (!running(i))
        out[i] = peers[i]->take_record();
    }
    for (int round = 0; round < 10000; ++round) {
      bool any = false;
      for (size_t i = 0; i < peers.size(); ++i)
        any = any || running(i);
      if (!any)
        return out;
      for (size_t i = 0; i < peers.size(); ++i) {
        if (!running(i))
          continue;
        for (auto& s : statements)
          if (!hide || !hide(i, s))
            peers[i]->offer(s);
        for (auto& ref : peers[i]->wanted()) {
          auto it = data.find(ref);
          if (it != data.end())
            peers[i]->offer(ref, it->second);
        }
      }
      for (auto& [i, at] : crash_at)
        if (!crashed.count(i) && peers[i]->step() == at.first && peers[i]->phase() == at.second)
          crashed.insert(i);
      std::vector<size_t> go;
      for (size_t i = 0; i < peers.size(); ++i)
        if (running(i) && peers[i]->ready())
          go.push_back(i);
      if (go.empty()) {
        // The peers that have waited longest (the earliest attempt and phase) time out first.
        ++deadlines;
        std::optional<std::pair<uint32_t, int>> earliest;
        for (size_t i = 0; i < peers.size(); ++i)
          if (running(i)) {
            std::pair<uint32_t, int> at{peers[i]->attempt(), static_cast<int>(peers[i]->phase())};
            if (!earliest || at < *earliest)
              earliest = at;
          }
        bool waited_again = false;
        for (size_t i = 0; i < peers.size(); ++i)
          if (running(i) && std::make_pair(peers[i]->attempt(),
                                           static_cast<int>(peers[i]->phase())) == *earliest) {
            auto& times = extended[{i, peers[i]->step(), peers[i]->attempt(),
                                    static_cast<int>(peers[i]->phase())}];
            if (peers[i]->majority_ahead() && times < max_extensions) {
              ++times;
              ++extensions;
              waited_again = true;
              continue;
            }
            if (coming_back_grace && peers[i]->only_coming_back_missing() &&
                graced.insert({i, peers[i]->step()}).second) {
              ++graces;
              waited_again = true;
              continue;
            }
            go.push_back(i);
          }
        if (waited_again)
          --deadlines; // no deadline passed: a wait began again
      }
      for (size_t i : go) {
        auto done = peers[i]->advance();
        REQUIRE_MESSAGE(done, (done ? "" : done.error().what));
        collect(i);
        if (*done)
          out[i] = peers[i]->take_record();
      }
    }
    FAIL("the step did not end");
    return out;
  }
};

std::unique_ptr<btard::simulated_group> lockstep(const btard::group_options& o,
                                                 const std::vector<btard::peer_core_options>& c,
                                                 uint64_t seed) {
  std::vector<btard::peer_spec> specs(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    specs[i].gradient = c[i].gradient;
    specs[i].protocol = c[i].protocol;
    specs[i].protocol_step = c[i].protocol_step;
  }
  auto g = btard::simulated_group::make(o, tiny_task(), specs, keys(c.size(), seed));
  REQUIRE_MESSAGE(g, (g ? "" : g.error().what));
  return std::move(*g);
}

/// Every listed peer holds the same parameters.
void same_params(const board_run& run, const std::set<size_t>& who) {
  std::optional<btard::digest> first;
  for (size_t i : who) {
    auto d = btard::params_digest(run.peers[i]->params());
    if (!first)
      first = d;
    CHECK((d == *first));
  }
}

} // namespace

TEST_CASE("peers on a board take the lockstep group's steps bit for bit, attacks included") {
  // The lockstep engine (protocol.hpp) is the oracle: the same keys, seeds and attacks give the
  // same shared randomness, the same bans and the same parameters after every step.
  for (auto kind : {btard::attack_kind::none, btard::attack_kind::sign_flip,
                    btard::attack_kind::label_flip, btard::attack_kind::ipm,
                    btard::attack_kind::alie}) {
    std::string kind_name = btard::attack_name(kind);
    CAPTURE(kind_name);
    auto o = options(3);
    o.validators = 2;
    std::vector<btard::peer_core_options> specs(7);
    if (kind != btard::attack_kind::none) {
      auto ks = keys(specs.size(), 3);
      for (size_t i : {1, 4})
        specs[i].gradient.kind = kind;
      for (size_t i : {1, 4})
        specs[i].colluders = {ks[1].public_key(), ks[4].public_key()};
    }
    board_run run(o, specs, 3);
    auto oracle = lockstep(o, specs, 3);
    for (int s = 0; s < 12; ++s) {
      auto want = oracle->step();
      REQUIRE_MESSAGE(want, (want ? "" : want.error().what));
      auto got = run.step();
      for (auto& [i, rec] : got) {
        CAPTURE(i);
        CAPTURE(s);
        if (specs[i].gradient.kind != btard::attack_kind::none)
          continue;
        CHECK(rec.applied == want->applied);
        CHECK(rec.attempts.size() == want->attempts.size());
        REQUIRE(want->params.count(run.peers[i]->key()));
        CHECK((rec.params.at(run.peers[i]->key()) == want->params.at(run.peers[i]->key())));
        CHECK((run.peers[i]->randomness() ==
               (want->attempts.back().r ? *want->attempts.back().r
                                        : btard::skipped_randomness(want->r_prev))));
      }
    }
    CHECK(run.deadlines == 0);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].gradient.kind != btard::attack_kind::none)
        continue;
      std::set<std::string> a, b;
      for (auto& [k, w] : run.peers[i]->bans())
        a.insert(k);
      for (auto& [k, w] : oracle->bans_of(i))
        b.insert(k);
      CHECK(a == b);
      for (size_t j = 0; j < specs.size(); ++j)
        if (specs[j].gradient.kind == btard::attack_kind::none)
          CHECK(a.count(run.peers[j]->key()) == 0);
    }
  }
}

TEST_CASE("a crashed peer is silent at the deadline, removed, and banned after repeated silence") {
  auto o = options(5);
  o.membership.cool_down = 1;
  o.membership.silences_to_ban = 2;
  o.membership.silence_window = 10;
  std::vector<btard::peer_core_options> specs(5);
  board_run run(o, specs, 5);
  std::set<size_t> live{0, 1, 2, 3, 4};
  std::string gone = run.peers[2]->key();
  bool banned = false;
  for (int s = 0; s < 8; ++s) {
    if (s == 2) {
      run.crashed.insert(2);
      live.erase(2);
    }
    auto recs = run.step();
    for (size_t i : live) {
      REQUIRE(recs.count(i));
      CHECK(recs[i].applied);
    }
    same_params(run, live);
    banned = banned || run.peers[0]->bans().count(gone) > 0;
  }
  CHECK(run.deadlines >= 2);
  CHECK(banned);
  for (size_t i : live)
    CHECK(run.peers[i]->bans().size() == 1);
}

TEST_CASE("a crashed peer comes back after its cool-down with the state the others export, "
          "takes every later step with them and is never banned") {
  auto o = comeback_options(2);
  std::vector<btard::peer_core_options> specs(5);
  board_run run(o, specs, 9);
  auto ks = keys(specs.size(), 9);
  auto members = public_keys(ks);
  run.crashed.insert(2);
  (void)run.step(); // step 0: peer 2 is silent, removed, cooling down at step 1
  for (size_t i : {0u, 1u, 3u, 4u}) {
    CAPTURE(i);
    CHECK(run.peers[i]->cooling_down() == false);
    auto e = run.peers[i]->expected();
    CHECK(std::find(e.begin(), e.end(), members[2]) == e.end());
  }
  (void)run.step(); // step 1: the others alone
  // At step 2 the rules expect peer 2 again: every honest peer exports the same bytes.
  auto state = run.peers[0]->export_state();
  for (size_t i : {1u, 3u, 4u})
    CHECK(run.peers[i]->export_state() == state);
  CHECK(btard::state_step(state) == 2);
  auto e = run.peers[0]->expected();
  CHECK(std::find(e.begin(), e.end(), members[2]) != e.end());
  // Who can sign that state: the members that took step 1, not the one coming back.
  auto active = run.peers[0]->active();
  CHECK(active.size() == 4);
  CHECK(std::find(active.begin(), active.end(), members[2]) == active.end());

  // Bad states are refused with a reason: another run's, cut short, or with a non-finite value.
  specs[2].group = o;
  auto other = specs[2];
  other.group.run_id = "another-run";
  CHECK_FALSE(btard::peer_core::resume(other, tiny_task(), ks[2], members, state));
  CHECK_FALSE(btard::peer_core::resume(specs[2], tiny_task(), ks[2], members,
                                       state.substr(0, state.size() / 2)));
  auto nan = state;
  auto at = std::string("starling.btard.state.v1").size() + 8 + o.run_id.size() + 8 + 8 + 32 + 8;
  float bad = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&nan[at], &bad, sizeof(bad));
  CHECK_FALSE(btard::peer_core::resume(specs[2], tiny_task(), ks[2], members, nan));

  auto back = btard::peer_core::resume(specs[2], tiny_task(), ks[2], members, state);
  REQUIRE_MESSAGE(back, (back ? "" : back.error().what));
  CHECK((*back)->step() == 2);
  CHECK((*back)->export_state() == state);
  run.peers[2] = std::move(*back);
  run.crashed.erase(2);
  for (int s = 2; s < 7; ++s) {
    CAPTURE(s);
    auto recs = run.step();
    for (size_t i = 0; i < specs.size(); ++i) {
      REQUIRE(recs.count(i));
      CHECK(recs[i].applied);
      CHECK(recs[i].attempts.back().members.size() == 5);
    }
    same_params(run, {0, 1, 2, 3, 4});
  }
  for (size_t i = 0; i < specs.size(); ++i)
    CHECK(run.peers[i]->bans().empty());
}

TEST_CASE("a peer coming back commits late (it takes the state first): the others wait one "
          "more deadline for it, once, and it is not silent; a member that is not coming back "
          "gets no such wait") {
  auto o = comeback_options(3);
  std::vector<btard::peer_core_options> specs(5);
  board_run run(o, specs, 9);
  run.coming_back_grace = true;
  auto ks = keys(specs.size(), 9);
  auto members = public_keys(ks);
  run.crashed.insert(2);
  (void)run.step(); // step 0: peer 2 silent, cooling down at step 1
  (void)run.step(); // step 1: the others alone (nobody comes back: no grace)
  CHECK(run.graces == 0);
  specs[2].group = o;
  auto back =
      btard::peer_core::resume(specs[2], tiny_task(), ks[2], members, run.peers[0]->export_state());
  REQUIRE_MESSAGE(back, (back ? "" : back.error().what));
  run.peers[2] = std::move(*back);
  run.crashed.erase(2);
  // Step 2: its commitments reach the board only after the others' first deadline.
  run.hide = [&](size_t, const btard::signed_statement& st) {
    return st.body.signer == members[2] && st.body.step == 2 && run.graces == 0;
  };
  auto deadlines_before = run.deadlines; // step 0's, for the crash
  auto recs = run.step();
  CHECK(run.graces == 4); // each of the four others waited once
  CHECK(run.deadlines == deadlines_before);
  one_attempt_nobody_silent(recs, specs.size());
  same_params(run, {0, 1, 2, 3, 4});
  // Step 3: peer 4 crashes; it is not coming back, so nobody waits longer for it.
  run.hide = nullptr;
  run.crashed.insert(4);
  deadlines_before = run.deadlines;
  recs = run.step();
  CHECK(run.graces == 4);
  CHECK(run.deadlines > deadlines_before);
  for (size_t i : {0u, 1u, 2u, 3u}) {
    CAPTURE(i);
    REQUIRE(recs.count(i));
    CHECK(recs[i].applied);
    CHECK(recs[i].attempts.front().silent == std::vector<std::string>{members[4]});
  }
  same_params(run, {0, 1, 2, 3});
}

TEST_CASE("a marker one peer reads late while most of the group is past the wait: that peer "
          "waits again instead of calling its signer silent, and the group stays one") {
  // Peer 0's board misses peer 3's commit marker of step 1 for two of its deadlines (replicas
  // that lag for one reader). The other four read it, go on and mark the next phase: peer 0
  // sees most of its group past its wait and waits again; then the marker arrives.
  // (Without waiting again — max_extensions 0 — peer 0 calls peer 3 silent at its deadline and
  // redoes the aggregation without it while the others go on with it: the views split.)
  auto o = options(11);
  std::vector<btard::peer_core_options> specs(5);
  board_run run(o, specs, 11);
  run.max_extensions = 3;
  auto late = run.peers[3]->key();
  run.hide = [&](size_t reader, const btard::signed_statement& s) {
    return reader == 0 && s.body.step == 1 && s.body.signer == late &&
           s.body.kind == btard::statement_kind::phase_done &&
           s.body.slot == btard::index_slot(0, static_cast<uint64_t>(btard::peer_phase::commit)) &&
           run.extensions < 2;
  };
  (void)run.step();
  auto recs = run.step();
  CHECK(run.extensions == 2);
  CHECK(run.deadlines == 0);
  one_attempt_nobody_silent(recs, specs.size());
  same_params(run, {0, 1, 2, 3, 4});
}

TEST_CASE("a peer that crashes in any phase of a step is removed; the others agree and stay") {
  for (auto at : {btard::peer_phase::commit, btard::peer_phase::aggregate,
                  btard::peer_phase::results, btard::peer_phase::reveal,
                  btard::peer_phase::project, btard::peer_phase::check}) {
    std::string phase = btard::phase_name(at);
    CAPTURE(phase);
    auto o = options(9);
    o.membership.cool_down = 2;
    o.membership.silences_to_ban = 2;
    std::vector<btard::peer_core_options> specs(4);
    specs[1].protocol = btard::protocol_attack::non_finite_part;
    specs[1].protocol_step = 1;
    board_run run(o, specs, 9);
    run.crash_at[2] = {3, at};
    std::set<size_t> live{0, 3};
    for (int s = 0; s < 10; ++s) {
      auto recs = run.step();
      for (size_t i : live) {
        CAPTURE(i);
        CAPTURE(s);
        REQUIRE(recs.count(i));
        CHECK(recs[i].applied);
        CHECK(run.peers[i]->phase() == btard::peer_phase::idle);
      }
      same_params(run, live);
    }
    for (size_t i : live)
      CHECK(run.peers[i]->bans().size() == 2);
  }
}

TEST_CASE("each protocol attack bans its attacker in its step; honest peers agree") {
  for (auto attack : btard::protocol_attacks()) {
    std::string attack_name = btard::protocol_attack_name(attack);
    CAPTURE(attack_name);
    auto o = options(7);
    std::vector<btard::peer_core_options> specs(6);
    specs[3].protocol = attack;
    specs[3].protocol_step = 2;
    board_run run(o, specs, 7);
    const auto attacker = run.peers[3]->key();
    for (int s = 0; s < 4; ++s) {
      auto recs = run.step();
      std::set<size_t> honest;
      for (auto& [i, rec] : recs)
        if (i != 3 && run.peers[i]->phase() != btard::peer_phase::banned)
          honest.insert(i);
      same_params(run, honest);
      if (s < 2)
        for (size_t i : honest)
          CHECK(run.peers[i]->bans().empty());
      if (s == 2) {
        for (size_t i : honest) {
          CHECK(run.peers[i]->bans().count(attacker) == 1);
          // Only the dispute rule removes an honest peer, and then with the attacker.
          size_t honest_banned = run.peers[i]->bans().size() - 1;
          bool dispute = attack == btard::protocol_attack::missing_part ||
                         attack == btard::protocol_attack::part_not_committed;
          CHECK(honest_banned == (dispute ? size_t{1} : size_t{0}));
        }
        REQUIRE(!honest.empty());
        auto& h = recs[*honest.begin()];
        CHECK(h.applied);
        CHECK(h.attempts.size() >= 2);
      }
    }
    CHECK(run.peers[3]->phase() == btard::peer_phase::banned);
  }
}

} // namespace starling::test::btard_peer_core
