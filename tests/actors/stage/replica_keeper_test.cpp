// Checkpoint replicas on other nodes (actors/stage/replica_keeper.hpp): which keepers keep a
// stage (pure), and a stage whose peer and its disk are lost resuming from a replica kept on
// another node (simulated time, DHT boards, LibTorch backend, the tiny test model).
#include <doctest/doctest.h>

#include <filesystem>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/stage/checkpoint.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/replica_keeper.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/trainer.hpp"
#include "messages/atoms.hpp"
#include "runtime/sim/world.hpp"
#include "support/node_fixtures.hpp"
#include "support/swarm_fixtures.hpp"

namespace starling::test::actors_replica_keeper_test {

using namespace starling;
using namespace std::chrono_literals;
using actors::stage::replica_keepers_of;

TEST_CASE("the keepers of a stage's replicas: nodes serving none of its peers, the same choice "
          "from every node") {
  std::vector<std::string> keepers{"h:1/replica-keeper", "h:2/replica-keeper",
                                   "h:3/replica-keeper", "h:4/replica-keeper"};
  // Stage 0 is served on nodes 1 and 3: only 2 and 4 may keep it.
  std::vector<std::string> peers{"h:1/s0p0g0", "h:3/s0p2g1"};
  auto two = replica_keepers_of(0, keepers, peers, 2);
  CHECK(two.size() == 2);
  for (auto& k : two)
    CHECK((k == "h:2/replica-keeper" || k == "h:4/replica-keeper"));
  // The same answer whatever the order the board listed them in, and a prefix for fewer copies.
  std::vector<std::string> shuffled{keepers[3], keepers[1], keepers[0], keepers[2], keepers[1]};
  CHECK(replica_keepers_of(0, shuffled, peers, 2) == two);
  auto one = replica_keepers_of(0, keepers, peers, 1);
  REQUIRE(one.size() == 1);
  CHECK(one[0] == two[0]);
  // Every node serves the stage: nobody keeps it; more copies than nodes: every eligible one.
  CHECK(replica_keepers_of(0, {"h:1/replica-keeper"}, peers, 2).empty());
  CHECK(replica_keepers_of(1, keepers, {}, 9).size() == 4);
  // Stages spread over the keepers: not every stage goes to the same first keeper.
  std::set<std::string> firsts;
  for (uint64_t s = 0; s < 16; ++s)
    firsts.insert(replica_keepers_of(s, keepers, {}, 1).at(0));
  CHECK(firsts.size() > 1);
  CHECK(actors::stage::endpoint_of("127.0.0.1:4000/s1p3g0") == "127.0.0.1:4000");
}

namespace {

const std::string prefix = "swarm/replica-test";

/// The checkpoint key of stage 1 of the tiny model (block 1 and the head).
const actors::stage::checkpoint_key stage1_key{1, 1, 2};

/// A stage peer of the tiny model on node `i` whose calls take 80 ms of virtual time,
/// checkpointing into `dir` every 500 ms and downloading replicas through the node's replica
/// board.
caf::actor spawn_peer(runtime::sim::world& w, int i, uint64_t stage, const std::string& name,
                      const std::string& dir, bool rejoin) {
  auto& x = w.node(i);
  auto o = testing::stage_opts(stage, static_cast<int64_t>(stage), static_cast<int64_t>(stage) + 1,
                               name);
  o.timer = [](const std::function<void()>& work) {
    work();
    return 0.02;
  };
  o.speed = 0.25;
  o.codec = kernels::codec_id::none;
  o.download_state = rejoin;
  o.download_patience = caf::timespan{3s};
  o.checkpoint.dir = dir;
  o.checkpoint.every = caf::timespan{500ms};
  o.checkpoint.replicas = x.lookup("replicas");
  auto a = actors::stage::spawn_stage(w.system(), o, x.lookup("board"));
  x.adopt(name, a);
  return a;
}

} // namespace

TEST_CASE("a stage whose only peer and its disk are lost resumes from the replica another node "
          "kept, and every microbatch completes once") {
  testing::temp_dir tmp{"starling-replicas"};
  runtime::sim::world w{[] {
    runtime::sim::world_options wo;
    wo.seed = 17;
    wo.network.defaults.latency = 2ms;
    return wo;
  }()};
  testing::add_dht_board_nodes(w, 3, 2100, prefix, 2);
  // Every node: a replica board (slot k: holders of stage k's replicas, slot 2: the keepers) and
  // a keeper writing into its own folder.
  for (int i = 0; i < 3; ++i) {
    auto& x = w.node(i);
    actors::stage::dht_board_options b;
    b.prefix = prefix + "/replicas";
    b.endpoint = x.endpoint();
    b.stages = 3;
    b.announce_period = caf::timespan{1s};
    b.timeout = caf::timespan{2s};
    x.spawn("replicas", actors::stage::dht_board_actor, x.lookup("dht"), x.resolver(), b);
    actors::stage::replica_keeper_options ko;
    ko.board = x.lookup("board");
    ko.replica_board = x.lookup("replicas");
    ko.endpoint = x.endpoint();
    ko.ranges = {{0, 1}, {1, 2}};
    ko.dir = tmp.path + "/n" + std::to_string(i) + "/replicas";
    ko.copies = 2;
    ko.period = caf::timespan{1s};
    ko.timeout = caf::timespan{2s};
    ko.register_actor = [&x](const std::string& name, const caf::actor& a) { x.adopt(name, a); };
    w.system().spawn(actors::stage::replica_keeper_actor, ko);
  }
  w.run_for(1s);
  // Stage 0 on node 0 with the trainer, stage 1 on node 1: nodes 0 and 2 keep stage 1.
  auto s0 = spawn_peer(w, 0, 0, "s0", tmp.path + "/n0/checkpoints", false);
  auto s1 = spawn_peer(w, 1, 1, "s1", tmp.path + "/n1/checkpoints", false);
  w.run_for(2s);
  auto t = std::make_shared<testing::tally>();
  auto& n0 = w.node(0);
  auto sink = n0.spawn("sink", testing::counting_sink, t);
  auto to = testing::tiny_trainer(2, 80, 2, caf::timespan{2s});
  n0.adopt("trainer",
           actors::trainer::spawn_trainer(w.system(), to, testing::small_corpus(),
                                          n0.lookup("board"), sink));
  auto replica_dirs = std::vector<std::string>{tmp.path + "/n0/replicas",
                                               tmp.path + "/n2/replicas"};
  REQUIRE(w.run_until(
      [&] {
        auto r = actors::stage::newest_checkpoint(replica_dirs, stage1_key);
        return t->microbatches >= 30 && r.found && r.found->state.steps >= 2;
      },
      300s));
  // Only the nodes that serve no peer of stage 1 keep it.
  CHECK(actors::stage::list_checkpoints(tmp.path + "/n1/replicas", stage1_key).empty());
  // The node of stage 1 goes, disk and all; nothing passes stage 1 meanwhile.
  w.kill_actor("n1", "s1");
  std::filesystem::remove_all(tmp.path + "/n1/checkpoints");
  auto kept = actors::stage::newest_checkpoint(replica_dirs, stage1_key);
  REQUIRE(kept.found);
  w.run_for(2s);
  auto stalled = t->microbatches;
  CHECK(stalled < 80);
  // A new peer of stage 1 on the (fresh) node finds no donor and no checkpoint on its disk: it
  // downloads the newest replica (the two keepers may hold different steps).
  auto s1b = spawn_peer(w, 1, 1, "s1b", tmp.path + "/n1/checkpoints", true);
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 80);
  CHECK(t->repeats == 0);
  CHECK(t->batches["trainer"].size() == 80);
  auto got = std::make_shared<std::optional<std::pair<std::vector<uint64_t>, std::string>>>();
  n0.spawn("", [=](caf::event_based_actor* self) {
    self->request(s1b, caf::timespan{10s}, status_atom::value, actors::stage::checkpoint_atom::value)
      .then([=](std::vector<uint64_t> c, std::string d) { *got = std::make_pair(c, d); },
            [](caf::error&) {});
    return caf::behavior{[](int) {}};
  });
  w.run_for(1s);
  REQUIRE(got->has_value());
  auto& [counters, digest] = **got;
  REQUIRE(counters.size() == 7);
  CHECK(counters[2] == 1);                       // restored
  CHECK(counters[3] == kept.found->state.steps); // from the newest replica, not the seeded init
  CHECK(counters[3] >= 2);
  CHECK(digest == kept.found->digest);
  (void)s0;
  (void)s1;
}

} // namespace starling::test::actors_replica_keeper_test
