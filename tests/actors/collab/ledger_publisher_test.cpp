// The ledger publisher of SWARM peers (actors/collab/ledger_publisher.hpp): what it is fed adds
// up in the summary it stores every period under the peer's shard, signed with the node key's
// owner marker, and a peer that leaves on purpose gets a last record with `left`.
#include "actors/collab/ledger_publisher.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "actors/collab/ledger_record.hpp"
#include "actors/collab/shell.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "support/test_system.hpp"

namespace starling::test::actors_collab_ledger_publisher_test {

using namespace starling::actors::collab;
using namespace std::chrono_literals;

namespace {

/// A DHT that hands out a node key and keeps every put.
caf::behavior fake_dht(caf::event_based_actor*,
                       std::shared_ptr<std::vector<messages::dht_put>> puts) {
  return {
      [](dht_key_atom) { return std::string(32, '\x07'); },
      [puts](messages::dht_put& p) {
        puts->push_back(p);
        return messages::dht_put_result{1, 1, 0, {}};
      },
  };
}

} // namespace

TEST_CASE("a ledger publisher stores what its peer did every period, and a last record when it "
          "leaves") {
  test_system t;
  auto puts = std::make_shared<std::vector<messages::dht_put>>();
  auto dht = t.sys->spawn(fake_dht, puts);
  ledger_publisher_options o;
  o.dht = dht;
  o.experiment = "exp";
  o.address = "@1/stage.3";
  o.name = "stage.3";
  o.stage = 0;
  o.every = 1s;
  auto pub = spawn_ledger_publisher(*t.sys, o);
  t.run();
  caf::anon_send(pub, ledger_add_atom::value, 16.0, 0.0, 0.0, 0.0);
  caf::anon_send(pub, ledger_add_atom::value, 16.0, 16.0, 1.0, 1.0);
  // Increments that are no counts are ignored.
  caf::anon_send(pub, ledger_add_atom::value, -5.0, std::nan(""), 0.0, 0.0);
  caf::anon_send(pub, ledger_credit_atom::value, trainer_credit_name_of("trainer.0"), 16.0);
  caf::anon_send(pub, ledger_credit_atom::value, trainer_credit_name_of("trainer.0"), -1.0);
  caf::anon_send(pub, ledger_gauge_atom::value, 2.5, 4.0);
  caf::anon_send(pub, ledger_gauge_atom::value, std::nan(""), 3.0); // steps only grow
  t.run();
  CHECK(puts->empty());
  t.advance(1s);
  REQUIRE(puts->size() == 1);
  auto& p = puts->front();
  auto id = record_id("@1/stage.3", std::string(32, '\x07'));
  CHECK(p.has_subkey);
  CHECK(p.sign);
  CHECK(p.subkey == id);
  CHECK(p.key == ledger_key("exp", ledger_shard(id)));
  auto s = decode_summary_record(p.subkey, p.value);
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().what));
  CHECK(s->name == "stage.3");
  CHECK(s->stage == 0);
  CHECK(s->computed == 32);
  CHECK(s->dropped == 16);
  CHECK(s->rounds == 1);
  CHECK(s->rounds_averaged == 1);
  CHECK(s->loss == 2.5);
  CHECK(s->step == 4);
  CHECK_FALSE(s->left);
  REQUIRE(s->credits.size() == 1);
  CHECK(s->credits[0].peer == trainer_credit_name_of("trainer.0"));
  CHECK(s->credits[0].samples == 16);
  // Four periods to live: a reader keeps it through three missed ones.
  CHECK(std::llabs(p.expiration_ns - std::llround(s->time * 1e9) - 4'000'000'000LL) < 1000);
  t.advance(1s);
  CHECK(puts->size() == 2);
  caf::anon_send(pub, ledger_left_atom::value);
  t.run();
  REQUIRE(puts->size() == 3);
  auto last = decode_summary_record(puts->back().subkey, puts->back().value);
  REQUIRE(last.ok());
  CHECK(last->left);
  // It quit after its last record: no more periods.
  t.advance(5s);
  CHECK(puts->size() == 3);
  caf::anon_send_exit(dht, caf::exit_reason::user_shutdown);
  t.run();
}

} // namespace starling::test::actors_collab_ledger_publisher_test
