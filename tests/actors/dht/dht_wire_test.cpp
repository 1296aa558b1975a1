// A DHT node across processes: a node of another experiment is refused at the hello and stores
// nothing; a put of the same experiment is stored.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/dht/client.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "messages/wire_context.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"
#include "tests/support/node_fixtures.hpp"

namespace starling::test::actors_dht_wire_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;

namespace {

/// Puts `key` = "v" through the DHT at `address` from `from`: the result, or the error's text.
std::pair<messages::dht_put_result, std::string> put(node& from, const std::string& address,
                                                     const std::string& key) {
  caf::scoped_actor self{from.system()};
  caf::actor dht;
  std::pair<messages::dht_put_result, std::string> out;
  self->request(from.resolver(), 5s, resolve_atom::value, address)
      .receive([&](const caf::actor& x) { dht = x; },
               [&](caf::error& e) { out.second = from.system().render(e); });
  if (!dht)
    return out;
  auto p = actors::dht::make_put(key, {'v'}, actors::dht::expires_in(self.ptr(), 60s));
  self->request(dht, 10s, std::move(p))
      .receive([&](const messages::dht_put_result& r) { out.first = r; },
               [&](caf::error& e) { out.second = from.system().render(e); });
  return out;
}

} // namespace

TEST_CASE("a node of another experiment is refused before its dht put, with the reason, and nothing is stored") {
  auto a = testing::start_node("a", "dht-run");
  auto same = testing::start_node("b", "dht-run");
  auto other = testing::start_node("c", "elsewhere");
  actors::dht::dht_options opts;
  opts.address = a->endpoint() + "/dht";
  opts.id = actors::dht::identity::generate();
  auto dht = actors::dht::spawn_dht(a->system(), a->resolver(), opts);
  a->register_actor("dht", dht);
  auto [refused, why] = put(*other, opts.address, "intruder");
  CHECK(why.find("refused (foreign_experiment)") != std::string::npos);
  CHECK(other->gate()->admission().refusals().of(actors::auth::reason::foreign_experiment) == 1);
  // Nothing of the other run reached a's DHT.
  CHECK(a->wire()->refused_total() == 0);
  auto [stored, none] = put(*same, opts.address, "member");
  CHECK(none.empty());
  CHECK(stored.wire_error.empty());
  CHECK(stored.accepted == 1);
  // Only the member's record is there: the refused put wrote no (empty-keyed) record.
  caf::scoped_actor self{a->system()};
  auto found = [&](const std::string& key) {
    bool f = false;
    self->request(dht, 10s, get_atom::value, key)
        .receive([&](const messages::dht_get_result& r) { f = r.found; },
                 [&](caf::error&) { f = false; });
    return f;
  };
  CHECK(found("member"));
  CHECK_FALSE(found("intruder"));
  CHECK_FALSE(found(""));
}

} // namespace starling::test::actors_dht_wire_test
