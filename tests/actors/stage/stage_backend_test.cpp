// The stage actor with its two backends: the device queue on CAF's clock, the LibTorch backend's
// emulated speed, the cost model's state charged to the network, and a restarted cost-model peer
// downloading its state in a simulated swarm.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/dht/dht.hpp"
#include "actors/stage/board.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/trainer.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "messages/registry.hpp"
#include "messages/swarm.hpp"
#include "runtime/sim/world.hpp"
#include "support/swarm_fixtures.hpp"

namespace starling::test::actors_stage_backend_test {

using namespace starling;
using namespace std::chrono_literals;

namespace {

using actors::stage::compute_backend;
using messages::stage_forward;
using messages::stage_state;
using messages::tensor_msg;
using testing::ask;
using testing::counting_sink;
using testing::small_corpus;
using testing::stage_opts;
using testing::tally;

/// When each answer came, in virtual seconds since the start, by label (in arrival order).
using timeline = std::vector<std::pair<std::string, double>>;

double now_s(runtime::sim::world& w) {
  return std::chrono::duration<double>(w.elapsed()).count();
}

stage_forward tokens_forward(int64_t batch) {
  return stage_forward{tensor_msg{torch::zeros({batch, 8}, torch::kLong),
                                  kernels::codec_id::none, {}, {}},
                       tensor_msg{torch::zeros({batch, 8}, torch::kLong),
                                  kernels::codec_id::none, {}, {}},
                       uint64_t{1}};
}

/// Sends `count` forwards of 4 samples to `peer` at once from an actor on `n`; each answer is
/// logged as "fwd<i>" with its virtual time.
void send_forwards(runtime::sim::world& w, runtime::sim::sim_node& n, caf::actor peer, int count,
                   std::shared_ptr<timeline> log) {
  auto* wp = &w;
  n.spawn("", [=](caf::event_based_actor* self) {
    for (int i = 0; i < count; ++i)
      self->request(peer, caf::infinite, tokens_forward(4))
        .then([=](tensor_msg&) { log->emplace_back("fwd" + std::to_string(i), now_s(*wp)); },
              [=](caf::error&) { log->emplace_back("fwd" + std::to_string(i) + " failed", -1); });
    return caf::behavior{[](int) {}};
  });
}

/// A stage-0 cost-model peer of the 2-layer test model: a 4-sample forward takes 0.4 s at speed
/// 1, no noise.
actors::stage::stage_options cost_peer(const std::string& name) {
  auto o = stage_opts(0, 0, 1, name);
  o.backend = compute_backend::cost_model;
  o.cost_model.forward_s = 0.1;
  o.cost_model.backward_factor = 2;
  return o;
}

} // namespace

TEST_CASE("a cost-model stage queues requests FIFO on virtual time and answers probes, status "
          "and state requests while its device is busy") {
  testing::board_world bw{1, 1};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& board = bw.board;
  auto o = cost_peer("s0");
  o.speed = 0.5; // 0.8 s per forward
  auto peer = actors::stage::spawn_stage(w.system(), o, board);
  n.adopt("s0", peer);
  w.run();
  auto log = std::make_shared<timeline>();
  send_forwards(w, n, peer, 3, log);
  w.run_for(100ms);
  // At 0.1 s the device has 2.3 s of work ahead, and the peer answers at once.
  auto probe = ask<double>(w, n, peer, probe_atom::value);
  REQUIRE(probe);
  CHECK(*probe == doctest::Approx(2.3));
  auto status = ask<std::vector<uint64_t>>(w, n, peer, status_atom::value);
  REQUIRE(status);
  REQUIRE(status->size() == actors::stage::st_count);
  CHECK((*status)[10] == 3); // three requests queued
  auto state = ask<stage_state>(w, n, peer, get_atom::value, state_atom::value);
  REQUIRE(state);
  CHECK(now_s(w) == doctest::Approx(0.1)); // answered without waiting for the device
  CHECK(log->empty());
  CHECK(state->params.tensor.numel() == 8); // the placeholder parameters
  w.run_for(3s);
  REQUIRE(log->size() == 3);
  CHECK((*log)[0].first == "fwd0");
  CHECK((*log)[0].second == doctest::Approx(0.8));
  CHECK((*log)[1].first == "fwd1");
  CHECK((*log)[1].second == doctest::Approx(1.6));
  CHECK((*log)[2].first == "fwd2");
  CHECK((*log)[2].second == doctest::Approx(2.4));
  auto idle = ask<double>(w, n, peer, probe_atom::value);
  REQUIRE(idle);
  CHECK(*idle == 0.0);
}

TEST_CASE("replies still queued when a cost-model peer dies fail at once") {
  testing::board_world bw{2, 1};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& board = bw.board;
  auto peer = actors::stage::spawn_stage(w.system(), cost_peer("s0"), board);
  n.adopt("s0", peer);
  w.run();
  auto log = std::make_shared<timeline>();
  send_forwards(w, n, peer, 2, log);
  w.run_for(500ms); // the first forward (0.4 s) is answered, the second is queued
  caf::anon_send_exit(peer, caf::exit_reason::kill);
  w.run();
  REQUIRE(log->size() == 2);
  CHECK((*log)[0].first == "fwd0");
  CHECK((*log)[1].first == "fwd1 failed");
  CHECK(now_s(w) == doctest::Approx(0.5)); // at the kill, not at a timeout
}

namespace {

/// Virtual times of two forwards sent at once to a LibTorch stage peer of `speed` whose device
/// calls are timed as 0.5 s each.
std::vector<double> torch_reply_times(double speed) {
  testing::board_world bw{3, 2};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& board = bw.board;
  auto o = stage_opts(0, 0, 1, "s0");
  o.speed = speed;
  auto calls = std::make_shared<int>(0);
  o.timer = [calls](const std::function<void()>& work) {
    work(); // the real forward runs; its device time is fixed
    ++*calls;
    return 0.5;
  };
  auto peer = actors::stage::spawn_stage(w.system(), o, board);
  n.adopt("s0", peer);
  w.run();
  auto log = std::make_shared<timeline>();
  send_forwards(w, n, peer, 2, log);
  w.run_for(5s);
  CHECK(*calls == 2);
  std::vector<double> out;
  for (auto& [label, t] : *log) {
    CHECK(label.find("failed") == std::string::npos);
    out.push_back(t);
  }
  return out;
}

} // namespace

TEST_CASE("the LibTorch backend's emulated speed is queue time on CAF's clock: deterministic "
          "under the testing scheduler") {
  // Full speed: the real compute costs no virtual time.
  auto full = torch_reply_times(1.0);
  REQUIRE(full.size() == 2);
  CHECK(full[0] == 0.0);
  CHECK(full[1] == 0.0);
  // Half speed: each 0.5 s call occupies the device for 1 s, of which 0.5 s is emulated: the
  // replies leave at 0.5 s and, behind the first, at 1 s; the same times on every run.
  auto half = torch_reply_times(0.5);
  REQUIRE(half.size() == 2);
  CHECK(half[0] == doctest::Approx(0.5));
  CHECK(half[1] == doctest::Approx(1.0));
  CHECK(torch_reply_times(0.5) == half);
}

TEST_CASE("a cost model's state transfer is charged its configured bytes on the link, whole or "
          "in parts, without holding them") {
  runtime::sim::world_options wo;
  wo.seed = 4;
  wo.network.defaults.latency = 5ms;
  wo.network.defaults.bandwidth = 10e6; // 10 MB/s
  runtime::sim::world w{wo};
  auto& donor_node = w.add_node("donor");
  auto& asker = w.add_node("asker");
  auto board = actors::stage::spawn_board(w.system(), 1);
  donor_node.adopt("board", board);
  auto o = cost_peer("s0");
  o.cost_model.state_bytes = 50'000'000; // 5 s over this link
  auto peer = actors::stage::spawn_stage(w.system(), o, board);
  donor_node.adopt("s0", peer);
  w.run();
  auto remote = w.proxy(asker.index(), peer);
  auto t0 = now_s(w);
  auto whole = ask<stage_state>(w, asker, remote, get_atom::value, state_atom::value);
  REQUIRE(whole);
  CHECK(whole->modeled.size == 50'000'000);
  auto took = now_s(w) - t0;
  MESSAGE("a 50 MB modeled state over 10 MB/s took " << took << " virtual s");
  CHECK(took > 5.0);
  CHECK(took < 5.1); // 5 s of bytes, two latencies and a small request
  // Half the state in one part: half the time.
  t0 = now_s(w);
  auto part = ask<messages::stage_state_part>(w, asker, remote, get_atom::value,
                                              state_atom::value, uint64_t{1}, uint64_t{2});
  REQUIRE(part);
  CHECK(part->modeled.size == 25'000'000);
  CHECK(now_s(w) - t0 > 2.5);
  CHECK(now_s(w) - t0 < 2.6);
  // The trace shows the reply's weight on the wire.
  uint64_t biggest = 0;
  for (auto& e : w.trace())
    if (e.kind == "send" && e.from == "donor")
      biggest = std::max(biggest, e.bytes);
  CHECK(biggest > 50'000'000);
  CHECK(biggest < 50'001'000);
}

TEST_CASE("a simulated swarm of cost-model peers: a restarted peer downloads its stage's state "
          "over the network before it serves again") {
  runtime::sim::world_options wo;
  wo.seed = 21;
  wo.network.defaults.latency = 5ms;
  wo.network.defaults.bandwidth = 100e6;
  runtime::sim::world w{wo};
  // Every node runs a DHT node and a DHT-backed board; node 0 is the bootstrap and the trainer's.
  testing::add_dht_board_nodes(w, 3, 2100, "swarm/cost", 1);
  auto& sys = w.system();
  // One stage of two cost-model peers (n1, n2) whose state weighs 200 MB (2 s over a link);
  // n2's peers after a restart are a new generation that must download the state first.
  auto generation = std::make_shared<int>(0);
  auto spawn_peer = [&sys, generation](runtime::sim::sim_node& x, const std::string& base) {
    auto name = base + "g" + std::to_string(*generation);
    auto o = cost_peer(name);
    o.end = 2; // the whole 2-block model: the first and the last stage
    o.local_batch = 8;
    o.cost_model.state_bytes = 200'000'000;
    o.timeout = caf::timespan{std::chrono::seconds(10)}; // a state request outlasts its 2 s transfer
    o.download_state = *generation > 0;
    x.adopt(name, actors::stage::spawn_stage(sys, o, x.lookup("board")));
  };
  w.node(1).on_start([=](runtime::sim::sim_node& x) { spawn_peer(x, "s0a"); });
  w.node(2).on_start([=](runtime::sim::sim_node& x) {
    spawn_peer(x, "s0b");
    ++*generation;
  });
  w.run_for(3s);
  auto t = std::make_shared<tally>();
  auto& n0 = w.node(0);
  auto sink = n0.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(1, 200, 4, caf::timespan{10s});
  n0.adopt("trainer",
           actors::trainer::spawn_trainer(sys, to, small_corpus(), n0.lookup("board"), sink));
  REQUIRE(w.run_until([&] { return t->microbatches >= 20; }, 600s));
  w.kill_node("n2", std::chrono::nanoseconds{-1});
  auto killed_at = t->microbatches;
  REQUIRE(w.run_until([&] { return t->microbatches >= killed_at + 20; }, 600s));
  auto restarted_at = now_s(w);
  w.restart_node("n2");
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 1200s));
  CHECK(t->microbatches == 200);
  CHECK(t->samples == 200 * 4);
  auto survivor = ask<std::vector<uint64_t>>(w, w.node(1), w.node(1).lookup("s0ag0"),
                                             status_atom::value);
  auto reborn_peer = w.node(2).lookup("s0bg1");
  REQUIRE(reborn_peer);
  auto reborn = ask<std::vector<uint64_t>>(w, w.node(2), reborn_peer, status_atom::value);
  REQUIRE(survivor);
  REQUIRE(reborn);
  MESSAGE("survivor: steps " << (*survivor)[0] << " samples " << (*survivor)[1]
                             << "; reborn: steps " << (*reborn)[0] << " samples " << (*reborn)[1]
                             << " downloads " << (*reborn)[8]);
  CHECK((*reborn)[8] == 1);  // one state download ...
  CHECK((*reborn)[9] == 1);  // ... from the one live donor
  CHECK((*reborn)[0] > 0);   // it continued from the stage's steps, not from 0
  CHECK((*reborn)[1] > 0);   // and served afterwards
  // The donor's 200 MB state crossed the link n1 -> n2 after the restart.
  bool charged = false;
  for (auto& e : w.trace())
    if (e.kind == "send" && e.from == "n1" && e.to == "n2" && e.bytes >= 200'000'000
        && static_cast<double>(e.t_ns) / 1e9 >= restarted_at)
      charged = true;
  CHECK(charged);
}

TEST_CASE("modeled state bytes travel as that many bytes and decode back to their count, and a "
          "short buffer is an error") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  stage_state s;
  s.steps = 7;
  std::vector<char> empty;
  caf::binary_serializer empty_sink{sys, empty};
  REQUIRE(!empty_sink(s));
  s.modeled.size = 3'000'000;
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE(!sink(s));
  // Exactly the modeled bytes on top of the message's envelope (messages/swarm.hpp).
  CHECK(buf.size() == empty.size() + 3'000'000);
  stage_state back;
  caf::binary_deserializer source{sys, buf};
  REQUIRE(!source(back));
  CHECK(back.steps == 7);
  CHECK(back.modeled.size == 3'000'000);
  // A sender claiming more bytes than it sent: the decode fails instead of reading past the end.
  buf.resize(buf.size() - 1000);
  stage_state cut;
  caf::binary_deserializer short_source{sys, buf};
  CHECK(static_cast<bool>(short_source(cut)));
}

TEST_CASE("gossip views only the partner it draws: one handle per exchange, never the peer itself") {
  runtime::sim::world_options wo;
  wo.seed = 5;
  runtime::sim::world w{wo};
  for (int i = 0; i < 4; ++i)
    w.add_node("n" + std::to_string(i));
  auto& sys = w.system();
  auto board = actors::stage::spawn_board(sys, 1);
  // Per peer (nodes 1-3): the handles its gossip asked to view.
  auto viewed = std::make_shared<std::vector<std::vector<caf::actor_addr>>>(4);
  std::vector<caf::actor> peers(4);
  for (int i = 1; i <= 3; ++i) {
    auto o = stage_opts(0, 0, 2, "s0" + std::string(1, static_cast<char>('a' + i)));
    o.local_batch = 4; // a step, and so a gossip exchange, after every microbatch
    o.gossip_board = board;
    o.view = [&w, i, viewed](const caf::actor& a) {
      (*viewed)[static_cast<size_t>(i)].push_back(a.address());
      return w.proxy(i, a);
    };
    peers[static_cast<size_t>(i)] = actors::stage::spawn_stage(sys, o, board);
    w.node(i).adopt(o.name, peers[static_cast<size_t>(i)]);
  }
  auto t = std::make_shared<tally>();
  auto& n0 = w.node(0);
  auto sink = n0.spawn("sink", counting_sink, t);
  n0.adopt("trainer", actors::trainer::spawn_trainer(sys, testing::tiny_trainer(1, 30, 2, 10s),
                                                     small_corpus(), board, sink));
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  w.run_for(5s); // the last exchanges' replies
  uint64_t steps = 0;
  size_t views = 0;
  for (int i = 1; i <= 3; ++i) {
    auto st = ask<std::vector<uint64_t>>(w, w.node(i), peers[static_cast<size_t>(i)],
                                         status_atom::value);
    REQUIRE(st);
    steps += (*st)[0];
    for (auto& a : (*viewed)[static_cast<size_t>(i)]) {
      CHECK(a != peers[static_cast<size_t>(i)].address());
      CHECK(std::find_if(peers.begin(), peers.end(),
                         [&](const caf::actor& p) { return p && p.address() == a; })
            != peers.end());
    }
    views += (*viewed)[static_cast<size_t>(i)].size();
  }
  MESSAGE("steps " << steps << ", handles viewed " << views << ", proxies " << w.proxies_made());
  CHECK(steps >= 30 / 3); // every microbatch is a step at the peer that took it ...
  CHECK(views == steps);  // ... each step one exchange, each exchange one view of 3 listed
  // Proxies only for partners drawn: at most one per (peer, other peer) pair.
  CHECK(w.proxies_made() <= 3 * 2);
}

} // namespace starling::test::actors_stage_backend_test
