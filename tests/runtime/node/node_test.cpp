#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <torch/torch.h>

#include "messages/atoms.hpp"
#include "messages/direct.hpp"
#include "messages/tensor_msg.hpp"
#include "messages/types.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"

namespace starling::test::runtime_node_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;
using starling::messages::ping_msg;

namespace {

caf_options fast_caf() {
  caf_options o;
  o.heartbeat_interval = 100ms;
  o.connection_timeout = 1s;
  return o;
}

caf::behavior ponger(caf::event_based_actor*, std::string origin) {
  return {[=](const ping_msg& m) { return ping_msg{m.seq + 1, origin}; }};
}

} // namespace

TEST_CASE("two actor systems in one process exchange a registered message over loopback") {
  node_options na;
  na.listen = "127.0.0.1:0";
  auto a = node::start(fast_caf(), na, "a");
  auto b = node::start(fast_caf(), na, "b");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  (*a)->register_actor("ponger", (*a)->system().spawn(ponger, "a"));
  auto address = fmt::format("127.0.0.1:{}/ponger", (*a)->port());
  caf::scoped_actor self{(*b)->system()};
  caf::actor peer;
  self->request((*b)->resolver(), 5s, resolve_atom::value, address)
    .receive([&](const caf::actor& h) { peer = h; },
             [&](caf::error& e) { FAIL("resolve failed: " << (*b)->system().render(e)); });
  REQUIRE(peer);
  // The handle is a proxy for an actor of the other system: the message crossed BASP.
  CHECK(peer.node() != (*b)->system().node());
  ping_msg reply;
  self->request(peer, 5s, ping_msg{41, "b"})
    .receive([&](const ping_msg& m) { reply = m; },
             [&](caf::error& e) { FAIL("ping failed: " << (*b)->system().render(e)); });
  CHECK(reply.seq == 42);
  CHECK(reply.origin == "a");
  // Unknown names give a clear error, not a hang.
  std::string why;
  self->request((*b)->resolver(), 5s, resolve_atom::value,
                fmt::format("127.0.0.1:{}/nobody", (*a)->port()))
    .receive([&](const caf::actor&) {}, [&](caf::error& e) { why = (*b)->system().render(e); });
  CHECK(why.find("no actor named 'nobody'") != std::string::npos);
  self->request((*b)->resolver(), 5s, resolve_atom::value, std::string{"not-an-address"})
    .receive([&](const caf::actor&) {}, [&](caf::error& e) { why = (*b)->system().render(e); });
  CHECK(why.find("expected HOST:PORT/NAME") != std::string::npos);
}

TEST_CASE("a node that shuts down is reported down by the node watching it") {
  node_options na;
  auto a = node::start(fast_caf(), na, "a");
  auto b = node::start(fast_caf(), na, "b");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::mutex m;
  std::condition_variable cv;
  std::string lost;
  auto joined = (*b)->join((*a)->endpoint(), [&](const std::string& ep, const std::string&) {
    std::lock_guard<std::mutex> g{m};
    lost = ep;
    cv.notify_all();
  });
  REQUIRE(joined.ok());
  auto endpoint = (*a)->endpoint();
  a->reset(); // shuts node a down
  std::unique_lock<std::mutex> g{m};
  // Bounded wait for an event, not a sleep: returns as soon as the callback fires.
  CHECK(cv.wait_for(g, 10s, [&] { return !lost.empty(); }));
  CHECK(lost == endpoint);
}

TEST_CASE("a client-mode node goes by its peer id: a node it joined reaches it through that "
          "connection, any other fails at once") {
  node_options na;
  na.listen = "127.0.0.1:0";
  auto a = node::start(fast_caf(), na, "a");
  auto b = node::start(fast_caf(), na, "b");
  node_options nc = na;
  nc.client = true;
  auto c = node::start(fast_caf(), nc, "c");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  // Nothing listens; the name is the peer id's, not a place.
  CHECK_FALSE((*c)->listening());
  CHECK((*c)->endpoint() == client_endpoint((*c)->peer_id()));
  CHECK(is_client_endpoint((*c)->endpoint()));
  CHECK_FALSE(is_client_endpoint((*a)->endpoint()));
  auto upper = (*c)->endpoint();
  upper[0] = upper[0] >= 'a' ? static_cast<char>(upper[0] - 32) : 'G';
  CHECK_FALSE(is_client_endpoint(upper));
  CHECK_FALSE(is_client_endpoint((*c)->endpoint().substr(2)));
  CHECK_FALSE(is_client_endpoint("0.client.invalid:1"));
  (*c)->register_actor("ponger", (*c)->system().spawn(ponger, "c"));
  REQUIRE((*c)->join((*a)->endpoint(), [](const std::string&, const std::string&) {}).ok());
  auto address = (*c)->endpoint() + "/ponger";
  // Node a reaches c's actor by that name, over the connection c opened.
  caf::scoped_actor self{(*a)->system()};
  caf::actor peer;
  self->request((*a)->resolver(), 5s, resolve_atom::value, address)
    .receive([&](const caf::actor& h) { peer = h; },
             [&](caf::error& e) { FAIL("resolve failed: " << (*a)->system().render(e)); });
  REQUIRE(peer);
  CHECK(peer.node() == (*c)->system().node());
  ping_msg reply;
  self->request(peer, 5s, ping_msg{1, "a"})
    .receive([&](const ping_msg& m) { reply = m; },
             [&](caf::error& e) { FAIL("ping failed: " << (*a)->system().render(e)); });
  CHECK(reply.seq == 2);
  CHECK(reply.origin == "c");
  // Node b never heard from c: a clear error, no dial of a name nothing listens at.
  caf::scoped_actor other{(*b)->system()};
  std::string why;
  other->request((*b)->resolver(), 5s, resolve_atom::value, address)
    .receive([&](const caf::actor&) {}, [&](caf::error& e) { why = (*b)->system().render(e); });
  CHECK(why.find("is in client mode (it accepts no connections) and has no connection open to "
                 "this node") != std::string::npos);
}

TEST_CASE("listening on a bad address fails with a clear error") {
  node_options bad;
  bad.listen = "127.0.0.1";
  auto n = node::start(fast_caf(), bad, "x");
  REQUIRE_FALSE(n.ok());
  CHECK(n.error().what.find("expected HOST:PORT") != std::string::npos);
}

TEST_CASE("a tensor between two nodes takes the data endpoint, or BASP chunks when it is off") {
  for (bool endpoint : {true, false}) {
    CAPTURE(endpoint);
    node_options no;
    no.data_endpoint = endpoint;
    auto a = node::start(fast_caf(), no, "a");
    auto b = node::start(fast_caf(), no, "b");
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(((*b)->data_endpoint() != nullptr) == endpoint);
    caf::scoped_actor sink{(*b)->system()};
    (*b)->register_actor("rx",
                         (*b)->spawn_transfer_receiver(caf::actor_cast<caf::actor>(sink)));
    caf::scoped_actor self{(*a)->system()};
    caf::actor rx;
    self->request((*a)->resolver(), 5s, resolve_atom::value, (*b)->endpoint() + "/rx")
      .receive([&](const caf::actor& h) { rx = h; },
               [&](caf::error& e) { FAIL("resolve failed: " << (*a)->system().render(e)); });
    REQUIRE(rx);
    auto tx = (*a)->spawn_transfer_sender();
    torch::manual_seed(5);
    messages::tensor_msg m;
    m.tensor = torch::randn({256, 1024});
    std::string path;
    self->request(tx, 30s, transfer_atom::value, m, rx)
      .receive([&](const messages::transfer_report& r) { path = r.path; },
               [&](caf::error& e) { FAIL("transfer failed: " << (*a)->system().render(e)); });
    CHECK(path == (endpoint ? "direct" : "chunked"));
    bool equal = false;
    sink->receive([&](messages::tensor_msg& y) { equal = torch::equal(y.tensor, m.tensor); },
                  caf::after(std::chrono::seconds(30)) >> [] {});
    CHECK(equal);
  }
}

TEST_CASE("a node listening beyond loopback opens no data endpoint") {
  node_options no;
  no.listen = "0.0.0.0:0";
  auto n = node::start(fast_caf(), no, "wide");
  REQUIRE(n.ok());
  CHECK((*n)->data_endpoint() == nullptr);
}

} // namespace starling::test::runtime_node_test
