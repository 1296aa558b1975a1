// Rebalancing through the DHT-backed board (cluster mode): throughput reports, joiners,
// placement of new peers and migration claims kept in DHT records (actors/stage/dht_board.hpp),
// and the pure totals behind them (actors/stage/load_view.hpp).
#include <doctest/doctest.h>

#include <optional>

#include <caf/all.hpp>

#include "actors/dht/client.hpp"
#include "actors/dht/dht.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/load_view.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "messages/rebalance_atoms.hpp"
#include "runtime/sim/world.hpp"
#include "support/swarm_fixtures.hpp"

namespace starling::test::actors_dht_board_rebalance_test {

using namespace starling;
using namespace std::chrono_literals;
using actors::stage::stage_load;

namespace {

/// Three simulated nodes, each with a DHT node and a DHT-backed board of 3 stages.
struct three_boards {
  runtime::sim::world w{[] {
    runtime::sim::world_options wo;
    wo.seed = 11;
    wo.network.defaults.latency = 5ms;
    return wo;
  }()};

  three_boards() {
    testing::add_dht_board_nodes(w, 3, 1300, "swarm/rebalance", 3);
  }

  /// A stand-in stage peer named `name` on node `i`, announced in `stage`.
  caf::actor announce(int i, uint64_t stage, const std::string& name) {
    auto& x = w.node(i);
    auto peer = x.spawn(name, [] { return caf::behavior{[](int) {}}; });
    caf::anon_send(x.lookup("board"), put_atom::value, stage, name, peer);
    return peer;
  }

  void report(int i, uint64_t stage, const std::string& name, double throughput) {
    caf::anon_send(w.node(i).lookup("board"), load_atom::value, stage, name, throughput, 0.0);
  }
};

/// `(get_atom, load_atom, peer)` asked of node `i`'s board.
std::optional<testing::loads_reply> ask_loads(three_boards& t, int i, caf::actor peer) {
  return testing::ask_loads(t.w, t.w.node(i), t.w.node(i).lookup("board"), peer);
}

/// Migration claims out of `from` sent at the same instant by the boards of `nodes`.
std::vector<bool> claim_at_once(three_boards& t, std::vector<int> nodes, uint64_t from,
                                caf::timespan period) {
  auto answers = std::make_shared<std::vector<std::optional<bool>>>(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) {
    auto board = t.w.node(nodes[k]).lookup("board");
    t.w.node(nodes[k]).spawn("", [=](caf::event_based_actor* self) {
      self->request(board, caf::timespan{10s}, migrate_atom::value, from, period)
          .then([=](bool granted) { (*answers)[k] = granted; },
                [=](caf::error&) { (*answers)[k] = false; });
      return caf::behavior{[](int) {}};
    });
  }
  t.w.run_until(
      [&] {
        for (auto& a : *answers)
          if (!a)
            return false;
        return true;
      },
      20s);
  std::vector<bool> out;
  for (auto& a : *answers) {
    REQUIRE(a);
    out.push_back(*a);
  }
  return out;
}

} // namespace

TEST_CASE("stage totals count unreported peers at the average, joiners, and unknown stages") {
  using actors::stage::total_of;
  auto t = total_of(stage_load{3, {2.0, 4.0}, {}});
  CHECK(t.throughput == doctest::Approx(9.0)); // average 3 times 3 live peers
  CHECK(t.peers == 3);
  t = total_of(stage_load{2, {}, {5.0}});
  CHECK(t.throughput == -1); // live peers, none reported: unknown
  t = total_of(stage_load{1, {2.0}, {0.0, 7.0}});
  CHECK(t.throughput == doctest::Approx(2.0 + 2.0 + 7.0)); // a joiner at 0 counts the average
  CHECK(t.peers == 3);
  t = total_of(stage_load{0, {}, {0.0}});
  CHECK(t.throughput == 0); // nothing to compare the joiner with: not counted
  CHECK(t.peers == 0);
  using actors::stage::stage_for_newcomer;
  CHECK(stage_for_newcomer({}) == std::nullopt);
  CHECK(stage_for_newcomer({stage_load{2, {}, {}}}) == std::nullopt);
  CHECK(stage_for_newcomer({stage_load{2, {3.0, 3.0}, {}}, stage_load{1, {}, {}},
                            stage_load{1, {1.0}, {2.0}}}) == std::optional<size_t>{2});
  CHECK(stage_for_newcomer({stage_load{1, {1.0}, {}}, stage_load{0, {}, {}}}) ==
        std::optional<size_t>{1}); // an empty stage needs a peer most
  // A volunteer's first placement (all_known): only once every stage is known and some peer
  // reported; a pipeline that has not run yet (nothing announced or reported) tells nothing.
  CHECK(stage_for_newcomer({stage_load{0, {}, {}}, stage_load{0, {}, {}}}) ==
        std::optional<size_t>{0});
  CHECK(stage_for_newcomer({stage_load{0, {}, {}}, stage_load{0, {}, {}}}, true) == std::nullopt);
  CHECK(stage_for_newcomer({stage_load{2, {3.0, 3.0}, {}}, stage_load{1, {}, {}}}) ==
        std::optional<size_t>{0});
  CHECK(stage_for_newcomer({stage_load{2, {3.0, 3.0}, {}}, stage_load{1, {}, {}}}, true) ==
        std::nullopt);
  CHECK(stage_for_newcomer({stage_load{2, {3.0, 3.0}, {}}, stage_load{1, {1.0}, {}}}, true) ==
        std::optional<size_t>{1});
  CHECK(stage_for_newcomer({stage_load{1, {1.0}, {}}, stage_load{0, {}, {}}}, true) ==
        std::optional<size_t>{1});
}

TEST_CASE("throughput reports in the DHT are parsed strictly") {
  using actors::stage::decode_load_report;
  using actors::stage::encode_load_report;
  CHECK(decode_load_report(encode_load_report(2.5, 3)) == std::optional<double>{2.5});
  std::vector<std::string> bads{"",      "2.5",   "2.5 ",  "x 1",  "2.5 1 3",
                                "-1 0",  "0 0",   "nan 0", "inf 0", "2 -1",
                                "2 nan", std::string(100, '1')};
  for (auto& bad : bads)
    CHECK_MESSAGE(!decode_load_report(bad), bad);
}

TEST_CASE("DHT boards share throughput reports and joiners, place new peers at the weakest "
          "stage and ignore malformed records") {
  three_boards t;
  auto a = t.announce(1, 0, "a");
  t.announce(2, 0, "c");
  t.announce(1, 1, "b");
  t.announce(2, 2, "d"); // never reports: stage 2 stays unknown
  t.w.run_for(2s);
  t.report(1, 0, "a", 2.0);
  t.report(2, 0, "c", 4.0);
  t.report(1, 1, "b", 1.0);
  t.report(1, 1, "nobody", 50.0); // not a live peer of stage 1: ignored
  t.w.run_for(2s);
  // A malformed value under a live peer's sub-key (another program, or a bad peer).
  auto put = actors::dht::make_subkey_put("swarm/rebalance/stage2/load", "n2:1/d",
                                          std::vector<char>{'f', 'a', 's', 't'},
                                          std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              t.w.system().clock().now().time_since_epoch() + 60s)
                                              .count());
  caf::anon_send(t.w.node(0).lookup("dht"), put);
  t.w.run_for(2s);
  auto l = ask_loads(t, 1, a);
  REQUIRE(l);
  CHECK(l->throughput == std::vector<double>{6.0, 1.0, -1.0});
  CHECK(l->peers == std::vector<int64_t>{2, 1, 1});
  CHECK(l->mine == 2.0); // a is local to node 1's board
  auto other = ask_loads(t, 0, a);
  REQUIRE(other);
  CHECK(other->throughput == l->throughput); // every node reads the same records
  CHECK(other->mine == -1);                  // but only a's own node knows it is a
  // Two new peers placed one after the other: both at stage 1 (1 < 6, then 2 < 6).
  auto place = [&](int i) {
    return testing::ask<uint64_t>(t.w, t.w.node(i), t.w.node(i).lookup("board"), put_atom::value,
                                  load_atom::value, caf::timespan{60s});
  };
  CHECK(place(0) == std::optional<uint64_t>{1});
  CHECK(place(2) == std::optional<uint64_t>{1});
  t.w.run_for(1s); // the joiners' records are stored after the answer
  l = ask_loads(t, 1, a);
  REQUIRE(l);
  CHECK(l->throughput[1] == doctest::Approx(3.0)); // b and two joiners at b's throughput
  CHECK(l->peers[1] == 3);
  // Node 0's joiner announces itself: counted once (as a live peer at the average).
  t.announce(0, 1, "e");
  t.w.run_for(2s);
  l = ask_loads(t, 1, a);
  REQUIRE(l);
  CHECK(l->peers[1] == 3); // b, e and node 2's joiner
  CHECK(l->throughput[1] == doctest::Approx(3.0));
  // Joiners expire after their hold.
  t.w.run_for(61s);
  t.report(1, 0, "a", 2.0);
  t.report(2, 0, "c", 4.0);
  t.report(1, 1, "b", 1.0);
  t.w.run_for(2s);
  l = ask_loads(t, 1, a);
  REQUIRE(l);
  CHECK(l->peers[1] == 2);
}

TEST_CASE("DHT boards grant one migration out of a stage per period, also to claims made at "
          "the same instant") {
  three_boards t;
  t.w.run_for(2s);
  auto period = caf::timespan{30s};
  auto first = claim_at_once(t, {1}, 0, period);
  CHECK(first == std::vector<bool>{true});
  // Later claims in the same period see the first one and lose; other stages are independent.
  CHECK(claim_at_once(t, {2}, 0, period) == std::vector<bool>{false});
  CHECK(claim_at_once(t, {0}, 1, period) == std::vector<bool>{true});
  t.w.run_for(31s);
  // A new period: three claims at the same instant, exactly one granted.
  auto three = claim_at_once(t, {0, 1, 2}, 0, period);
  CHECK(std::count(three.begin(), three.end(), true) == 1);
  // Bad claims are refused.
  CHECK(claim_at_once(t, {0}, 7, period) == std::vector<bool>{false});
  CHECK(claim_at_once(t, {0}, 2, caf::timespan{0}) == std::vector<bool>{false});
}

} // namespace starling::test::actors_dht_board_rebalance_test
