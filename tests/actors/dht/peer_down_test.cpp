// A DHT peer that dies while it holds our request: the request fails when the peer goes down,
// not at the RPC timeout (CAF fails a request whose receiver died only at its timeout; a
// SIGKILLed node's connection closes at once, so its death is known long before).
#include <doctest/doctest.h>

#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "support/test_system.hpp"

namespace starling::test::actors_dht_peer_down_test {

using namespace starling;
using messages::dht_get_result;
using messages::dht_request;
using messages::dht_response;
using messages::dht_rpc;
using messages::dht_stats;

namespace {

struct silent_state {
  /// Requests it holds and never answers.
  std::vector<caf::typed_response_promise<dht_response>> held;
};

/// A DHT peer that answers pings and node lookups (so that it joins the other's table) but holds
/// every value lookup without answering: a node that froze mid-request.
caf::behavior freezing_peer(caf::stateful_actor<silent_state>* self, messages::dht_peer me) {
  return {
      [=](dht_request& req) -> caf::result<dht_response> {
        if (req.kind == static_cast<uint8_t>(dht_rpc::find_value)) {
          auto rp = self->make_response_promise<dht_response>();
          self->state.held.push_back(rp);
          return rp;
        }
        dht_response resp;
        resp.responder = me;
        return resp;
      },
  };
}

/// Resolves every address to `peer`.
caf::behavior fixed_resolver(caf::event_based_actor*, caf::actor peer) {
  return {[=](resolve_atom, const std::string&) { return peer; }};
}

} // namespace

TEST_CASE("a dht request held by a peer that dies fails at the death, not at the rpc timeout, "
          "and the peer leaves the table") {
  test_system ts;
  auto& sys = *ts.sys;
  auto b_id = actors::dht::identity::from_seed(2);
  messages::dht_peer b{actors::dht::id_of(b_id).to_bytes(), "b/dht"};
  auto peer = sys.spawn(freezing_peer, b);
  auto resolver = sys.spawn(fixed_resolver, peer);
  actors::dht::dht_options o;
  o.address = "a/dht";
  o.id = actors::dht::identity::from_seed(1);
  o.bootstrap = {"b/dht"};
  o.rpc_timeout = std::chrono::seconds(2);
  auto dht = actors::dht::spawn_dht(sys, resolver, o);
  ts.run(); // the join: b answers the ping and the lookup of a's own id
  auto got = std::make_shared<std::optional<dht_get_result>>();
  auto stats = std::make_shared<std::optional<dht_stats>>();
  auto client = sys.spawn([=](caf::event_based_actor* self) {
    self->request(dht, std::chrono::seconds(60), get_atom::value, std::string{"key"})
        .then([=](const dht_get_result& r) { *got = r; }, [](caf::error&) {});
    return caf::behavior{[=](status_atom) {
      self->request(dht, std::chrono::seconds(60), status_atom::value)
          .then([=](const dht_stats& s) { *stats = s; }, [](caf::error&) {});
    }};
  });
  ts.run();
  CHECK_FALSE(got->has_value()); // b holds the lookup
  caf::anon_send(client, status_atom::value);
  ts.run();
  CHECK((stats->has_value() && (*stats)->peers == 1));
  stats->reset();
  // b dies; no virtual time passes, so no timeout can fire.
  caf::anon_send_exit(peer, caf::exit_reason::kill);
  ts.run();
  CHECK(got->has_value());
  if (got->has_value())
    CHECK_FALSE((*got)->found);
  caf::anon_send(client, status_atom::value);
  ts.run();
  CHECK(stats->has_value());
  if (stats->has_value())
    CHECK((*stats)->peers == 0);
  // Checks above, not requirements: a test system whose actors live never shuts down.
  for (auto& a : {dht, resolver, client})
    caf::anon_send_exit(a, caf::exit_reason::kill);
  ts.run_all();
}

} // namespace starling::test::actors_dht_peer_down_test
