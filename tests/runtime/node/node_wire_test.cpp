// A node's wire context (experiment id and peer id on every envelope, arriving ones checked and
// refusals counted) and the bare node's ping actor answering a refused envelope with the reason.
#include <doctest/doctest.h>

#include <filesystem>
#include <regex>

#include <sys/stat.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fmt/format.h>

#include "actors/auth/identity.hpp"
#include "actors/dht/node_id.hpp"
#include "messages/atoms.hpp"
#include "messages/types.hpp"
#include "messages/wire_context.hpp"
#include "runtime/cli/cli.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"
#include "tests/support/node_fixtures.hpp"
#include "tests/support/subprocess.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_node_wire_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;
using starling::messages::ping_msg;

namespace {

using testing::fast_caf;

/// Scratch folders of these tests.
struct temp_dir : starling::testing::temp_dir {
  temp_dir() : starling::testing::temp_dir("starling-wire") {}
};

/// Resolves `address` from `from` (fails the test when it cannot).
caf::actor resolve(node& from, const std::string& address) {
  caf::scoped_actor self{from.system()};
  caf::actor out;
  self->request(from.resolver(), 5s, resolve_atom::value, address)
      .receive([&](const caf::actor& h) { out = h; },
               [&](caf::error& e) { FAIL("resolve failed: " << from.system().render(e)); });
  return out;
}

} // namespace

TEST_CASE("a node of another experiment is refused at the hello, with the reason, and counted") {
  auto a = testing::start_node("a", "exp-a");
  auto b = testing::start_node("b", "exp-b");
  auto c = testing::start_node("c", "exp-a");
  a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
  auto address = fmt::format("127.0.0.1:{}/ping", a->port());
  {
    caf::scoped_actor self{b->system()};
    std::string why;
    self->request(b->resolver(), 5s, resolve_atom::value, address)
        .receive([&](const caf::actor&) { FAIL("a node of another run was admitted"); },
                 [&](caf::error& e) { why = b->system().render(e); });
    // Each side checks the other's hello: b refuses a's first (a answers b's challenge first).
    CHECK(why.find("refused (foreign_experiment)") != std::string::npos);
    CHECK(why.find("hello for experiment 'exp-a', this run is 'exp-b'") != std::string::npos);
    CHECK(b->gate()->admission().refusals().of(actors::auth::reason::foreign_experiment) == 1);
    // No envelope of b reached a.
    CHECK(a->wire()->refused_total() == 0);
    CHECK(a->wire()->admitted() == 0);
  }
  {
    // A node of the same experiment is served, and its envelope is admitted.
    auto admitted = a->wire()->admitted();
    auto peer = resolve(*c, address);
    REQUIRE(peer);
    caf::scoped_actor self{c->system()};
    ping_msg reply;
    self->request(peer, 5s, ping_msg{8, "c"})
        .receive([&](const ping_msg& m) { reply = m; },
                 [&](caf::error& e) { FAIL("ping failed: " << c->system().render(e)); });
    CHECK(reply.wire_error.empty());
    CHECK(reply.seq == 8);
    CHECK(reply.origin == "a");
    CHECK(a->wire()->admitted() == admitted + 1);
    CHECK(a->wire()->refused_total() == 0);
    // The reply crossed as an envelope too, admitted by c.
    CHECK(c->wire()->admitted() >= 1);
    CHECK(c->wire()->refused_total() == 0);
  }
  // Each node's wire context carries its own experiment and peer id.
  CHECK(a->wire()->options().experiment == "exp-a");
  CHECK(a->wire()->options().peer_id == a->peer_id());
  CHECK(a->peer_id().size() == 20);
  CHECK(a->peer_id() != c->peer_id());
}

TEST_CASE("a node's key file is created on its first start and gives it the same peer id later") {
  temp_dir dir;
  node_options no;
  no.experiment = "exp";
  no.key_file = dir.path + "/keys/node.key";
  std::string first;
  {
    auto n = node::start(fast_caf(), no, "n");
    REQUIRE(n.ok());
    CHECK((*n)->key_created());
    first = (*n)->peer_id();
  }
  struct stat st {};
  REQUIRE(::stat(no.key_file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto key = actors::auth::load_secret_key_file(no.key_file, actors::auth::key_role::node);
  REQUIRE(key.ok());
  CHECK(key->peer_id() == first);
  auto again = node::start(fast_caf(), no, "n");
  REQUIRE(again.ok());
  CHECK_FALSE((*again)->key_created());
  CHECK((*again)->peer_id() == first);
  CHECK((*again)->wire()->options().peer_id == first);
}

TEST_CASE("a node whose key file is open to others does not start, and says how to fix it") {
  temp_dir dir;
  node_options no;
  no.key_file = dir.path + "/node.key";
  {
    auto n = node::start(fast_caf(), no, "n");
    REQUIRE(n.ok());
  }
  REQUIRE(::chmod(no.key_file.c_str(), 0644) == 0);
  auto n = node::start(fast_caf(), no, "n");
  REQUIRE_FALSE(n.ok());
  CHECK(n.error().what.find("chmod") != std::string::npos);
}

TEST_CASE("a process that skips the hello finds no actor of a node but its gate") {
  auto a = testing::start_node("a", "");
  a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
  // A bare actor system: no gate, no wire context; it connects straight to the directory.
  caf::actor_system_config cfg;
  configure_system(cfg, fast_caf(), true);
  caf::actor_system sys{cfg};
  auto peer = sys.middleman().remote_actor("127.0.0.1", a->port());
  REQUIRE(peer);
  caf::scoped_actor self{sys};
  auto lookup = [&](const std::string& name) {
    std::string why;
    self->request(caf::actor_cast<caf::actor>(*peer), 5s, get_atom::value, name)
        .receive([&](const caf::actor&) {}, [&](caf::error& e) { why = sys.render(e); });
    return why;
  };
  CHECK(lookup("ping").find("refused (no_hello)") != std::string::npos);
  CHECK(lookup(gate_name).empty());
  std::string listed;
  self->request(caf::actor_cast<caf::actor>(*peer), 5s, list_atom::value)
      .receive([&](const std::vector<std::string>&) { listed = "listed"; },
               [&](caf::error& e) { listed = sys.render(e); });
  CHECK(listed.find("refused (no_hello)") != std::string::npos);
  // Nor can it register names in the node's directory.
  std::string put;
  self->request(caf::actor_cast<caf::actor>(*peer), 5s, put_atom::value, std::string{"ping"},
                caf::actor{self})
      .receive([&] { put = "registered"; }, [&](caf::error& e) { put = sys.render(e); });
  CHECK(put.find("refused (role_denied)") != std::string::npos);
}

TEST_CASE("a cluster node's DHT speaks with the node's key: its DHT id is the node's peer id") {
  temp_dir dir;
  starling::testing::subprocess p{{STARLING_BINARY, "node", "--config",
                                   STARLING_SOURCE_DIR + "/configs/ping-sim.yaml", "--index", "0",
                                   "--nodes", "8", "--listen", "127.0.0.1:0", "--out",
                                   dir.path + "/n0"}};
  auto line = p.wait_for("listening on", 30s);
  REQUIRE(line);
  std::smatch m;
  REQUIRE(std::regex_search(*line, m, std::regex{R"(listening on (\S+) \(peer id ([0-9a-f]{40})\))"}));
  auto n = testing::start_node("probe", "ping-sim");
  auto dht = resolve(*n, m[1].str() + "/dht");
  std::string key;
  {
    caf::scoped_actor self{n->system()};
    self->request(dht, 5s, dht_key_atom::value)
        .receive([&](const std::string& k) { key = k; },
                 [&](caf::error& e) { FAIL("no DHT key: " << n->system().render(e)); });
  }
  REQUIRE(key.size() == actors::auth::public_key_bytes);
  // The key that signs the node's DHT records is the one its envelopes and key file name.
  CHECK(actors::auth::to_hex(actors::auth::peer_id_of(key)) == m[2].str());
  CHECK(actors::auth::to_hex(actors::dht::node_id::of_key(key).to_bytes()) == m[2].str());
  n->shutdown();
}

} // namespace starling::test::runtime_node_wire_test
