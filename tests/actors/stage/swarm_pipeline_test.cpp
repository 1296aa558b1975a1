#include <doctest/doctest.h>

#include <optional>

#include <caf/all.hpp>

#include "actors/dht/dht.hpp"
#include "actors/stage/board.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/supervisor/supervisor.hpp"
#include "actors/trainer/trainer.hpp"
#include "kernels/data/corpus.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/sim/world.hpp"
#include "support/swarm_fixtures.hpp"

namespace starling::test::actors_swarm_pipeline_test {

using namespace starling;
using namespace std::chrono_literals;

namespace {

/// Counts what trainers report: microbatches, samples, retries, stops.
using testing::counting_sink;
using testing::small_corpus;
using testing::stage_opts;
using testing::tally;

/// A stage peer's state, asked from a short-lived actor on `n`; false if it did not answer.
bool state_of(runtime::sim::world& w, runtime::sim::sim_node& n, caf::actor peer,
              messages::stage_state& out) {
  auto st = testing::ask<messages::stage_state>(w, n, peer, get_atom::value, state_atom::value);
  if (!st)
    return false;
  out = *st;
  return true;
}

} // namespace

TEST_CASE("a pipeline with a stage peer killed mid-run completes every microbatch exactly once, "
          "the supervisor respawns it, it downloads state and serves again") {
  testing::board_world bw{11, 2};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& sys = w.system();
  auto& board = bw.board;
  auto s0 = actors::stage::spawn_stage(sys, stage_opts(0, 0, 1, "s0a"), board);
  n.adopt("s0a", s0);
  w.run();
  // Stage 1's two peers live under a supervisor that respawns a dead one 3 s later.
  std::vector<actors::supervisor::child_spec> children;
  for (std::string base : {"s1a", "s1b"}) {
    actors::supervisor::child_spec c;
    c.name = base;
    c.restart_delay = caf::timespan{3s};
    c.spawn = [&sys, &n, board, base](int generation) {
      auto o = stage_opts(1, 1, 2, base + "g" + std::to_string(generation));
      o.download_state = generation > 0;
      auto a = actors::stage::spawn_stage(sys, o, board);
      n.adopt(o.name, a);
      return a;
    };
    children.push_back(c);
  }
  auto respawns = std::make_shared<int>(0);
  auto observer = n.spawn("observer", [respawns](caf::event_based_actor*) -> caf::behavior {
    return {[=](respawn_atom, uint64_t, const std::string&, int) { ++*respawns; }};
  });
  auto sup = actors::supervisor::spawn_supervisor(sys, children, observer);
  n.adopt("supervisor", sup);
  w.run();
  auto t = std::make_shared<tally>();
  auto sink = sys.spawn(counting_sink, t);
  n.adopt("sink", sink);
  auto to = testing::tiny_trainer(2, 120, 2, caf::timespan{1s});
  auto trainer = actors::trainer::spawn_trainer(sys, to, small_corpus(), board, sink);
  n.adopt("trainer", trainer);
  // Let some microbatches through, then preempt one of stage 1's two peers.
  REQUIRE(w.run_until([&] { return t->microbatches >= 10; }, 60s));
  caf::anon_send(sup, preempt_atom::value, uint64_t{0});
  auto killed_at = t->microbatches;
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 120);
  CHECK(t->samples == 120 * 4);
  // Every batch of the trainer's stream [0, 120) completed once, the retried ones included.
  CHECK(t->repeats == 0);
  CHECK(t->batches["trainer"].size() == 120);
  CHECK(*t->batches["trainer"].rbegin() == 119);
  CHECK(killed_at < 120);
  // The loss is finite throughout and training moved it.
  for (auto l : t->losses)
    CHECK(std::isfinite(l));
  CHECK(t->losses.back() < t->losses.front());
  // The kill caught a hop in flight (deterministic under the seed): the retry path ran.
  CHECK(t->retries >= 1);
  MESSAGE("retries after the kill: " << t->retries);
  // Compute takes no virtual time, so the trainer may finish before the restart delay passed;
  // the supervisor respawns the peer 3 s after its death either way.
  w.run_for(5s);
  CHECK(*respawns == 1);
  auto reborn = n.lookup("s1ag1");
  REQUIRE(reborn);
  messages::stage_state st;
  REQUIRE(state_of(w, n, reborn, st));
  CHECK(st.steps > 0); // downloaded from s1b: the optimizer's progress, not a fresh start
  CHECK(st.samples == 0);
  // A second trainer: the new peer enters the wiring at the heap minimum and serves.
  auto t2 = std::make_shared<tally>();
  auto sink2 = n.spawn("sink2", counting_sink, t2);
  to.name = "trainer2";
  to.microbatches = 40;
  n.adopt("trainer2", actors::trainer::spawn_trainer(sys, to, small_corpus(), board, sink2));
  REQUIRE(w.run_until([&] { return t2->stops == 1; }, 600s));
  CHECK(t2->microbatches == 40);
  REQUIRE(state_of(w, n, reborn, st));
  CHECK(st.samples > 0);
}

TEST_CASE("stage peers on three simulated nodes find each other through the DHT, a node lost "
          "mid-run is retried around, restarts, downloads state and serves again") {
  runtime::sim::world_options wo;
  wo.seed = 5;
  wo.network.defaults.latency = 5ms;
  runtime::sim::world w{wo};
  // Every node runs a DHT node and a DHT-backed board; node 0 is the bootstrap.
  testing::add_dht_board_nodes(w, 3, 900, "swarm/test", 2);
  auto& sys = w.system();
  // Stage peers: node 1 serves both stages, node 2 too; a restart of node 2 respawns its peers
  // under new names (a new generation), as a supervisor would.
  auto generation = std::make_shared<int>(0);
  auto spawn_peers = [&sys, generation](runtime::sim::sim_node& x, bool second) {
    for (uint64_t s = 0; s < 2; ++s) {
      auto name = fmt::format("s{}{}g{}", s, second ? "b" : "a", second ? *generation : 0);
      auto o = stage_opts(s, static_cast<int64_t>(s), static_cast<int64_t>(s) + 1, name);
      o.download_state = second && *generation > 1;
      x.adopt(name, actors::stage::spawn_stage(sys, o, x.lookup("board")));
    }
  };
  w.node(1).on_start([=](runtime::sim::sim_node& x) { spawn_peers(x, false); });
  w.node(2).on_start([=](runtime::sim::sim_node& x) {
    ++*generation;
    spawn_peers(x, true);
  });
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  auto& n0 = w.node(0);
  auto sink = n0.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(2, 200, 2, caf::timespan{1s});
  to.codec = kernels::codec_id::blockwise8;
  n0.adopt("trainer",
           actors::trainer::spawn_trainer(sys, to, small_corpus(), n0.lookup("board"), sink));
  REQUIRE(w.run_until([&] { return t->microbatches >= 15; }, 120s));
  w.kill_node("n2", std::chrono::nanoseconds{-1});
  auto killed_at = t->microbatches;
  REQUIRE(w.run_until([&] { return t->microbatches >= killed_at + 10; }, 120s));
  w.restart_node("n2");
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 200);
  CHECK(t->samples == 200 * 4);
  CHECK(t->losses.back() < t->losses.front());
  // The restarted peers serve again: each did work after its state download.
  for (uint64_t s = 0; s < 2; ++s) {
    auto peer = w.node(2).lookup(fmt::format("s{}bg2", s));
    REQUIRE(peer);
    messages::stage_state got;
    REQUIRE(state_of(w, w.node(2), peer, got));
    CHECK(got.samples > 0);
    CHECK(got.steps > 0);
  }
}

namespace {

/// Training samples (backwards) served by the peers named `names`, one trainer of 10
/// microbatches through a one-stage swarm of two equal cost-model peers, the first of which has
/// 40 s of forwards queued from elsewhere; `probe` as in trainer_options.
/// Two equal cost-model peers of the whole 2-block model on `bw`'s node: a 4-sample forward
/// takes 0.4 s, its backward 0.8 s.
std::vector<caf::actor> two_cost_peers(testing::board_world& bw,
                                       const std::vector<std::string>& names) {
  std::vector<caf::actor> peers;
  for (auto& name : names) {
    auto o = stage_opts(0, 0, 2, name);
    o.backend = actors::stage::compute_backend::cost_model;
    o.cost_model.forward_s = 0.1;
    o.cost_model.backward_factor = 2;
    peers.push_back(actors::stage::spawn_stage(bw.w.system(), o, bw.board));
    bw.n.adopt(name, peers.back());
  }
  bw.w.run();
  return peers;
}

std::vector<uint64_t> served_with_one_peer_loaded(bool probe) {
  testing::board_world bw{5, 1};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& sys = w.system();
  auto& board = bw.board;
  auto peers = two_cost_peers(bw, {"s0loaded", "s0idle"});
  // 100 forwards queued at the first peer by someone else: 40 s of work.
  auto loaded = peers[0];
  n.spawn("other", [loaded](caf::event_based_actor* self) {
    for (int i = 0; i < 100; ++i) {
      messages::stage_forward req{
        messages::tensor_msg{torch::zeros({4, 8}, torch::kLong), kernels::codec_id::none, {}, {}},
        messages::tensor_msg{torch::zeros({4, 8}, torch::kLong), kernels::codec_id::none, {}, {}},
        uint64_t{1}};
      self->request(loaded, caf::infinite, std::move(req))
        .then([](messages::tensor_msg&) {}, [](caf::error&) {});
    }
    return caf::behavior{[](int) {}};
  });
  w.run_for(100ms);
  auto t = std::make_shared<tally>();
  auto sink = n.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(1, 10, 1, caf::timespan{120s});
  to.probe = probe;
  to.seed = 9;
  n.adopt("trainer", actors::trainer::spawn_trainer(sys, to, small_corpus(), board, sink));
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 10);
  std::vector<uint64_t> out;
  for (auto& p : peers) {
    auto st = testing::ask<std::vector<uint64_t>>(w, n, p, status_atom::value);
    REQUIRE(st);
    out.push_back((*st)[1]);
  }
  return out;
}

} // namespace

TEST_CASE("probing: the trainer sends each hop to the less loaded of two cost-model peers") {
  auto probed = served_with_one_peer_loaded(true);
  CHECK(probed[0] == 0);      // the peer with 40 s queued served nothing
  CHECK(probed[1] == 10 * 4); // the idle one everything
  // Without probes the wiring alone does not see the other caller's queue: both serve.
  auto blind = served_with_one_peer_loaded(false);
  CHECK(blind[0] > 0);
  CHECK(blind[0] + blind[1] == 10 * 4);
}

TEST_CASE("real stage peers report their measured throughput to the board") {
  testing::board_world bw{13, 2};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& sys = w.system();
  auto& board = bw.board;
  std::vector<caf::actor> peers;
  for (uint64_t s = 0; s < 2; ++s) {
    auto o = stage_opts(s, static_cast<int64_t>(s), static_cast<int64_t>(s) + 1,
                        "s" + std::to_string(s));
    o.report_every = caf::timespan{1s};
    peers.push_back(actors::stage::spawn_stage(sys, o, board));
    n.adopt(o.name, peers.back());
  }
  w.run_for(1s);
  auto t = std::make_shared<tally>();
  auto sink = n.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(2, 12, 2, caf::timespan{5s});
  n.adopt("trainer", actors::trainer::spawn_trainer(sys, to, small_corpus(), board, sink));
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 120s));
  w.run_for(2s); // at least one report period after the last backward
  auto l = testing::ask_loads(w, n, board, peers[1]);
  REQUIRE(l);
  CHECK(l->peers == std::vector<int64_t>{1, 1});
  CHECK(l->throughput[0] > 0);
  CHECK(l->throughput[1] > 0);
  CHECK(l->mine > 0);
  CHECK(l->mine == doctest::Approx(l->throughput[1]));
}

namespace {

/// The largest work any of `peers` answers a probe with (seconds queued), read every 250 ms
/// from an actor on `n` for as long as the world runs.
template <class Node>
std::shared_ptr<double> watch_largest_backlog(Node& n, std::vector<caf::actor> peers) {
  auto largest = std::make_shared<double>(0);
  n.spawn("watch", [peers, largest](caf::event_based_actor* self) -> caf::behavior {
    self->send(self, 0);
    return {[=](int) {
      for (auto& p : peers)
        self->request(p, caf::timespan{1s}, probe_atom::value)
          .then([=](double backlog) { *largest = std::max(*largest, backlog); },
                [](caf::error&) {});
      self->delayed_send(self, 250ms, 0);
    }};
  });
  return largest;
}

/// The largest work queued (seconds, as probes answer) at either of two equal cost-model peers
/// of a one-stage swarm while one trainer runs 40 microbatches with all 40 in flight at once,
/// read every 250 ms; `entry_backlog_s` as in trainer_options.
double largest_backlog(double entry_backlog_s) {
  testing::board_world bw{6, 1};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& sys = w.system();
  auto peers = two_cost_peers(bw, {"s0a", "s0b"});
  auto largest = watch_largest_backlog(n, peers);
  auto t = std::make_shared<tally>();
  auto sink = n.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(1, 40, 40, caf::timespan{120s});
  to.probe = true;
  to.seed = 3;
  to.entry_backlog_s = entry_backlog_s;
  n.adopt("trainer", actors::trainer::spawn_trainer(sys, to, small_corpus(), bw.board, sink));
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 40);
  CHECK(t->samples == 40 * 4);
  CHECK(t->repeats == 0);
  return *largest;
}

} // namespace

TEST_CASE("admission at the entry: with entry_backlog_s a new microbatch waits at the trainer "
          "while the stage-0 peer's queue is long, and every microbatch still completes once") {
  auto open = largest_backlog(0);
  auto held = largest_backlog(2.0);
  MESSAGE("largest backlog at a stage-0 peer: " << open << " s open, " << held
                                                << " s with a 2 s entry limit");
  // 40 forwards at once: about 20 per peer, 8 s of forwards each, then their backwards.
  CHECK(open > 8.0);
  // Forwards enter while a peer's queue is at most 2 s; the backwards of the admitted ones
  // (0.8 s each, not held) come on top.
  CHECK(held < 6.0);
  CHECK(held < 0.5 * open);
}

namespace {

/// What a two-stage swarm whose stage 0 (two peers, forwards 0.4 s) feeds a stage 1 twice as
/// slow (forwards 0.8 s, backwards 1.6 s) does while one trainer runs 40 microbatches all in
/// flight at once, `forward_backlog_s` as in trainer_options: the largest work queued at either
/// stage-1 peer (seconds, as probes answer, read every 250 ms) and the virtual seconds until half
/// of the microbatches completed. Also checks that every microbatch completes once.
struct stage1_run {
  double largest = 0;
  double half_done_s = 0;
};

stage1_run run_stage1(double forward_backlog_s) {
  testing::board_world bw{7, 2};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& sys = w.system();
  std::vector<caf::actor> later_peers;
  for (uint64_t s = 0; s < 2; ++s)
    for (std::string name : {"a", "b"}) {
      auto o = stage_opts(s, static_cast<int64_t>(s), static_cast<int64_t>(s) + 1,
                          "s" + std::to_string(s) + name);
      o.backend = actors::stage::compute_backend::cost_model;
      o.cost_model.forward_s = s == 0 ? 0.1 : 0.2;
      o.cost_model.backward_factor = 2;
      auto p = actors::stage::spawn_stage(sys, o, bw.board);
      n.adopt(o.name, p);
      if (s == 1)
        later_peers.push_back(p);
    }
  w.run();
  auto largest = watch_largest_backlog(n, later_peers);
  auto t = std::make_shared<tally>();
  auto sink = n.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(2, 40, 40, caf::timespan{120s});
  to.probe = true;
  to.seed = 5;
  to.forward_backlog_s = forward_backlog_s;
  n.adopt("trainer", actors::trainer::spawn_trainer(sys, to, small_corpus(), bw.board, sink));
  auto t0 = sys.clock().now();
  REQUIRE(w.run_until([&] { return t->microbatches >= 20; }, 900s));
  auto first = std::chrono::duration<double>(sys.clock().now() - t0).count();
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 900s));
  CHECK(t->microbatches == 40);
  CHECK(t->samples == 40 * 4);
  CHECK(t->repeats == 0);
  return {*largest, first};
}

} // namespace

TEST_CASE("admission of later forwards: with forward_backlog_s a forward to stage 1 waits at the "
          "trainer while the stage-1 peer's queue is long, and every microbatch still completes "
          "once") {
  auto open = run_stage1(0);
  auto held = run_stage1(2.0);
  MESSAGE("largest backlog at a stage-1 peer: " << open.largest << " s open, " << held.largest
                                                << " s with a 2 s forward limit; half of the "
                                                   "microbatches done after "
                                                << open.half_done_s << " s open, "
                                                << held.half_done_s << " s held");
  // Stage 0 hands 40 forwards to stage 1 faster than stage 1 serves them: they pile up there,
  // and every backward at stage 1 waits behind them.
  CHECK(open.largest > 8.0);
  // Held, the queues are shorter (forwards admitted at up to 2 s, backwards on top) and the
  // backwards find fewer forwards ahead of them: microbatches complete sooner.
  CHECK(held.largest < 0.8 * open.largest);
  CHECK(held.half_done_s < open.half_done_s);
}

} // namespace starling::test::actors_swarm_pipeline_test
