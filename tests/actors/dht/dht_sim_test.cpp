#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>

#include <caf/all.hpp>

#include "actors/dht/client.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/envelope.capnp.h"
#include "runtime/sim/world.hpp"

namespace starling::test::actors_dht_sim_test {

using namespace starling;
using namespace starling::actors::dht;
using namespace std::chrono_literals;
using messages::dht_get_result;
using messages::dht_put;
using messages::dht_put_result;
using messages::dht_stats;
namespace sim = starling::runtime::sim;

namespace {

/// The outcome of one client call, filled in by a short-lived client actor.
struct call {
  bool done = false;
  bool ok = false;
  dht_put_result put;
  dht_get_result get;
};
using call_ptr = std::shared_ptr<call>;

std::vector<char> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

std::string text(const std::vector<char>& v) {
  return {v.begin(), v.end()};
}

/// A simulated swarm: node i runs a DHT actor registered as `dht`, joined through node 0.
struct swarm {
  sim::world w;
  uint64_t seed;
  dht_options base;

  swarm(uint64_t s, dht_options b = {}) : w(make_world(s)), seed(s), base(std::move(b)) {}

  static sim::world_options make_world(uint64_t s) {
    sim::world_options o;
    o.seed = s;
    o.network.defaults.latency = 20ms;
    return o;
  }

  identity identity_of(size_t i) const { return identity::from_seed(seed * 100'000 + i); }

  /// Adds `n` nodes, each joining through node 0, letting each join settle.
  void grow(size_t n) {
    for (size_t k = 0; k < n; ++k) {
      auto i = w.num_nodes();
      auto& node = w.add_node("n" + std::to_string(i));
      auto opts = base;
      opts.address = node.endpoint() + "/dht";
      opts.id = identity_of(i);
      if (i > 0)
        opts.bootstrap = {"n0:1/dht"};
      node.on_start([opts](sim::sim_node& nd) { nd.spawn("dht", dht_actor, nd.resolver(), opts); });
      w.run_for(500ms);
    }
  }

  caf::actor dht(size_t i) { return w.node(static_cast<int>(i)).lookup("dht"); }

  call_ptr put(size_t i, dht_put p) {
    auto c = std::make_shared<call>();
    auto d = dht(i);
    w.node(static_cast<int>(i)).spawn("", [c, d, p](caf::event_based_actor* self) {
      dht_store(
          self, d, p, 30s,
          [c, self](const dht_put_result& r) {
            c->done = c->ok = true;
            c->put = r;
            self->quit();
          },
          [c, self](caf::error&) {
            c->done = true;
            self->quit();
          });
      return caf::behavior{[](int) {}};
    });
    return c;
  }

  call_ptr get(size_t i, const std::string& key) {
    auto c = std::make_shared<call>();
    auto d = dht(i);
    w.node(static_cast<int>(i)).spawn("", [c, d, key](caf::event_based_actor* self) {
      dht_get(
          self, d, key, 30s,
          [c, self](const dht_get_result& r) {
            c->done = c->ok = true;
            c->get = r;
            self->quit();
          },
          [c, self](caf::error&) {
            c->done = true;
            self->quit();
          });
      return caf::behavior{[](int) {}};
    });
    return c;
  }

  void settle(const std::vector<call_ptr>& calls) {
    w.run_until(
        [&] {
          return std::all_of(calls.begin(), calls.end(), [](const call_ptr& c) { return c->done; });
        },
        120s);
  }

  call_ptr run_put(size_t i, dht_put p) {
    auto c = put(i, std::move(p));
    settle({c});
    return c;
  }

  call_ptr run_get(size_t i, const std::string& key) {
    auto c = get(i, key);
    settle({c});
    return c;
  }

  /// Expiration `d` from the current virtual time.
  int64_t in(std::chrono::nanoseconds d) {
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   w.system().clock().now().time_since_epoch())
                   .count();
    return now + d.count();
  }

  dht_stats stats(size_t i) {
    auto c = std::make_shared<dht_stats>();
    auto d = dht(i);
    auto done = std::make_shared<bool>(false);
    w.node(static_cast<int>(i)).spawn("", [c, d, done](caf::event_based_actor* s) {
      s->request(d, 10s, status_atom::value).then([c, done, s](const dht_stats& st) {
        *c = st;
        *done = true;
        s->quit();
      });
      return caf::behavior{[](int) {}};
    });
    w.run_until([&] { return *done; }, 10s);
    return *c;
  }
};

std::string value_of(const call_ptr& c) {
  if (!c->ok || !c->get.found || c->get.records.empty())
    return "<missing>";
  return text(c->get.records[0].value);
}

} // namespace

TEST_CASE("100 nodes: every get after a store finds the value and stores reach the true nearest "
          "node") {
  swarm s{11};
  s.grow(100);
  std::mt19937_64 rng{11};
  const int keys = 60;
  std::vector<std::string> names;
  std::vector<call_ptr> puts;
  for (int i = 0; i < keys; ++i) {
    names.push_back("key-" + std::to_string(rng()));
    puts.push_back(
        s.put(rng() % 100, make_put(names.back(), bytes("v" + std::to_string(i)), s.in(600s))));
  }
  s.settle(puts);
  for (auto& p : puts) {
    REQUIRE(p->ok);
    CHECK(p->put.accepted == p->put.replicas);
    CHECK(p->put.replicas == 5);
  }
  std::vector<call_ptr> gets;
  for (int i = 0; i < keys; ++i)
    gets.push_back(s.get(rng() % 100, names[static_cast<size_t>(i)]));
  s.settle(gets);
  int found = 0;
  for (int i = 0; i < keys; ++i)
    found += value_of(gets[static_cast<size_t>(i)]) == "v" + std::to_string(i) ? 1 : 0;
  CHECK(found == keys);
  // The node whose id is truly nearest to each key must hold it (a local get takes 0 hops).
  std::vector<node_id> ids;
  for (size_t i = 0; i < 100; ++i)
    ids.push_back(id_of(s.identity_of(i)));
  std::vector<call_ptr> local;
  for (auto& k : names) {
    auto target = node_id::of_key(k);
    size_t best = 0;
    for (size_t i = 1; i < ids.size(); ++i)
      if (closer(target, ids[i], ids[best]))
        best = i;
    local.push_back(s.get(best, k));
  }
  s.settle(local);
  int nearest = 0;
  for (auto& c : local)
    nearest += (c->ok && c->get.found && c->get.hops == 0) ? 1 : 0;
  MESSAGE("true nearest node reached for " << nearest << " of " << keys << " keys");
  CHECK(nearest * 100 >= 95 * keys);
}

TEST_CASE("a store with an older expiration loses and expired records are gone everywhere") {
  swarm s{12};
  s.grow(20);
  auto t_new = s.in(60s);
  auto t_old = s.in(30s);
  REQUIRE(s.run_put(3, make_put("order", bytes("new"), t_new))->put.accepted == 5);
  auto older = s.run_put(7, make_put("order", bytes("old"), t_old));
  REQUIRE(older->ok);
  CHECK(older->put.accepted == 0);
  CHECK(value_of(s.run_get(11, "order")) == "new");
  CHECK(s.run_get(12, "order")->get.records[0].expiration_ns == t_new);
  s.w.run_for(61s);
  auto gone = s.run_get(13, "order");
  REQUIRE(gone->ok);
  CHECK_FALSE(gone->get.found);
}

TEST_CASE("a node whose table emptied in a partition sees the others' records at its first get "
          "after the partition ends") {
  swarm s{21};
  s.grow(6);
  std::vector<std::string> others;
  for (size_t i = 0; i < 6; ++i)
    if (i != 3)
      others.push_back("n" + std::to_string(i));
  for (auto& o : others)
    s.w.partition("n3", o);
  // Gets from the cut-off node fail towards every peer it knew until none is left in its table.
  for (int i = 0; i < 12 && s.stats(3).evicted_peers < 5; ++i)
    CHECK(value_of(s.run_get(3, "elsewhere")) == "<missing>");
  REQUIRE(s.stats(3).evicted_peers >= 5);
  REQUIRE(s.run_put(1, make_put("elsewhere", bytes("here"), s.in(600s)))->put.accepted >= 1);
  CHECK(value_of(s.run_get(3, "elsewhere")) == "<missing>"); // still cut off
  for (auto& o : others)
    s.w.heal("n3", o);
  // The first get after the partition joins the bootstrap peer again before it looks up: it
  // does not answer from the node's own store alone.
  CHECK(value_of(s.run_get(3, "elsewhere")) == "here");
}

TEST_CASE("sub-keys written by different nodes merge and expire independently") {
  swarm s{13};
  s.grow(20);
  REQUIRE(s.run_put(1, make_subkey_put("stage/0", "peer-a", bytes("a"), s.in(20s)))->put.accepted >
          0);
  REQUIRE(s.run_put(2, make_subkey_put("stage/0", "peer-b", bytes("b"), s.in(60s)))->put.accepted >
          0);
  auto both = s.run_get(9, "stage/0");
  REQUIRE(both->get.found);
  REQUIRE(both->get.records.size() == 2);
  CHECK(both->get.records[0].subkey == "peer-a");
  CHECK(both->get.records[1].subkey == "peer-b");
  s.w.run_for(30s);
  auto one = s.run_get(10, "stage/0");
  REQUIRE(one->get.found);
  REQUIRE(one->get.records.size() == 1);
  CHECK(one->get.records[0].subkey == "peer-b");
  CHECK(text(one->get.records[0].value) == "b");
}

TEST_CASE("empty, binary and long keys are stored and found") {
  swarm s{14};
  s.grow(20);
  std::string binary("\0\x01\xff\n/\0key", 9);
  std::string long_key(4000, 'k');
  for (auto& key : {std::string{}, binary, long_key}) {
    CAPTURE(key.size());
    REQUIRE(s.run_put(4, make_put(key, bytes("v" + std::to_string(key.size())), s.in(60s)))
                ->put.accepted > 0);
    auto g = s.run_get(15, key);
    CHECK(value_of(g) == "v" + std::to_string(key.size()));
    CHECK(g->get.records[0].key == key);
  }
  // A record larger than the limit is refused by every replica and counted.
  auto big = s.run_put(4, make_put("big", std::vector<char>(70 * 1024, 'x'), s.in(60s)));
  REQUIRE(big->ok);
  CHECK(big->put.accepted == 0);
  uint64_t too_large = 0;
  for (size_t i = 0; i < 20; ++i)
    too_large += s.stats(i).rejected_too_large;
  CHECK(too_large == big->put.replicas);
}

TEST_CASE("after 10% of the nodes die, gets still succeed and newcomers read old records") {
  swarm s{15};
  s.grow(100);
  std::mt19937_64 rng{15};
  std::vector<std::string> names;
  std::vector<call_ptr> puts;
  for (int i = 0; i < 100; ++i) {
    names.push_back("k" + std::to_string(i));
    puts.push_back(s.put(10 + rng() % 90, make_put(names.back(), bytes("v"), s.in(3600s))));
  }
  s.settle(puts);
  for (auto& p : puts)
    REQUIRE(p->put.accepted > 0);
  // Kill nodes 1..10 (node 0 stays as the bootstrap node for newcomers).
  for (int i = 1; i <= 10; ++i)
    s.w.kill_node("n" + std::to_string(i), -1ns);
  std::vector<call_ptr> gets;
  for (auto& k : names)
    gets.push_back(s.get(11 + rng() % 89, k));
  s.settle(gets);
  int ok = 0;
  for (auto& g : gets)
    ok += value_of(g) == "v" ? 1 : 0;
  MESSAGE(ok << " of 100 gets succeeded after killing 10 nodes");
  CHECK(ok >= 99);
  uint64_t evicted = 0;
  for (size_t i = 11; i < 100; ++i)
    evicted += s.stats(i).evicted_peers;
  CHECK(evicted > 0);
  s.grow(5);
  std::vector<call_ptr> late;
  for (size_t i = 100; i < 105; ++i)
    for (int k = 0; k < 100; k += 10)
      late.push_back(s.get(i, names[static_cast<size_t>(k)]));
  s.settle(late);
  int late_ok = 0;
  for (auto& g : late)
    late_ok += value_of(g) == "v" ? 1 : 0;
  CHECK(late_ok == static_cast<int>(late.size()));
}

TEST_CASE("a forged write to an owned key is rejected and the owner's write wins") {
  swarm s{16};
  s.grow(20);
  auto owner = s.identity_of(5);
  auto key = "bans" + owner_marker(owner.public_key);
  // Node 6 signs with its own identity: not the owner.
  auto forged = s.run_put(6, make_put(key, bytes("forged"), s.in(120s), true));
  REQUIRE(forged->ok);
  CHECK(forged->put.accepted == 0);
  auto unsigned_put = s.run_put(7, make_put(key, bytes("unsigned"), s.in(120s), false));
  CHECK(unsigned_put->put.accepted == 0);
  auto real = s.run_put(5, make_put(key, bytes("real"), s.in(60s), true));
  CHECK(real->put.accepted == real->put.replicas);
  CHECK(value_of(s.run_get(12, key)) == "real");
  uint64_t bad = 0;
  for (size_t i = 0; i < 20; ++i)
    bad += s.stats(i).rejected_bad_signature;
  CHECK(bad == forged->put.replicas + unsigned_put->put.replicas);
  // A sub-key owned by node 8 inside a shared key.
  auto sub_forged = s.run_put(9, make_subkey_put("peers", owner_marker(s.identity_of(8).public_key),
                                                 bytes("x"), s.in(60s), true));
  CHECK(sub_forged->put.accepted == 0);
  auto sub_real = s.run_put(8, make_subkey_put("peers", owner_marker(s.identity_of(8).public_key),
                                               bytes("me"), s.in(60s), true));
  CHECK(sub_real->put.accepted > 0);
  CHECK(value_of(s.run_get(3, "peers")) == "me");
}

TEST_CASE("a node that banned a signer drops, refuses and no longer reads its records") {
  dht_options o;
  o.num_replicas = 8; // every node holds every record: the banning node too
  swarm s{17, o};
  s.grow(8);
  auto key = "progress" + owner_marker(s.identity_of(5).public_key);
  auto first = s.run_put(5, make_put(key, bytes("v1"), s.in(120s), true));
  REQUIRE(first->ok);
  REQUIRE(first->put.accepted > 0);
  auto other = "other" + owner_marker(s.identity_of(4).public_key);
  REQUIRE(s.run_put(4, make_put(other, bytes("fine"), s.in(120s), true))->put.accepted > 0);
  // Node 2 verified a ban of node 5's key (an actor of node 2 tells its DHT).
  auto dropped = std::make_shared<int64_t>(-1);
  auto d = s.dht(2);
  auto banned_key = s.identity_of(5).public_key;
  s.w.node(2).spawn("", [d, dropped, banned_key](caf::event_based_actor* self) {
    self->request(d, 10s, ban_atom::value, banned_key).then([dropped, self](uint64_t n) {
      *dropped = static_cast<int64_t>(n);
      self->quit();
    });
    return caf::behavior{[](int) {}};
  });
  s.w.run_until([&] { return *dropped >= 0; }, 10s);
  CHECK(*dropped == 1);
  // Node 2 ignores the record wherever it reads it; the others still see it.
  auto at2 = s.run_get(2, key);
  CHECK(value_of(at2) == "<missing>");
  CHECK(value_of(s.run_get(3, key)) == "v1");
  CHECK(value_of(s.run_get(2, other)) == "fine");
  // A newer write is refused at node 2 and counted there only.
  auto second = s.run_put(5, make_put(key, bytes("v2"), s.in(180s), true));
  REQUIRE(second->ok);
  CHECK(second->put.accepted == second->put.replicas - 1);
  CHECK(s.stats(2).rejected_banned == 1);
  CHECK(s.stats(3).rejected_banned == 0);
  CHECK(value_of(s.run_get(6, key)) == "v2");
}

TEST_CASE("a client-mode node puts and gets through the others but enters no routing table") {
  swarm s{18};
  s.grow(10);
  // Node 10 joins in client mode: the others cannot dial it.
  auto& node = s.w.add_node("n10");
  auto opts = s.base;
  opts.address = node.endpoint() + "/dht";
  opts.id = s.identity_of(10);
  opts.bootstrap = {"n0:1/dht"};
  opts.client = true;
  node.on_start([opts](sim::sim_node& nd) { nd.spawn("dht", dht_actor, nd.resolver(), opts); });
  s.w.run_for(500ms);
  auto mine = s.run_put(10, make_put("from-client", bytes("c"), s.in(120s), true));
  REQUIRE(mine->ok);
  CHECK(mine->put.accepted == mine->put.replicas);
  CHECK(mine->put.accepted > 0);
  CHECK(value_of(s.run_get(3, "from-client")) == "c");
  REQUIRE(s.run_put(4, make_put("from-4", bytes("four"), s.in(120s), true))->put.accepted > 0);
  CHECK(value_of(s.run_get(10, "from-4")) == "four");
  // The client knows peers; no full node knows it (10 full nodes: at most 9 peers each), and it
  // holds no record of anyone's.
  CHECK(s.stats(10).peers > 0);
  CHECK(s.stats(10).records == 0);
  for (size_t i = 0; i < 10; ++i)
    CHECK(s.stats(i).peers <= 9);
}

TEST_CASE("requests beyond the per-peer rate are refused and counted") {
  dht_options o;
  o.requests_per_peer_per_second = 2;
  swarm s{17, o};
  s.grow(8);
  std::vector<call_ptr> puts;
  for (int i = 0; i < 20; ++i)
    puts.push_back(s.put(1, make_put("r" + std::to_string(i), bytes("v"), s.in(60s))));
  s.settle(puts);
  uint64_t limited = 0;
  uint64_t evicted = 0;
  for (size_t i = 0; i < 8; ++i) {
    auto st = s.stats(i);
    limited += st.rejected_rate_limit;
    evicted += st.evicted_peers;
  }
  CHECK(limited > 0);
  // A refusal is an answer, not unresponsiveness: nobody evicted the peers that refused it,
  // and the busy client still knows every other node.
  CHECK(evicted == 0);
  CHECK(s.stats(1).peers == 7);
}

TEST_CASE("a typed value (a Cap'n Proto struct) is stored, found and decoded, garbage is an "
          "error") {
  swarm s{19};
  s.grow(10);
  auto put = s.run_put(2, make_typed_put<wire::Ping>(
                              "typed", [](wire::Ping::Builder b) { b.setSeq(0xfeedbeef42ULL); },
                              s.in(60s)));
  REQUIRE(put->ok);
  CHECK(put->put.accepted > 0);
  auto got = s.run_get(7, "typed");
  REQUIRE(got->ok);
  REQUIRE(got->get.found);
  uint64_t seq = 0;
  auto st = decode_value<wire::Ping>(got->get.records[0].value, [&](wire::Ping::Reader r) {
    seq = r.getSeq();
    return status{};
  });
  CHECK(st.ok());
  CHECK(seq == 0xfeedbeef42ULL);
  // A plain byte value is not a Cap'n Proto message: decoding it fails with a reason.
  s.run_put(2, make_put("untyped", bytes("not a capnp msg!"), s.in(60s)));
  auto raw = s.run_get(5, "untyped");
  REQUIRE(raw->get.found);
  auto bad = decode_value<wire::Ping>(raw->get.records[0].value,
                                      [](wire::Ping::Reader) { return status{}; });
  CHECK_FALSE(bad.ok());
  CHECK(!bad.what().empty());
}

} // namespace starling::test::actors_dht_sim_test
