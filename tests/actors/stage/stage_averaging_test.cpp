// Collaborative stepping of stage peers: gradients averaged through the averager once the stage's
// peers together reached the target batch (actors/stage/stage.hpp, `averaging_options`).
#include <doctest/doctest.h>

#include <optional>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/trainer.hpp"
#include "kernels/data/corpus.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/sim/world.hpp"
#include "support/swarm_fixtures.hpp"

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

} // namespace

TEST_CASE("stage peers with averaging take the same global steps on averaged gradients and end "
          "with identical parameters") {
  runtime::sim::world_options wo;
  wo.seed = 7;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  // Every node runs a DHT node, a DHT board and an averager; node 0 is the bootstrap.
  for (int i = 0; i < 3; ++i) {
    auto& nd = w.add_node("n" + std::to_string(i));
    actors::dht::dht_options d;
    d.address = nd.endpoint() + "/dht";
    d.id = actors::dht::identity::from_seed(700 + static_cast<uint64_t>(i));
    if (i > 0)
      d.bootstrap = {"n0:1/dht"};
    actors::stage::dht_board_options b;
    b.prefix = "swarm/test";
    b.endpoint = nd.endpoint();
    b.stages = 2;
    b.announce_period = caf::timespan{1s};
    b.timeout = caf::timespan{2s};
    actors::averager::averager_options a;
    a.address = nd.endpoint() + "/averager";
    a.target_group_size = 2;
    a.matchmaking_window = caf::timespan{1s};
    a.poll_interval = caf::timespan{100ms};
    a.join_grace = caf::timespan{1s};
    a.round_timeout = caf::timespan{5s};
    nd.on_start([d, b, a](runtime::sim::sim_node& x) {
      auto dht = x.spawn("dht", actors::dht::dht_actor, x.resolver(), d);
      x.spawn("board", actors::stage::dht_board_actor, dht, x.resolver(), b);
      x.spawn("averager", actors::averager::averager_actor, dht, x.resolver(), a);
    });
    w.run_for(500ms);
  }
  auto& sys = w.system();
  // Stage 0: one peer on n0, local steps. Stage 1: a peer on n1 and one on n2, averaging.
  w.node(0).adopt("s0", actors::stage::spawn_stage(sys, avg_stage_opts(0, "s0"),
                                                   w.node(0).lookup("board")));
  const int64_t target = 32;
  for (int i = 1; i <= 2; ++i) {
    auto& x = w.node(i);
    auto name = std::string{"s1"} + static_cast<char>('a' + i - 1);
    auto o = avg_stage_opts(1, name);
    o.averaging.averager = x.lookup("averager");
    o.averaging.dht = x.lookup("dht");
    o.averaging.prefix = "swarm/test";
    o.averaging.target_batch = target;
    o.averaging.progress_period = caf::timespan{200ms};
    o.averaging.average_timeout = caf::timespan{20s};
    x.adopt(name, actors::stage::spawn_stage(sys, o, x.lookup("board")));
  }
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  auto& n0 = w.node(0);
  auto sink = n0.spawn("sink", counting_sink, t);
  actors::trainer::trainer_options to;
  to.stages = 2;
  to.microbatch = 4;
  to.seq_len = 8;
  to.microbatches = 96;
  to.max_inflight = 2;
  to.hop_timeout = caf::timespan{1s};
  to.refresh_every = caf::timespan{500ms};
  to.codec = kernels::codec_id::none;
  n0.adopt("trainer",
           actors::trainer::spawn_trainer(sys, to, small_corpus(), n0.lookup("board"), sink));
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
    REQUIRE(s->size() == 7);
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
    CHECK(s[3] == s[2]);
    CHECK(s[4] == 0);
    CHECK(s[5] == 0);
  }
  // Same start, same averaged gradients: the same parameters.
  auto a = states[0].params.tensor.to(torch::kFloat);
  auto b = states[1].params.tensor.to(torch::kFloat);
  REQUIRE(a.numel() == b.numel());
  auto diff = (a - b).abs().max().item<double>();
  MESSAGE("max parameter difference between the two stage-1 peers: " << diff);
  CHECK(diff < 1e-5);
  // And they moved from the initialization (stage 0 only ever steps locally).
  auto init = ask<messages::stage_state>(w, n0, n0.lookup("s0"), get_atom::value,
                                         state_atom::value);
  REQUIRE(init);
  CHECK(init->steps > 0);
  CHECK(t->losses.back() < t->losses.front());
}

TEST_CASE("a stage peer with averaging but no partner steps on its own gradients and counts it") {
  runtime::sim::world_options wo;
  wo.seed = 9;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  for (int i = 0; i < 2; ++i) {
    auto& nd = w.add_node("n" + std::to_string(i));
    actors::dht::dht_options d;
    d.address = nd.endpoint() + "/dht";
    d.id = actors::dht::identity::from_seed(800 + static_cast<uint64_t>(i));
    if (i > 0)
      d.bootstrap = {"n0:1/dht"};
    actors::stage::dht_board_options b;
    b.prefix = "swarm/solo";
    b.endpoint = nd.endpoint();
    b.stages = 2;
    b.announce_period = caf::timespan{1s};
    b.timeout = caf::timespan{2s};
    actors::averager::averager_options a;
    a.address = nd.endpoint() + "/averager";
    a.matchmaking_window = caf::timespan{500ms};
    a.poll_interval = caf::timespan{100ms};
    a.join_grace = caf::timespan{500ms};
    nd.on_start([d, b, a](runtime::sim::sim_node& x) {
      auto dht = x.spawn("dht", actors::dht::dht_actor, x.resolver(), d);
      x.spawn("board", actors::stage::dht_board_actor, dht, x.resolver(), b);
      x.spawn("averager", actors::averager::averager_actor, dht, x.resolver(), a);
    });
    w.run_for(500ms);
  }
  auto& sys = w.system();
  auto& n0 = w.node(0);
  auto& n1 = w.node(1);
  n0.adopt("s0", actors::stage::spawn_stage(sys, avg_stage_opts(0, "s0"), n0.lookup("board")));
  auto o = avg_stage_opts(1, "s1");
  o.averaging.averager = n1.lookup("averager");
  o.averaging.dht = n1.lookup("dht");
  o.averaging.prefix = "swarm/solo";
  o.averaging.target_batch = 16;
  o.averaging.progress_period = caf::timespan{200ms};
  n1.adopt("s1", actors::stage::spawn_stage(sys, o, n1.lookup("board")));
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  auto sink = n0.spawn("sink", counting_sink, t);
  actors::trainer::trainer_options to;
  to.stages = 2;
  to.microbatch = 4;
  to.seq_len = 8;
  to.microbatches = 40;
  to.max_inflight = 2;
  to.hop_timeout = caf::timespan{1s};
  to.refresh_every = caf::timespan{500ms};
  to.codec = kernels::codec_id::none;
  n0.adopt("trainer",
           actors::trainer::spawn_trainer(sys, to, small_corpus(), n0.lookup("board"), sink));
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 40);
  w.run_for(10s);
  auto s = ask<std::vector<uint64_t>>(w, n1, n1.lookup("s1"), status_atom::value);
  REQUIRE(s);
  REQUIRE(s->size() == 7);
  MESSAGE("s1: steps " << (*s)[0] << " rounds " << (*s)[2] << " no_partner " << (*s)[4]);
  CHECK((*s)[1] == 40 * 4);
  CHECK((*s)[0] >= 2);
  CHECK((*s)[0] == (*s)[2]);
  CHECK((*s)[4] == (*s)[2]); // every round found nobody
  CHECK((*s)[3] == 0);
  CHECK((*s)[6] == 0);       // and each stepped on its own, non-empty gradient
  CHECK(t->losses.back() < t->losses.front());
}
