// Collaborative stepping of stage peers: gradients averaged through the averager once the stage's
// peers together reached the target batch (actors/stage/stage.hpp, `averaging_options`).
#include <doctest/doctest.h>

#include <optional>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/collab/progress.hpp"
#include "actors/dht/dht.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/trainer.hpp"
#include "kernels/data/corpus.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "messages/swarm.hpp"
#include "runtime/sim/world.hpp"
#include "support/swarm_fixtures.hpp"

namespace starling::test::actors_stage_averaging_test {

using namespace starling;
using namespace std::chrono_literals;

namespace {

using testing::ask;
using testing::counting_sink;
using testing::small_corpus;
using testing::tally;

actors::stage::stage_options avg_stage_opts(uint64_t stage, const std::string& name) {
  return testing::stage_opts(stage, static_cast<int64_t>(stage), static_cast<int64_t>(stage) + 1,
                             name);
}

/// Adds `count` simulated nodes, each running a DHT node (node 0 is the bootstrap), a DHT board
/// under `prefix` and an averager with the given matchmaking settings.
void add_averaging_nodes(runtime::sim::world& w, int count, uint64_t id_seed,
                         const std::string& prefix, actors::averager::averager_options a) {
  for (int i = 0; i < count; ++i) {
    auto& nd = w.add_node("n" + std::to_string(i));
    auto setup = testing::dht_board_node(nd, i, id_seed, prefix, 2);
    auto d = setup.dht;
    auto b = setup.board;
    a.address = nd.endpoint() + "/averager";
    nd.on_start([d, b, a](runtime::sim::sim_node& x) {
      auto dht = x.spawn("dht", actors::dht::dht_actor, x.resolver(), d);
      x.spawn("board", actors::stage::dht_board_actor, dht, x.resolver(), b);
      x.spawn("averager", actors::averager::averager_actor, dht, x.resolver(), a);
    });
    w.run_for(500ms);
  }
}

/// A stage-1 peer on node `x` that averages through that node's averager.
caf::actor spawn_averaging_peer(runtime::sim::world& w, runtime::sim::sim_node& x,
                                const std::string& name, const std::string& prefix,
                                int64_t target) {
  auto o = avg_stage_opts(1, name);
  o.averaging.averager = x.lookup("averager");
  o.averaging.dht = x.lookup("dht");
  o.averaging.prefix = prefix;
  o.averaging.target_batch = target;
  o.averaging.progress_period = caf::timespan{200ms};
  o.averaging.average_timeout = caf::timespan{20s};
  auto peer = actors::stage::spawn_stage(w.system(), o, x.lookup("board"));
  x.adopt(name, peer);
  return peer;
}

/// Starts a trainer of `microbatches` x 4 samples through the two stages on node 0.
void start_trainer(runtime::sim::world& w, std::shared_ptr<tally> t, int64_t microbatches) {
  auto& n0 = w.node(0);
  auto sink = n0.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(2, microbatches, 2, caf::timespan{1s});
  n0.adopt("trainer", actors::trainer::spawn_trainer(w.system(), to, small_corpus(),
                                                     n0.lookup("board"), sink));
}

/// What a newcomer to stage 1 (spawned on node 0 with `download_state`) ends with after 10 s.
struct newcomer_view {
  std::vector<uint64_t> status; // the stage peer's counters (`status_fields`)
  messages::stage_state state;
};

newcomer_view join_newcomer(runtime::sim::world& w) {
  auto& n0 = w.node(0);
  auto o = avg_stage_opts(1, "s1new");
  o.download_state = true;
  auto fresh = actors::stage::spawn_stage(w.system(), o, n0.lookup("board"));
  n0.adopt("s1new", fresh);
  w.run_for(10s);
  auto ns = ask<std::vector<uint64_t>>(w, n0, fresh, status_atom::value);
  REQUIRE(ns);
  REQUIRE(ns->size() == actors::stage::st_count);
  auto got = ask<messages::stage_state>(w, n0, fresh, get_atom::value, state_atom::value);
  REQUIRE(got);
  return {*ns, *got};
}

} // namespace

TEST_CASE("stage peers with averaging take the same global steps on averaged gradients and end "
          "with identical parameters") {
  runtime::sim::world_options wo;
  wo.seed = 7;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  actors::averager::averager_options a;
  a.target_group_size = 2;
  a.matchmaking_window = caf::timespan{1s};
  a.poll_interval = caf::timespan{100ms};
  a.join_grace = caf::timespan{1s};
  a.round_timeout = caf::timespan{5s};
  add_averaging_nodes(w, 3, 700, "swarm/test", a);
  // Stage 0: one peer on n0, local steps. Stage 1: a peer on n1 and one on n2, averaging.
  auto& n0 = w.node(0);
  n0.adopt("s0", actors::stage::spawn_stage(w.system(), avg_stage_opts(0, "s0"),
                                            n0.lookup("board")));
  const int64_t target = 32;
  for (int i = 1; i <= 2; ++i)
    spawn_averaging_peer(w, w.node(i), std::string{"s1"} + static_cast<char>('a' + i - 1),
                         "swarm/test", target);
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  start_trainer(w, t, 96);
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 96);
  CHECK(t->samples == 96 * 4);
  // Let the last rounds finish (the leftovers below the target stay pending).
  w.run_for(30s);
  std::vector<std::vector<uint64_t>> stats;
  std::vector<messages::stage_state> states;
  for (int i = 1; i <= 2; ++i) {
    auto name = std::string{"s1"} + static_cast<char>('a' + i - 1);
    auto peer = w.node(i).lookup(name);
    REQUIRE(peer);
    auto s = ask<std::vector<uint64_t>>(w, w.node(i), peer, status_atom::value);
    REQUIRE(s);
    REQUIRE(s->size() == actors::stage::st_count);
    stats.push_back(*s);
    auto st = ask<messages::stage_state>(w, w.node(i), peer, get_atom::value, state_atom::value);
    REQUIRE(st);
    states.push_back(*st);
    MESSAGE(name << ": steps " << (*s)[0] << " samples " << (*s)[1] << " rounds " << (*s)[2]
                 << " averaged " << (*s)[3] << " no_partner " << (*s)[4] << " failed "
                 << (*s)[5] << " skipped " << (*s)[6]);
  }
  // Every sample of stage 1 went to one of its two peers.
  CHECK(stats[0][1] + stats[1][1] == 96 * 4);
  CHECK(stats[0][1] > 0);
  CHECK(stats[1][1] > 0);
  // Same global steps, every one of them averaged.
  CHECK(stats[0][0] == stats[1][0]);
  // At most one step per target batch; fewer since backwards served while a round is in flight
  // (matchmaking takes a 1 s window) count towards the next step, which overshoots the target.
  CHECK(stats[0][0] >= 3);
  CHECK(stats[0][0] <= 96 * 4 / target);
  for (auto& s : stats) {
    // Every step averaged. Once the trainers stopped, the peers' extrapolated rates predicted
    // one more step: its round had no sample in it, averaged nothing and took no step (it once
    // stepped on the zero gradient, again and again until the rates went to 0, moving the
    // parameters through Adam's moments); no second round at that step rests on rates alone.
    CHECK(s[3] == s[0]);
    CHECK(s[3] + s[5] == s[2]);
    CHECK(s[4] == 0);
    CHECK(s[5] <= 1);
    CHECK(s[6] == s[5]);
  }
  // Same start, same averaged gradients: the same parameters.
  auto pa = states[0].params.tensor.to(torch::kFloat);
  auto pb = states[1].params.tensor.to(torch::kFloat);
  REQUIRE(pa.numel() == pb.numel());
  auto diff = (pa - pb).abs().max().item<double>();
  MESSAGE("max parameter difference between the two stage-1 peers: " << diff);
  CHECK(diff < 1e-5);
  // And they moved from the initialization (stage 0 only ever steps locally).
  auto init = ask<messages::stage_state>(w, n0, n0.lookup("s0"), get_atom::value,
                                         state_atom::value);
  REQUIRE(init);
  CHECK(init->steps > 0);
  CHECK(t->losses.back() < t->losses.front());
  // A newcomer downloads the stage's state in two parts, one from each peer: the averaged
  // replicas are bit for bit the same state (parameters, optimizer, step), so the parts match.
  auto nc = join_newcomer(w);
  CHECK(nc.status[0] == stats[0][0]); // the stage's step
  CHECK(nc.status[8] == 1);           // one download ...
  CHECK(nc.status[9] == 2);           // ... from two donors
  CHECK(torch::equal(nc.state.params.tensor, states[0].params.tensor));
  CHECK(torch::equal(nc.state.moments.tensor, states[0].moments.tensor));
  CHECK(nc.state.optimizer_steps == states[0].optimizer_steps);
  CHECK(nc.state.optimizer_steps.front() == stats[0][0]); // Adam stepped with every global step
}

TEST_CASE("a stage peer with averaging that never saw a partner steps on its own gradients at "
          "once and counts it") {
  runtime::sim::world_options wo;
  wo.seed = 9;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  actors::averager::averager_options a;
  a.matchmaking_window = caf::timespan{500ms};
  a.poll_interval = caf::timespan{100ms};
  a.join_grace = caf::timespan{500ms};
  add_averaging_nodes(w, 2, 800, "swarm/solo", a);
  auto& n0 = w.node(0);
  auto& n1 = w.node(1);
  n0.adopt("s0", actors::stage::spawn_stage(w.system(), avg_stage_opts(0, "s0"),
                                            n0.lookup("board")));
  spawn_averaging_peer(w, n1, "s1", "swarm/solo", 16);
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  start_trainer(w, t, 40);
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 40);
  w.run_for(10s);
  auto s = ask<std::vector<uint64_t>>(w, n1, n1.lookup("s1"), status_atom::value);
  REQUIRE(s);
  REQUIRE(s->size() == actors::stage::st_count);
  MESSAGE("s1: steps " << (*s)[0] << " rounds " << (*s)[2] << " alone " << (*s)[12]
                      << " pending " << (*s)[14]);
  CHECK((*s)[1] == 40 * 4);
  CHECK((*s)[0] >= 2);
  CHECK((*s)[2] == 0); // no round waited out its matchmaking window for nobody
  CHECK((*s)[3] == 0);
  CHECK((*s)[6] == 0);
  // Every served sample is in a step on its own gradient or still pending.
  CHECK((*s)[12] > 0);
  CHECK((*s)[12] + (*s)[13] + (*s)[14] == (*s)[1]);
  CHECK((*s)[13] == 0);
  CHECK(t->losses.back() < t->losses.front());
}

TEST_CASE("a stage peer cut off from its stage falls behind and catches up by downloading the "
          "state of a peer at a later step") {
  runtime::sim::world_options wo;
  wo.seed = 11;
  wo.network.defaults.latency = 20ms; // a microbatch takes ~0.1 virtual s: rounds happen meanwhile
  runtime::sim::world w{wo};
  actors::averager::averager_options a;
  a.target_group_size = 2;
  a.matchmaking_window = caf::timespan{1s};
  a.poll_interval = caf::timespan{100ms};
  a.join_grace = caf::timespan{1s};
  a.round_timeout = caf::timespan{5s};
  add_averaging_nodes(w, 3, 900, "swarm/lag", a);
  auto& n0 = w.node(0);
  n0.adopt("s0", actors::stage::spawn_stage(w.system(), avg_stage_opts(0, "s0"),
                                            n0.lookup("board")));
  const int64_t target = 16;
  spawn_averaging_peer(w, w.node(1), "s1a", "swarm/lag", target);
  // s1b's node is cut off from the others before it serves anything: s1a takes global steps
  // alone (no partner), s1b stays at step 0 with no samples.
  w.partition("n2", "n0");
  w.partition("n2", "n1");
  spawn_averaging_peer(w, w.node(2), "s1b", "swarm/lag", target);
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  start_trainer(w, t, 400);
  REQUIRE(w.run_until([&] { return t->microbatches >= 80; }, 600s));
  auto behind = ask<std::vector<uint64_t>>(w, w.node(2), w.node(2).lookup("s1b"),
                                           status_atom::value);
  auto leader = ask<std::vector<uint64_t>>(w, w.node(1), w.node(1).lookup("s1a"),
                                           status_atom::value);
  REQUIRE(behind);
  REQUIRE(leader);
  MESSAGE("before reconnecting: s1a at step " << (*leader)[0] << ", s1b at step " << (*behind)[0]);
  CHECK((*behind)[0] == 0);
  CHECK((*leader)[0] >= 1);
  // Reconnected (its DHT node, alone, joins its bootstrap peer again), s1b sees s1a at a later
  // step, downloads its state, is found by the trainer, and from then on both average: the same
  // steps and the same parameters at the end.
  w.heal("n2", "n0");
  w.heal("n2", "n1");
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 400);
  w.run_for(30s);
  std::vector<std::vector<uint64_t>> stats;
  std::vector<torch::Tensor> params;
  for (int i = 1; i <= 2; ++i) {
    auto name = std::string{"s1"} + static_cast<char>('a' + i - 1);
    auto peer = w.node(i).lookup(name);
    auto s = ask<std::vector<uint64_t>>(w, w.node(i), peer, status_atom::value);
    auto st = ask<messages::stage_state>(w, w.node(i), peer, get_atom::value, state_atom::value);
    REQUIRE(s);
    REQUIRE(st);
    MESSAGE(name << ": steps " << (*s)[0] << " samples " << (*s)[1] << " rounds " << (*s)[2]
                 << " averaged " << (*s)[3] << " no_partner " << (*s)[4] << " caught up "
                 << (*s)[7]);
    stats.push_back(*s);
    params.push_back(st->params.tensor.to(torch::kFloat));
  }
  CHECK(stats[1][7] >= 1);    // s1b caught up
  CHECK(stats[0][7] == 0);    // s1a never fell behind
  CHECK(stats[1][1] > 0);     // and s1b served once reconnected
  CHECK(stats[0][0] == stats[1][0]);
  CHECK(stats[1][3] >= 1);    // rounds averaged together after the catch-up
  auto diff = (params[0] - params[1]).abs().max().item<double>();
  MESSAGE("max parameter difference after the catch-up: " << diff);
  CHECK(diff < 1e-5);
}

TEST_CASE("a newcomer whose donors hold different states falls back to one donor's whole state") {
  runtime::sim::world_options wo;
  wo.seed = 5;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  add_averaging_nodes(w, 3, 950, "swarm/diverged", actors::averager::averager_options{});
  // Two stage-1 peers initialized from different seeds: replicas that diverged.
  for (int i = 1; i <= 2; ++i) {
    auto o = avg_stage_opts(1, "s1" + std::to_string(i));
    std::any_cast<kernels::gpt_config&>(o.model.options).seed = static_cast<uint64_t>(40 + i);
    auto& x = w.node(i);
    x.adopt(o.name, actors::stage::spawn_stage(w.system(), o, x.lookup("board")));
  }
  w.run_for(3s);
  auto nc = join_newcomer(w);
  CHECK(nc.status[8] == 1); // one download ...
  CHECK(nc.status[9] == 1); // ... of one donor's whole state, after the parts did not match
  int equal_to = 0;
  for (int i = 1; i <= 2; ++i) {
    auto donor = ask<messages::stage_state>(w, w.node(i), w.node(i).lookup("s1" + std::to_string(i)),
                                            get_atom::value, state_atom::value);
    REQUIRE(donor);
    equal_to += torch::equal(nc.state.params.tensor, donor->params.tensor) ? 1 : 0;
  }
  CHECK(equal_to == 1);
}

TEST_CASE("three stage peers follow the collaborative optimizer's core: signed progress records, "
          "steps taken together, every confirmed sample accounted for") {
  using namespace actors::stage;
  runtime::sim::world_options wo;
  wo.seed = 13;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  actors::averager::averager_options a;
  a.target_group_size = 3;
  a.matchmaking_window = caf::timespan{1s};
  a.poll_interval = caf::timespan{100ms};
  a.join_grace = caf::timespan{1s};
  a.round_timeout = caf::timespan{5s};
  add_averaging_nodes(w, 3, 700, "swarm/three", a);
  // Stage 0: one local-mode peer on n0; stage 1: a peer on each node (n0's averager is free:
  // stage 0 does not average).
  auto& n0 = w.node(0);
  n0.adopt("s0", spawn_stage(w.system(), avg_stage_opts(0, "s0"), n0.lookup("board")));
  const int64_t target = 48;
  for (int i = 0; i < 3; ++i)
    spawn_averaging_peer(w, w.node(i), std::string{"s1"} + static_cast<char>('a' + i),
                         "swarm/three", target);
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  start_trainer(w, t, 120);
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 120);
  w.run_for(30s);
  std::vector<std::vector<uint64_t>> stats;
  std::vector<torch::Tensor> params;
  uint64_t confirmed = 0;
  for (int i = 0; i < 3; ++i) {
    auto name = std::string{"s1"} + static_cast<char>('a' + i);
    auto peer = w.node(i).lookup(name);
    REQUIRE(peer);
    auto s = ask<std::vector<uint64_t>>(w, w.node(i), peer, status_atom::value);
    REQUIRE(s);
    REQUIRE(s->size() == st_count);
    auto st = ask<messages::stage_state>(w, w.node(i), peer, get_atom::value, state_atom::value);
    REQUIRE(st);
    auto c = ask<std::vector<uint64_t>>(w, w.node(i), peer, status_atom::value,
                                        messages::commit_atom::value);
    REQUIRE(c);
    CHECK((*c)[1] == 0); // nothing lost: every computed gradient was confirmed
    MESSAGE(name << ": steps " << (*s)[st_steps] << " rounds " << (*s)[st_rounds] << " averaged "
                 << (*s)[st_averaged] << " no_partner " << (*s)[st_no_partner] << " failed "
                 << (*s)[st_failed] << " samples averaged " << (*s)[st_samples_averaged]
                 << " alone " << (*s)[st_samples_alone] << " dropped " << (*s)[st_samples_dropped]
                 << " pending " << (*s)[st_pending] << " state rounds " << (*s)[st_state_rounds]);
    // The core counted each confirmed sample exactly once: in an averaged update, an own step,
    // dropped, or pending towards the next step (no round is in flight any more).
    auto& v = *s;
    CHECK(v[st_samples_averaged] + v[st_samples_alone] + v[st_samples_dropped] + v[st_pending]
          == v[st_samples]);
    CHECK(v[st_samples] > 0);
    CHECK(v[st_rounds] >= 1);
    CHECK(v[st_averaged] >= 1);
    confirmed += v[st_samples];
    stats.push_back(v);
    params.push_back(st->params.tensor.to(torch::kFloat));
  }
  CHECK(confirmed == 120 * 4);
  // One global step for the stage: same steps, same parameters.
  CHECK(stats[0][st_steps] >= 2);
  CHECK(stats[0][st_steps] == stats[1][st_steps]);
  CHECK(stats[1][st_steps] == stats[2][st_steps]);
  for (int i = 1; i < 3; ++i) {
    auto diff = (params[0] - params[static_cast<size_t>(i)]).abs().max().item<double>();
    MESSAGE("max parameter difference s1a - s1" << static_cast<char>('a' + i) << ": " << diff);
    CHECK(diff < 1e-5);
  }
  // Their progress records are the core's (decoded, validated), under owned sub-keys (signed by
  // the node's key) whose record repeats the sub-key, at the stage's step.
  auto got = ask<messages::dht_get_result>(w, n0, n0.lookup("dht"), get_atom::value,
                                           progress_key("swarm/three", 1));
  REQUIRE(got);
  size_t records = 0;
  for (auto& rec : got->records) {
    if (!rec.has_subkey)
      continue;
    auto r = actors::collab::decode_progress(rec.value);
    REQUIRE(r);
    CHECK(r->peer == rec.subkey);
    CHECK(rec.subkey.find("[owner:") != std::string::npos);
    CHECK(r->step == stats[0][st_steps]);
    records++;
  }
  CHECK(records == 3);
}

} // namespace starling::test::actors_stage_averaging_test
