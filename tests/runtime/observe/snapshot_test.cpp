// The snapshot builder (runtime/observe/snapshot.hpp): what a local run's metric stream turns
// into, counters that never decrease while peers come and go, bounded label sets, liveness from
// faults and restarts, a bounded loss curve.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>

#include "runtime/observe/exposition.hpp"
#include "runtime/observe/snapshot.hpp"

namespace starling::test::runtime_observe_snapshot_test {

using namespace starling::runtime::observe;

run_description two_roles() {
  run_description r;
  r.experiment = "watch-me";
  r.kind = "dedloc";
  r.mode = "local";
  r.nodes = 2;
  r.seed = 7;
  r.members = {{"peers.0", "peers", 0, 0, -1},
               {"peers.1", "peers", 1, 0, -1},
               {"board.0", "board", 0, 0, -1}};
  return r;
}

struct ev {
  double t;
  std::string source;
  std::string kind;
  std::map<std::string, double> values;
  std::map<std::string, std::string> labels;
};

void feed(snapshot_builder& b, const ev& e) {
  b.add({e.t, 0, e.source, e.kind, e.values, e.labels});
}

TEST_CASE("a dedloc stream becomes samples, rounds by outcome, loss, step and live peers") {
  snapshot_builder b{two_roles()};
  feed(b, {0.5, "peers.0", "dp_join", {}, {{"mode", "full"}}});
  feed(b, {1.0,
           "peers.0",
           "dp_step",
           {{"step", 0}, {"samples", 32}, {"averaged", 1}, {"loss", 2.5}},
           {}});
  feed(b, {1.5,
           "peers.1",
           "dp_step",
           {{"step", 1}, {"samples", 16}, {"averaged", 0}, {"loss", 2.0}},
           {}});
  feed(b, {2.0, "peers.1", "dp_dropped", {{"samples", 8}}, {}});
  auto s = b.make();
  CHECK(s.version == 1);
  CHECK(s.samples_total == 48);
  CHECK(s.rounds_by_outcome.at("averaged") == 1);
  CHECK(s.rounds_by_outcome.at("alone") == 1);
  CHECK(s.loss == 2.0);
  CHECK(s.global_step == 1);
  CHECK(s.dropped_samples_total == 8);
  CHECK(s.joins_total == 1);
  CHECK(s.live_by_role.at("peers") == 2);
  CHECK(s.live_by_role.at("board") == 1);
  CHECK(s.peer_samples_total.at("peers.0") == 32);
  CHECK(s.events_by_kind.at("dp_step") == 2);
  CHECK(s.loss_curve.size() == 2);
  CHECK(b.make().version == 2);
}

TEST_CASE("faults and restarts move instances between live and down") {
  snapshot_builder b{two_roles()};
  feed(b, {1, "node0/faults", "fault", {}, {{"action", "kill_instance"}, {"instance", "peers.0"}}});
  auto s = b.make();
  CHECK(s.live_by_role.at("peers") == 1);
  CHECK(s.faults_by_action.at("kill_instance") == 1);
  feed(b, {2, "peers.0", "restart", {{"generation", 1}}, {{"node", "node0"}}});
  s = b.make();
  CHECK(s.live_by_role.at("peers") == 2);
  CHECK(s.restarts_total == 1);
  feed(b, {3, "node1/faults", "fault", {}, {{"action", "kill_node"}, {"node", "node1"}}});
  CHECK(b.make().live_by_role.at("peers") == 1);
  feed(b, {4, "node1/faults", "restart_node", {}, {{"action", "kill_node"}, {"node", "node1"}}});
  s = b.make();
  CHECK(s.live_by_role.at("peers") == 2);
  CHECK(s.restarts_total == 2);
  feed(b, {5, "peers.1", "dp_leave", {}, {}});
  CHECK(b.make().live_by_role.at("peers") == 1);
  b.finish();
  s = b.make();
  CHECK(s.finished);
  CHECK(s.live_by_role.at("peers") == 0);
}

TEST_CASE("a SWARM stream: stage steps are rounds, internal peer names are not instances") {
  snapshot_builder b{two_roles()};
  feed(b, {1, "s1p2g0", "step", {{"step", 3}, {"averaged", 1}}, {}});
  feed(b, {2, "s1p3g0", "step", {{"step", 4}, {"averaged", 0}}, {}});
  feed(b, {3, "peers.7", "restart", {}, {}}); // a planned role's instance the plan did not list
  feed(b, {4, "volunteer", "microbatch", {{"samples", 2}}, {}});
  auto s = b.make();
  CHECK(s.rounds_by_outcome.at("averaged") == 1);
  CHECK(s.rounds_by_outcome.at("alone") == 1);
  CHECK(s.global_step == 4);
  CHECK(s.members.size() == 4);
  CHECK(s.members.back().name == "peers.7");
  CHECK(s.live_by_role.size() == 2);
  CHECK(s.live_by_role.at("peers") == 3);
  CHECK(s.peer_samples_total.at("volunteer") == 2);
}

TEST_CASE("a stage peer's actor name is its planned instance, shown with its stage") {
  run_description r;
  r.kind = "swarm";
  r.members = {{"trainer.0", "trainer", 0, 0, -1, "swarm.trainer"},
               {"peers.0", "peers", 1, 0, -1, "swarm.stage"},
               {"peers.2", "peers", 2, 0, -1, "swarm.stage"}};
  snapshot_builder b{r};
  feed(b, {1, "s1p2g3", "step", {{"step", 0}, {"averaged", 1}}, {}});
  feed(b, {2, "s0p0g0", "checkpoint", {}, {}});
  // Not a stage peer's name, or no such slot: counted, nobody's.
  for (auto* name : {"s1p9g0", "s1p2", "s1p2g0x", "sp2g0", "s1p0000000000002g0"})
    feed(b, {3, name, "step", {{"step", 1}, {"averaged", 1}}, {}});
  auto s = b.make();
  CHECK(s.members.size() == 3);
  CHECK(s.members[2].last_seen_s == 1);
  CHECK(s.members[2].detail == "stage 1");
  CHECK(s.members[1].last_seen_s == 2);
  CHECK(s.members[1].detail == "stage 0");
  CHECK(s.members[0].last_seen_s < 0);
  CHECK(s.members[0].detail.empty());
  CHECK(s.rounds_by_outcome.at("averaged") == 6);
}

TEST_CASE("a data-parallel peer's mode is shown") {
  snapshot_builder b{two_roles()};
  feed(b, {1, "peers.1", "dp_join", {}, {{"mode", "client"}}});
  feed(b, {1, "peers.0", "dp_join", {}, {{"mode", "bogus"}}});
  auto s = b.make();
  CHECK(s.members[1].detail == "client mode");
  CHECK(s.members[0].detail.empty());
  CHECK(s.live_by_mode.at("client") == 1);
  CHECK(s.live_by_mode.at("full") == 0);
  feed(b, {2, "peers.0", "dp_join", {}, {{"mode", "full"}}});
  feed(b, {3, "peers.1", "dp_leave", {}, {}});
  auto t = b.make();
  CHECK(t.live_by_mode.at("full") == 1);
  CHECK(t.live_by_mode.at("client") == 0);
  auto text = render_metrics(t);
  CHECK(text.find("starling_live_peers_by_mode{mode=\"full\"} 1\n") != std::string::npos);
}

TEST_CASE("bytes per peer and bans come from the ledger, bounded, and never decrease") {
  snapshot_builder b{two_roles()};
  // 25 peers' steps with cumulative byte counters: 20 get their own series, 5 are "other".
  for (int i = 0; i < 25; ++i)
    feed(b, {1.0 + i, "p" + std::to_string(i), "dp_step",
             {{"step", 0}, {"samples", 8}, {"averaged", 1}, {"bytes_sent", 100.0 + i},
              {"bytes_received", 10}},
             {}});
  feed(b, {30, "p3", "ban", {}, {{"peer", "p3"}, {"reason", "wrong gradient"}}});
  auto s = b.make();
  CHECK(s.peer_bytes_sent_total.size() == 21);
  CHECK(s.peer_bytes_sent_total.at("p0") == 100);
  double other = 0;
  for (int i = 0; i < 25; ++i)
    if (!s.peer_bytes_sent_total.count("p" + std::to_string(i)))
      other += 100.0 + i;
  CHECK(s.peer_bytes_sent_total.at("other") == other);
  CHECK(s.peer_bytes_received_total.at("other") == 50);
  CHECK(s.bans_total == 1);
  // Later counters only grow; a peer already named keeps its series.
  feed(b, {40, "p0", "dp_step",
           {{"step", 1}, {"samples", 8}, {"averaged", 1}, {"bytes_sent", 400}, {"bytes_received", 20}},
           {}});
  auto t = b.make();
  CHECK(t.peer_bytes_sent_total.at("p0") == 400);
  CHECK(t.peer_bytes_sent_total.at("other") == other);
  CHECK(t.bans_total == 1);
  auto text = render_metrics(t);
  CHECK(text.find("# TYPE starling_peer_sent_bytes_total counter\n") != std::string::npos);
  CHECK(text.find("starling_peer_sent_bytes_total{peer=\"p0\"} 400\n") != std::string::npos);
  CHECK(text.find("starling_bans_total 1\n") != std::string::npos);
  CHECK(text.find("starling_samples_accepted_total 0\n") != std::string::npos); // no credits
  feed(b, {41, "p1", "dp_credit", {{"p0", 24}, {"p2", 8}}, {}});
  CHECK(b.make().samples_accepted_total == 32);
  REQUIRE(parse_exposition(text).ok());
}

TEST_CASE("per-peer series stay at 20 plus other, and other never decreases") {
  snapshot_builder b{two_roles()};
  std::mt19937_64 rng{3};
  std::vector<metric_family> before;
  for (int round = 0; round < 40; ++round) {
    // Peers come and go: 200 names over the run, a few dozen events per snapshot.
    for (int k = 0; k < 30; ++k) {
      auto peer = "trainer." + std::to_string(rng() % 200);
      std::uniform_real_distribution<double> loss{1, 3};
      feed(b, {round + k / 30.0,
               peer,
               "microbatch",
               {{"samples", double(1 + rng() % 64)},
                {"loss", loss(rng)},
                {"retries", double(rng() % 2)}},
               {}});
      if (rng() % 10 == 0)
        feed(b, {round + k / 30.0,
                 "node0/faults",
                 "fault",
                 {},
                 {{"action", "kill_instance"}, {"instance", peer}}});
      if (rng() % 10 == 0)
        feed(b, {round + k / 30.0, peer, "restart", {}, {}});
      if (rng() % 7 == 0)
        feed(b, {round + k / 30.0,
                 "node0/wire",
                 "refused",
                 {},
                 {{"reason", "reason " + std::to_string(rng() % 50)}}});
    }
    auto s = b.make();
    CHECK(s.peer_samples_total.size() <= 21);
    CHECK(s.refusals_by_reason.size() <= 16);
    double sum = 0;
    for (auto& [p, v] : s.peer_samples_total)
      sum += v;
    CHECK(sum == doctest::Approx(s.samples_total));
    auto parsed = parse_exposition(render_metrics(s));
    REQUIRE_MESSAGE(parsed.ok(), (parsed.ok() ? "" : parsed.error().what));
    if (!before.empty()) {
      auto grew = check_counters_grow(before, *parsed);
      CHECK_MESSAGE(grew.ok(), grew.what());
    }
    before = *parsed;
  }
  CHECK(b.make().peer_samples_total.count("other") == 1);
}

TEST_CASE("the loss curve stays bounded and spans the whole run") {
  builder_options o;
  o.max_curve_points = 64;
  snapshot_builder b{two_roles(), o};
  for (int i = 0; i < 10000; ++i)
    feed(b,
         {i * 0.01, "trainer.0", "microbatch", {{"samples", 1}, {"loss", 5.0 - i * 0.0001}}, {}});
  auto s = b.make();
  CHECK(s.loss_curve.size() <= 64);
  CHECK(s.loss_curve.size() >= 32);
  CHECK(s.loss_curve.front().first == 0);
  CHECK(s.loss_curve.back().first > 90);
  CHECK(s.samples_per_second == doctest::Approx(100).epsilon(0.02));
}

TEST_CASE("hostile event fields are counted, not trusted") {
  snapshot_builder b{two_roles()};
  feed(b, {NAN, "", "", {{"samples", NAN}, {"loss", INFINITY}}, {}});
  feed(b,
       {-5, "x\"y\\z\n", "microbatch", {{"samples", -3}, {"retries", -1e300}, {"loss", NAN}}, {}});
  feed(b, {1, "node1/wire", "refused", {}, {{"reason", "\xff\xfe bad \xc3\x28 \"utf-8\"\n"}}});
  for (int i = 0; i < 100; ++i)
    feed(b, {1, "kind-spammer", "kind" + std::to_string(i), {}, {}});
  auto s = b.make();
  CHECK(s.events_total == 103);
  CHECK(s.events_by_kind.size() <= 32);
  CHECK(s.samples_total == 0);
  CHECK(std::isnan(s.loss));
  auto parsed = parse_exposition(render_metrics(s));
  CHECK_MESSAGE(parsed.ok(), (parsed.ok() ? "" : parsed.error().what));
}

TEST_CASE("a published snapshot is what readers get, whole") {
  snapshot_store store;
  CHECK(store.current()->version == 0);
  snapshot_builder b{two_roles()};
  auto held = store.current();
  store.publish(b.make());
  CHECK(held->version == 0);
  CHECK(store.current()->version == 1);
  CHECK(store.current()->run.experiment == "watch-me");
}

} // namespace starling::test::runtime_observe_snapshot_test
