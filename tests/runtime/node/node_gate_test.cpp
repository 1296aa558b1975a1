// The gate on live connections: nodes of a closed run (an authority, tokens, TLS with the run's CA)
// admit each other by a signed hello before anything else; outsiders are refused with the reason
// and counted (the hostile client below speaks the gate's protocol with bad hellos); a process
// that skips the hello finds no actor; a revoked peer's next envelope is refused.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/ban_service.hpp"
#include "actors/auth/gatekeeper.hpp"
#include "actors/auth/identity.hpp"
#include "actors/supervisor/supervisor.hpp"
#include "actors/transfer/link_crypto.hpp"
#include "actors/transfer/socket_io.hpp"
#include "messages/atoms.hpp"
#include "messages/direct.hpp"
#include "messages/tensor_msg.hpp"
#include "messages/types.hpp"
#include "messages/wire.hpp"
#include "messages/wire_context.hpp"
#include "runtime/cli/cli.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"
#include "runtime/node/openssl_errors.hpp"
#include "tests/support/closed_run.hpp"
#include "tests/support/node_fixtures.hpp"
#include "tests/support/raw_socket.hpp"

namespace starling::test::runtime_node_gate_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;
namespace auth = starling::actors::auth;
using messages::ping_msg;

using testing::closed_run;
using testing::now_ns;

namespace {

/// Resolves `address` from `from`: the handle, or the error's text.
std::pair<caf::actor, std::string> try_resolve(node& from, const std::string& address) {
  caf::scoped_actor self{from.system()};
  std::pair<caf::actor, std::string> out;
  self->request(from.resolver(), 10s, resolve_atom::value, address)
    .receive([&](const caf::actor& h) { out.first = h; },
             [&](caf::error& e) { out.second = from.system().render(e); });
  return out;
}

/// Pings `peer` from `from`: the responder's name, or the error's text.
std::string ping(node& from, const caf::actor& peer) {
  caf::scoped_actor self{from.system()};
  std::string out;
  self->request(peer, 5s, ping_msg{1, from.name()})
    .receive([&](const ping_msg& m) { out = m.wire_error.empty() ? m.origin : m.wire_error; },
             [&](caf::error& e) { out = from.system().render(e); });
  return out;
}

/// An actor system config whose wire context a test sets (none: envelopes with empty headers).
struct outsider_config : caf::actor_system_config, messages::wire_context_holder {};

/// An outsider: a bare actor system (no gate; no wire context unless the test sets `cfg->wire`)
/// that connects to a node's published directory and speaks the gate's protocol with whatever
/// hello it is given.
struct outsider {
  std::unique_ptr<outsider_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor dir;

  explicit outsider(uint16_t port) : cfg(std::make_unique<outsider_config>()) {
    configure_system(*cfg, testing::fast_caf(), true);
    sys = std::make_unique<caf::actor_system>(*cfg);
    auto d = sys->middleman().remote_actor("127.0.0.1", port);
    REQUIRE(d);
    dir = caf::actor_cast<caf::actor>(*d);
  }

  /// Looks up `name` in the node's directory: the handle, or the error's text.
  std::pair<caf::actor, std::string> lookup(const std::string& name) {
    caf::scoped_actor self{*sys};
    std::pair<caf::actor, std::string> out;
    self->request(dir, 5s, get_atom::value, name)
      .receive([&](const caf::actor& h) { out.first = h; },
               [&](caf::error& e) { out.second = sys->render(e); });
    return out;
  }

  /// Opens a session at the gate: (session, the gate's challenge).
  std::pair<uint64_t, std::string> open(const std::string& my_peer_id) {
    auto gate = lookup(gate_name).first;
    REQUIRE(gate);
    caf::scoped_actor self{*sys};
    std::pair<uint64_t, std::string> out;
    self->request(gate, 5s, hello_atom::value, my_peer_id, std::string(32, 'c'))
      .receive([&](uint64_t s, const std::string& challenge, const std::string&) {
                 out = {s, challenge};
               },
               [&](caf::error& e) { FAIL("the gate did not open: " << sys->render(e)); });
    return out;
  }

  /// Presents `hello` for `session` with the claim that this system's `dir` is published at
  /// `endpoint`: the gate's answer (empty: admitted), which waits for the claim's verification.
  std::string claim(uint64_t session, const std::string& hello, const std::string& endpoint,
                    const caf::actor& dir) {
    auto gate = lookup(gate_name).first;
    caf::scoped_actor self{*sys};
    std::string out = "no answer";
    self->request(gate, 5s, hello_atom::value, session, hello, caf::actor{}, endpoint, dir)
      .receive([&](const std::string& line) { out = line; },
               [&](caf::error& e) { out = sys->render(e); });
    return out;
  }

  /// Presents `hello` for `session`: the gate's answer (empty: admitted).
  std::string present(uint64_t session, const std::string& hello) {
    auto gate = lookup(gate_name).first;
    caf::scoped_actor self{*sys};
    std::string out = "no answer";
    self->request(gate, 5s, hello_atom::value, session, hello, caf::actor{})
      .receive([&](const std::string& line) { out = line; },
               [&](caf::error& e) { out = sys->render(e); });
    return out;
  }
};

/// A hello of `key` answering `challenge` at `acceptor`, with `token`, changed by `change`.
template <class Change>
std::string hello_of(const auth::key_pair& key, const std::string& challenge,
                     const std::string& acceptor, const std::string& token, Change&& change) {
  auth::hello h;
  h.version = messages::protocol_version;
  h.experiment = "gate-run";
  h.token = token;
  h.challenge = challenge;
  h.acceptor_peer_id = acceptor;
  h.time_ns = now_ns();
  change(h);
  return auth::make_hello(key, h);
}

} // namespace

TEST_CASE("token holders of a closed run connect over TLS, and a node without the run's certificate is refused on both sides") {
  closed_run run;
  auto a = run.start("a", true);
  auto b = run.start("b", true);
  CHECK(a->tls());
  CHECK_FALSE(a->open_run());
  CHECK(a->experiment() == "gate-run");
  a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
  auto [peer, why] = try_resolve(*b, fmt::format("127.0.0.1:{}/ping", a->port()));
  REQUIRE_MESSAGE(peer, why);
  CHECK(ping(*b, peer) == "a");
  CHECK(a->gate()->admission().admitted() == 1);
  CHECK(b->gate()->admission().admitted() == 1);
  // Every envelope of a closed run is signed, and each arriving one verified against the key
  // its sender was admitted with.
  CHECK(a->wire()->signs());
  CHECK(a->wire()->options().require_signature);
  CHECK(a->wire()->admitted() >= 1);
  CHECK(a->wire()->refused(messages::wire_reason::signature) == 0);
  CHECK(b->wire()->refused_total() == 0);
  // An open node (no certificate) cannot reach the TLS node, nor the TLS node it.
  auto plain = testing::start_node("plain", "gate-run");
  auto to_tls = plain->join(fmt::format("127.0.0.1:{}", a->port()), {});
  CHECK_FALSE(to_tls.ok());
  auto from_tls = b->join(fmt::format("127.0.0.1:{}", plain->port()), {});
  CHECK_FALSE(from_tls.ok());
  CHECK(a->gate()->admission().admitted() == 1);
}

namespace {

/// Two TLS nodes of one closed run, each with a ping actor, b connected to a (one hello).
struct tls_pair {
  closed_run run;
  std::unique_ptr<node> a = run.start("a", true);
  std::unique_ptr<node> b = run.start("b", true);
  /// a's ping actor as b resolved it.
  caf::actor at_a;

  tls_pair() {
    a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
    b->register_actor("ping", b->system().spawn(ping_responder, std::string{"b"}));
    auto [at, why] = try_resolve(*b, fmt::format("127.0.0.1:{}/ping", a->port()));
    REQUIRE_MESSAGE(at, why);
    at_a = at;
    CHECK(ping(*b, at_a) == "a");
  }

  /// a resolves b's ping, both directions answer, and neither node said hello again: still the
  /// one connection b opened.
  void check_one_connection() {
    auto [at_b, why_b] = try_resolve(*a, fmt::format("127.0.0.1:{}/ping", b->port()));
    REQUIRE_MESSAGE(at_b, why_b);
    CHECK(ping(*a, at_b) == "b");
    CHECK(ping(*b, at_a) == "a");
    CHECK(a->gate()->admission().admitted() == 1);
    CHECK(b->gate()->admission().admitted() == 1);
  }
};

} // namespace

TEST_CASE("two TLS nodes that resolve each other in turn keep the first connection's handles") {
  // The second direction must reuse the connection the first one opened: a second BASP
  // connection between two caf_openssl nodes, closed by CAF as redundant, took the first one's
  // route down with it (every handle of the other node then failed as unreachable).
  tls_pair p; // one hello per pair: the second direction needs none
  p.check_one_connection();
}

TEST_CASE("two TLS nodes that resolve each other at the same moment get working handles") {
  // Both dial at once: without the larger endpoint waiting for the smaller one's dial, each
  // opened a connection and requests over either were lost until one timed out.
  closed_run run;
  auto a = run.start("a", true);
  auto b = run.start("b", true);
  a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
  b->register_actor("ping", b->system().spawn(ping_responder, std::string{"b"}));
  caf::scoped_actor from_a{a->system()};
  caf::scoped_actor from_b{b->system()};
  auto to_a = from_b->request(b->resolver(), 10s, resolve_atom::value,
                              fmt::format("127.0.0.1:{}/ping", a->port()));
  auto to_b = from_a->request(a->resolver(), 10s, resolve_atom::value,
                              fmt::format("127.0.0.1:{}/ping", b->port()));
  caf::actor at_a, at_b;
  to_a.receive([&](const caf::actor& h) { at_a = h; },
               [&](caf::error& e) { FAIL("b resolving a: " << b->system().render(e)); });
  to_b.receive([&](const caf::actor& h) { at_b = h; },
               [&](caf::error& e) { FAIL("a resolving b: " << a->system().render(e)); });
  CHECK(ping(*a, at_b) == "b");
  CHECK(ping(*b, at_a) == "a");
  CHECK(a->gate()->admission().admitted() == 1);
  CHECK(b->gate()->admission().admitted() == 1);
}

TEST_CASE("a tensor between two nodes of a closed run takes a sealed direct link") {
  closed_run run;
  auto a = run.start("a", true);
  auto b = run.start("b", true);
  REQUIRE(a->data_endpoint());
  REQUIRE(b->data_endpoint());
  CHECK(a->link_security());
  CHECK(a->data_endpoint()->link_layer()->sealed());
  CHECK(b->data_endpoint()->link_layer()->sealed());
  caf::scoped_actor sink{b->system()};
  b->register_actor("rx", b->spawn_transfer_receiver(caf::actor_cast<caf::actor>(sink)));
  auto [rx, why] = try_resolve(*a, fmt::format("127.0.0.1:{}/rx", b->port()));
  REQUIRE_MESSAGE(rx, why);
  auto tx = a->spawn_transfer_sender();
  torch::manual_seed(5);
  messages::tensor_msg m;
  m.tensor = torch::randn({64, 1024});
  caf::scoped_actor self{a->system()};
  std::string path;
  self->request(tx, 30s, transfer_atom::value, m, rx)
    .receive([&](const messages::transfer_report& r) { path = r.path; },
             [&](caf::error& e) { FAIL("transfer failed: " << a->system().render(e)); });
  CHECK(path == "direct");
  bool equal = false;
  sink->receive([&](messages::tensor_msg& y) { equal = torch::equal(y.tensor, m.tensor); },
                caf::after(std::chrono::seconds(30)) >> [] {});
  CHECK(equal);
  CHECK(b->data_endpoint()->link_layer()->refusals().empty());
  CHECK(a->data_endpoint()->failed() == 0);
  // An open node's links stay plaintext.
  auto plain = testing::start_node("plain", "gate-run");
  CHECK_FALSE(plain->link_security());
  if (plain->data_endpoint())
    CHECK_FALSE(plain->data_endpoint()->link_layer()->sealed());
}

TEST_CASE("a node's own credentials are checked at start: a missing token, another node's token, an expired one") {
  closed_run run;
  auto no = run.options("a", false);
  no.token.clear();
  auto n = node::start(testing::fast_caf(), no, "a");
  REQUIRE_FALSE(n.ok());
  CHECK(n.error().what.find("needs both") != std::string::npos);
  no = run.options("a", false);
  no.token = run.dir.path + "/b.token";
  run.issue("b");
  n = node::start(testing::fast_caf(), no, "a");
  REQUIRE_FALSE(n.ok());
  CHECK(n.error().what.find("belongs to peer") != std::string::npos);
  no = run.options("a", false);
  run.issue("a", 7200, 3600);
  n = node::start(testing::fast_caf(), no, "a");
  REQUIRE_FALSE(n.ok());
  CHECK(n.error().what.find("expired") != std::string::npos);
}

TEST_CASE("a hostile client is refused at the gate with each reason counted, and honest nodes are still served") {
  closed_run run;
  auto a = run.start("a", false);
  a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
  outsider o{a->port()};
  // Without a hello, nothing but the gate is found.
  auto [hidden, why] = o.lookup("ping");
  CHECK_FALSE(hidden);
  CHECK(why.find("refused (no_hello)") != std::string::npos);
  auto mine = run.key("x");
  auto good = run.issue("x");
  auto expired = run.issue("x", 7200, 3600);
  auto theirs = run.issue("y");
  auto forged = good;
  forged[forged.size() - 3] ^= 0x5a; // inside the authority's signature
  auto same = [](auth::hello&) {};
  struct attempt {
    const char* what;
    std::function<std::string(const std::string& challenge)> hello;
    auth::reason expected;
  };
  std::vector<attempt> attempts{
    {"garbage", [](const std::string&) { return std::string(200, '\x17'); },
     auth::reason::malformed},
    {"no token", [&](const std::string& c) { return hello_of(mine, c, a->peer_id(), "", same); },
     auth::reason::no_token},
    {"expired token",
     [&](const std::string& c) { return hello_of(mine, c, a->peer_id(), expired, same); },
     auth::reason::expired},
    {"forged token",
     [&](const std::string& c) { return hello_of(mine, c, a->peer_id(), forged, same); },
     auth::reason::forged},
    {"another node's token",
     [&](const std::string& c) { return hello_of(mine, c, a->peer_id(), theirs, same); },
     auth::reason::wrong_key},
    {"another experiment",
     [&](const std::string& c) {
       return hello_of(mine, c, a->peer_id(), good, [](auth::hello& h) { h.experiment = "x"; });
     },
     auth::reason::foreign_experiment},
    {"another protocol version",
     [&](const std::string& c) {
       return hello_of(mine, c, a->peer_id(), good, [](auth::hello& h) { h.version = 1; });
     },
     auth::reason::version_mismatch},
    {"another node's challenge",
     [&](const std::string&) {
       return hello_of(mine, std::string(32, 'z'), a->peer_id(), good, same);
     },
     auth::reason::wrong_challenge},
  };
  for (auto& t : attempts) {
    CAPTURE(t.what);
    auto [session, challenge] = o.open(mine.peer_id());
    auto line = o.present(session, t.hello(challenge));
    CHECK(line.find(fmt::format("refused ({})", auth::to_string(t.expected))) == 0);
    CHECK(a->gate()->admission().refusals().of(t.expected) >= 1);
  }
  // A valid hello is admitted once; presented again (a replay) it is refused.
  auto [session, challenge] = o.open(mine.peer_id());
  auto hello = hello_of(mine, challenge, a->peer_id(), good, same);
  CHECK(o.present(session, hello).empty());
  CHECK(o.present(session, hello).find("refused (protocol_violation)") == 0);
  auto [session2, challenge2] = o.open(mine.peer_id());
  CHECK(o.present(session2, hello).find("refused (wrong_challenge)") == 0);
  CHECK(a->gate()->admission().refusals().total() == attempts.size() + 2);
  // Meanwhile an honest node is served.
  auto b = run.start("b", false);
  auto [peer, err] = try_resolve(*b, fmt::format("127.0.0.1:{}/ping", a->port()));
  REQUIRE_MESSAGE(peer, err);
  CHECK(ping(*b, peer) == "a");
}

namespace {

/// A closed run of two nodes: `a` serves "ping", `c` has resolved it (`peer`) and been served.
struct served_pair {
  closed_run run;
  std::unique_ptr<node> a;
  std::unique_ptr<node> c;
  caf::actor peer;

  served_pair() : a(run.start("a", false)), c(run.start("c", false)) {
    a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
    auto [h, err] = try_resolve(*c, fmt::format("127.0.0.1:{}/ping", a->port()));
    REQUIRE_MESSAGE(h, err);
    peer = h;
    CHECK(ping(*c, peer) == "a");
  }
};

} // namespace

TEST_CASE("a ban the node verified itself, handed to its gate by its own actor, refuses the peer; "
          "another node cannot hand one") {
  served_pair p;
  auto& a = p.a;
  auto& c = p.c;
  const auto c_key = p.run.key("c").public_key();
  // c, admitted, asks a's gate to ban c's own key (any key would do): refused, a remote sender.
  auto [gate, gate_err] = try_resolve(*c, fmt::format("127.0.0.1:{}/{}", a->port(), gate_name));
  REQUIRE_MESSAGE(gate, gate_err);
  auto ask = [&](node& from, const caf::actor& g, const std::string& key, const std::string& why) {
    caf::scoped_actor self{from.system()};
    std::string out = "no answer";
    self->request(g, 5s, auth::verified_ban_atom::value, key, why)
      .receive([&](uint64_t removed) { out = fmt::format("removed {}", removed); },
               [&](caf::error& e) { out = from.system().render(e); });
    return out;
  };
  CHECK(ask(*c, gate, c_key, "framed").find("this node's own actors") != std::string::npos);
  CHECK(ping(*c, p.peer) == "a");
  CHECK_FALSE(a->gate()->admission().verified_ban(c_key));
  // a's own actor: a malformed ban is refused, a good one removes c.
  auto own = a->gate()->own_gate();
  REQUIRE(own);
  CHECK(ask(*a, own, "short", "x").find("malformed") != std::string::npos);
  CHECK(ask(*a, own, c_key, "two\nlines").find("malformed") != std::string::npos);
  CHECK(ask(*a, own, c_key, "a wrong aggregate at step 3") == "removed 1");
  CHECK(a->gate()->admission().verified_ban(c_key) == "a wrong aggregate at step 3");
  auto refused = ping(*c, p.peer);
  CHECK(refused.find("unauthorized") != std::string::npos);
  CHECK(refused.find("banned") != std::string::npos);
  CHECK(a->gate()->admission().refusals().of(auth::reason::banned) >= 1);
}

TEST_CASE("a member that signs envelopes in another member's name is refused as signature, and "
          "the other member's sequence numbers stay its own") {
  served_pair p;
  auto& run = p.run;
  auto& a = p.a;
  auto& c = p.c;
  auto& peer = p.peer;
  // x holds a valid token and is admitted at a's gate.
  outsider x{a->port()};
  auto key = std::make_shared<auth::key_pair>(run.key("x"));
  auto [session, challenge] = x.open(key->peer_id());
  REQUIRE(x.present(session, hello_of(*key, challenge, a->peer_id(), run.issue("x"),
                                      [](auth::hello&) {})) == "");
  auto [ping_a, lookup_err] = x.lookup("ping");
  REQUIRE_MESSAGE(ping_a, lookup_err);
  auto context = [&](const std::string& sender) {
    messages::wire_options o;
    o.experiment = a->wire()->options().experiment;
    o.peer_id = sender;
    o.sign = [key](std::string_view digest) { return key->sign(digest); };
    return std::make_shared<messages::wire_context>(o);
  };
  auto ping_from_x = [&] {
    caf::scoped_actor self{*x.sys};
    std::string out;
    self->request(ping_a, 5s, ping_msg{1, "x"})
      .receive([&](const ping_msg& m) { out = m.wire_error.empty() ? m.origin : m.wire_error; },
               [&](caf::error& e) { out = x.sys->render(e); });
    return out;
  };
  // In its own name, signed with its own key: served.
  x.cfg->wire = context(key->peer_id());
  CHECK(ping_from_x() == "a");
  CHECK(a->wire()->refused(messages::wire_reason::signature) == 0);
  // In c's name (c is admitted too), signed with x's key, with sequence numbers above c's: the
  // signature is not c's.
  x.cfg->wire = context(c->peer_id());
  for (int i = 0; i < 3; ++i) {
    auto refused = ping_from_x();
    CHECK(refused.find("signature") != std::string::npos);
  }
  CHECK(a->wire()->refused(messages::wire_reason::signature) == 3);
  CHECK(a->wire()->refused(messages::wire_reason::replay) == 0);
  // The forgeries used up none of c's sequence numbers: c's next envelopes are served.
  CHECK(ping(*c, peer) == "a");
  CHECK(ping(*c, peer) == "a");
  CHECK(a->wire()->refused(messages::wire_reason::replay) == 0);
}

TEST_CASE("a peer whose token a newer deny list revokes has its next envelope refused as unauthorized") {
  served_pair p;
  auto& run = p.run;
  auto& a = p.a;
  auto& c = p.c;
  auto& peer = p.peer;
  // The authority revokes c's token; any node may carry the signed list to a's gate.
  auto issued = auth::read_small_file(run.dir.path + "/c.token", 64 * 1024);
  REQUIRE(issued.ok());
  auto token = auth::decode_token(*auth::parse_token_file(*issued, "c.token"));
  REQUIRE(token.ok());
  auth::deny_entry e;
  e.kind = auth::deny_entry::kind_t::token;
  e.id = token->id;
  e.reason = "left the run";
  auto list = auth::deny(run.authority, e, now_ns());
  REQUIRE(list.ok());
  auto [gate, gate_err] = try_resolve(*c, fmt::format("127.0.0.1:{}/{}", a->port(), gate_name));
  REQUIRE_MESSAGE(gate, gate_err);
  {
    caf::scoped_actor self{c->system()};
    uint64_t serial = 0;
    self->request(gate, 5s, deny_atom::value, *list)
      .receive([&](uint64_t s) { serial = s; },
               [&](caf::error& e) { FAIL("the deny list was not taken: " << c->system().render(e)); });
    CHECK(serial == 2);
  }
  auto refused = ping(*c, peer);
  CHECK(refused.find("unauthorized") != std::string::npos);
  CHECK(refused.find("revoked") != std::string::npos);
  CHECK(refused.find("left the run") != std::string::npos);
  CHECK(a->wire()->refused(messages::wire_reason::unauthorized) == 1);
  // a's gate counts the refusals by c's peer id, with the key c was admitted with and the
  // authority's reason: what a's page shows on c's ledger rows.
  auto tally = a->gate()->admission().refused_peers();
  auto it = tally.peers().find(c->peer_id());
  REQUIRE(it != tally.peers().end());
  CHECK(it->second.peer_key == c->key().public_key());
  CHECK(it->second.counts.of(auth::reason::revoked) >= 2); // the list's removal, the envelope
  CHECK(it->second.ban_reason.find("revoked: left the run") != std::string::npos);
  CHECK(tally.peers().count(p.a->peer_id()) == 0);
}

namespace {

/// Waits (at most 10 s) until `n`'s gate has the deny list of `serial` in force: the list travels
/// between gates without answers, so the test watches for its arrival.
bool has_deny_serial(node& n, uint64_t serial) {
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (n.gate()->admission().deny_serial() != serial) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::yield();
  }
  return true;
}

} // namespace

TEST_CASE("a deny list handed to one node's gate reaches every node, and a node that joins later") {
  closed_run run;
  auto a = run.start("a", false);
  auto b = run.start("b", false);
  auto c = run.start("c", false);
  // A chain: b knows a, c knows b.
  REQUIRE(b->join(fmt::format("127.0.0.1:{}", a->port()), {}).ok());
  REQUIRE(c->join(fmt::format("127.0.0.1:{}", b->port()), {}).ok());
  auto x = run.issue("x");
  auth::deny_entry e;
  e.kind = auth::deny_entry::kind_t::token;
  e.id = auth::decode_token(x)->id;
  e.reason = "key lost";
  auto list = auth::deny(run.authority, e, now_ns());
  REQUIRE(list.ok());
  auto [gate, err] = try_resolve(*c, fmt::format("127.0.0.1:{}/{}", c->port(), gate_name));
  REQUIRE_MESSAGE(gate, err);
  {
    caf::scoped_actor self{c->system()};
    self->request(gate, 5s, deny_atom::value, *list)
      .receive([&](uint64_t s) { CHECK(s == 2); },
               [&](caf::error& e) { FAIL("not taken: " << c->system().render(e)); });
    // The same list again is not newer: refused, and not passed on again.
    self->request(gate, 5s, deny_atom::value, *list)
      .receive([&](uint64_t) { FAIL("an equal serial was taken"); },
               [&](caf::error& e) { CHECK(c->system().render(e).find("not newer") != std::string::npos); });
  }
  CHECK(has_deny_serial(*b, 2));
  CHECK(has_deny_serial(*a, 2));
  auto d = run.start("d", false);
  REQUIRE(d->join(fmt::format("127.0.0.1:{}", a->port()), {}).ok());
  CHECK(has_deny_serial(*d, 2));
  // The revoked token's holder is refused by every node now.
  auto holder = node::start(testing::fast_caf(), [&] {
    node_options no;
    no.key_file = run.dir.path + "/x/node.key";
    no.authority = run.authority.dir + "/authority.pub";
    no.token = run.dir.path + "/x.token";
    no.tls = false;
    return no;
  }(), "x");
  REQUIRE(holder.ok());
  auto refused = (*holder)->join(fmt::format("127.0.0.1:{}", b->port()), {});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().what.find("refused (revoked)") != std::string::npos);
}

TEST_CASE("an admitted node may not preempt, stop or start another node's roles") {
  auto a = testing::start_node("a", "admin-run");
  auto b = testing::start_node("b", "admin-run");
  auto spawned = std::make_shared<std::atomic<int>>(0);
  actors::supervisor::child_spec c;
  c.name = "worker";
  c.spawn = [&sys = a->system(), spawned](int) {
    ++*spawned;
    return sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](stop_atom) {}}; });
  };
  auto sup = actors::supervisor::spawn_supervisor(a->system(), {c}, caf::actor{});
  a->register_actor("supervisor", sup);
  auto [remote, err] = try_resolve(*b, fmt::format("127.0.0.1:{}/supervisor", a->port()));
  REQUIRE_MESSAGE(remote, err);
  caf::scoped_actor self{b->system()};
  std::string why;
  self->request(remote, 5s, preempt_atom::value, uint64_t{0})
    .receive([] { FAIL("a preempt from another node was carried out"); },
             [&](caf::error& e) { why = b->system().render(e); });
  CHECK(why.find("refused (role_denied): 'admin.preempt'") != std::string::npos);
  why.clear();
  self->request(remote, 5s, stop_atom::value, uint64_t{0})
    .receive([] { FAIL("a stop from another node was carried out"); },
             [&](caf::error& e) { why = b->system().render(e); });
  CHECK(why.find("refused (role_denied): 'admin.stop'") != std::string::npos);
  // The child was neither preempted nor stopped: alive, spawned once.
  uint64_t alive = 0;
  {
    caf::scoped_actor own{a->system()};
    own->request(sup, 5s, status_atom::value)
      .receive([&](uint64_t n, uint64_t) { alive = n; },
               [&](caf::error& e) { FAIL(a->system().render(e)); });
  }
  CHECK(alive == 1);
  CHECK(*spawned == 1);
}

// Without TLS: with caf_openssl, an honest TLS join while 64 garbage connections are open failed
// with connection_timeout in 6 of 20 tries here (caf_openssl's handshakes), a named gap.
TEST_CASE("a flood of connections sending garbage leaves a closed node serving its members") {
  // With TLS the node's handshake comes late (a fresh SSL context per accepted connection,
  // behind the flood): CAF 0.17 then ends the member's connect as `connection_timeout` at its
  // first heartbeat tick, which the resolver tries again (5 of 10 joins failed before).
  for (bool tls : {false, true}) {
    CAPTURE(tls);
    closed_run run;
    auto a = run.start("a", tls);
    a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
    {
      std::vector<std::unique_ptr<testing::raw_socket>> flood;
      std::string garbage(1024, '\x5a');
      for (int i = 0; i < 64; ++i) {
        flood.push_back(std::make_unique<testing::raw_socket>(a->port()));
        flood.back()->write(garbage.data(), garbage.size());
      }
      // A member joins and is served while those connections are still open.
      auto b = run.start("b", tls);
      auto [peer, err] = try_resolve(*b, fmt::format("127.0.0.1:{}/ping", a->port()));
      REQUIRE_MESSAGE(peer, err);
      CHECK(ping(*b, peer) == "a");
    }
    CHECK(a->gate()->admission().admitted() == 1);
    CHECK(a->gate()->admission().refusals().total() == 0);
  }
}

namespace {

/// An actor of no interest, to stand for a directory in a claim.
caf::behavior idle_actor(caf::event_based_actor*) {
  return {[](stop_atom) {}};
}

} // namespace

TEST_CASE("an honest endpoint claim is verified and kept") {
  served_pair p;
  auto& a = p.a;
  auto& c = p.c;
  // c said hello to a with its endpoint: a's probe found c's node listening there.
  CHECK(a->gate()->claims_kept() == 1);
  CHECK(a->gate()->claims_refused() == 0);
  auto dir = a->gate()->directory_at(c->endpoint());
  REQUIRE(dir);
  CHECK(dir.node() == c->system().node());
  CHECK(dir.id() == c->directory().id());
  // a reaches c through c's connection: no second hello.
  auto joined = a->join(c->endpoint(), {});
  REQUIRE_MESSAGE(joined.ok(), (joined.ok() ? "" : joined.error().what));
  CHECK(joined->node() == c->system().node());
  CHECK(a->gate()->admission().admitted() == 1);
  CHECK(c->gate()->admission().admitted() == 1);
}

TEST_CASE("an admitted member that claims another live node's endpoint does not get it, and the refusal is counted") {
  served_pair p;
  auto& run = p.run;
  auto& a = p.a;
  // v is live and has not connected to a: nobody claimed its endpoint at a yet.
  auto v = run.start("v", false);
  v->register_actor("ping", v->system().spawn(ping_responder, std::string{"v"}));
  // x holds a valid token and claims v's endpoint, naming an actor of its own as the directory.
  outsider x{a->port()};
  auto key = run.key("x");
  auto token = run.issue("x");
  auto decoy = x.sys->spawn(idle_actor);
  auto [session, challenge] = x.open(key.peer_id());
  CHECK(x.claim(session, hello_of(key, challenge, a->peer_id(), token, [](auth::hello&) {}),
                v->endpoint(), decoy)
        == "");
  CHECK(a->gate()->claims_refused(claim_refusal::other_node) == 1);
  CHECK(a->gate()->claims_refused() == 1);
  CHECK_FALSE(a->gate()->directory_at(v->endpoint()));
  CHECK_FALSE(a->gate()->claim_pending(v->endpoint()));
  // x stays admitted.
  auto [ping_a, lookup_err] = x.lookup("ping");
  CHECK_MESSAGE(ping_a, lookup_err);
  // a's join of v's endpoint reaches v, and so does a name there.
  auto joined = a->join(v->endpoint(), {});
  REQUIRE_MESSAGE(joined.ok(), (joined.ok() ? "" : joined.error().what));
  CHECK(joined->node() == v->system().node());
  auto [at_v, why] = try_resolve(*a, v->endpoint() + "/ping");
  REQUIRE_MESSAGE(at_v, why);
  CHECK(ping(*a, at_v) == "v");
  // A kept claim is not taken over, and where no CAF node answers nothing is kept.
  auto [s2, c2] = x.open(key.peer_id());
  CHECK(x.claim(s2, hello_of(key, c2, a->peer_id(), token, [](auth::hello&) {}),
                p.c->endpoint(), decoy)
        == "");
  CHECK(a->gate()->claims_refused(claim_refusal::taken) == 1);
  CHECK(a->gate()->directory_at(p.c->endpoint()).node() == p.c->system().node());
  uint16_t silent_port = 0;
  std::string listen_err;
  int silent = actors::transfer::listen_ipv4("127.0.0.1", 0, silent_port, listen_err);
  REQUIRE_MESSAGE(silent >= 0, listen_err);
  auto [s3, c3] = x.open(key.peer_id());
  CHECK(x.claim(s3, hello_of(key, c3, a->peer_id(), token, [](auth::hello&) {}),
                fmt::format("127.0.0.1:{}", silent_port), decoy)
        == "");
  ::close(silent);
  CHECK(a->gate()->claims_refused(claim_refusal::unreachable) == 1);
  CHECK_FALSE(a->gate()->directory_at(fmt::format("127.0.0.1:{}", silent_port)));
  CHECK(a->gate()->claims_refused() == 3);
  CHECK(a->gate()->claims_kept() == 1); // c's
  caf::anon_send_exit(decoy, caf::exit_reason::user_shutdown);
}

TEST_CASE("under TLS a member's claim of another live node's endpoint is refused, and its own claim kept") {
  closed_run run;
  auto a = run.start("a", true);
  auto v = run.start("v", true);
  auto x = run.start("x", true);
  v->register_actor("ping", v->system().spawn(ping_responder, std::string{"v"}));
  // x joins a honestly: its claim is verified over TLS (the listener's certificate is x's key).
  auto [gate, err] = try_resolve(*x, fmt::format("127.0.0.1:{}/{}", a->port(), gate_name));
  REQUIRE_MESSAGE(gate, err);
  CHECK(a->gate()->claims_kept() == 1);
  CHECK(a->gate()->directory_at(x->endpoint()).node() == x->system().node());
  // Then x says hello again, claiming v's endpoint with its own directory.
  caf::scoped_actor self{x->system()};
  uint64_t session = 0;
  std::string their_challenge;
  self->request(gate, 5s, hello_atom::value, x->peer_id(), std::string(32, 'c'))
    .receive([&](uint64_t s, const std::string& ch, const std::string&) {
               session = s;
               their_challenge = ch;
             },
             [&](caf::error& e) { FAIL("the gate did not open: " << x->system().render(e)); });
  auto hello = x->gate()->admission().hello_for(their_challenge, a->peer_id());
  std::string answer = "no answer";
  self->request(gate, 5s, hello_atom::value, session, hello, caf::actor{}, v->endpoint(),
                x->directory())
    .receive([&](const std::string& line) { answer = line; },
             [&](caf::error& e) { answer = x->system().render(e); });
  CHECK(answer == "");
  CHECK(a->gate()->claims_refused(claim_refusal::other_node) == 1);
  CHECK_FALSE(a->gate()->directory_at(v->endpoint()));
  // a reaches v itself.
  auto [at_v, why] = try_resolve(*a, v->endpoint() + "/ping");
  REQUIRE_MESSAGE(at_v, why);
  CHECK(at_v.node() == v->system().node());
  CHECK(ping(*a, at_v) == "v");
}

TEST_CASE("probes of two connected TLS nodes' endpoints show their node ids and keys and leave the connection working") {
  tls_pair p;
  auto& a = p.a;
  auto& b = p.b;
  auto& run = p.run;
  // Each node probes the other's endpoint, again and again, with its own TLS settings.
  for (int i = 0; i < 5; ++i) {
    auto seen_b = probe_listener("127.0.0.1", b->port(), a->gate()->probe_settings());
    REQUIRE_MESSAGE(seen_b.ok(), (seen_b.ok() ? "" : seen_b.error().what));
    CHECK(seen_b->node == b->system().node());
    CHECK(seen_b->certified_key == run.key("b").public_key());
    auto seen_a = probe_listener("localhost", a->port(), b->gate()->probe_settings());
    REQUIRE_MESSAGE(seen_a.ok(), (seen_a.ok() ? "" : seen_a.error().what));
    CHECK(seen_a->node == a->system().node());
    CHECK(seen_a->certified_key == run.key("a").public_key());
  }
  // A probe out of time in the middle of its TLS handshake finishes it before it leaves.
  auto hasty = a->gate()->probe_settings();
  hasty.timeout = 1ms;
  for (int i = 0; i < 5; ++i)
    CHECK_FALSE(probe_listener("127.0.0.1", b->port(), hasty).ok());
  // A TLS probe of a node without TLS learns nothing (the listener's first bytes are BASP).
  // (A connection that leaves a TLS node before its handshake is done: the test below.)
  auto plain = testing::start_node("plain", "gate-run");
  auto seen_plain = probe_listener("127.0.0.1", plain->port(), a->gate()->probe_settings());
  CHECK_FALSE(seen_plain.ok());
  // The one connection between them still carries both directions.
  CHECK(ping(*b, p.at_a) == "a");
  p.check_one_connection();
}

TEST_CASE("connections that leave a TLS node before their TLS handshake leave its other connections working") {
  // caf_openssl 0.17 leaves a failed handshake's errors in its I/O thread's OpenSSL error queue,
  // where the next read of any other session found them and closed that connection (see
  // runtime/node/openssl_errors.hpp). Garbage, an HTTP request and a connection that leaves at
  // once, each twice, and the one connection between the two nodes still carries both ways.
  CHECK(openssl_errors_guarded());
  tls_pair p;
  std::string garbage(512, '\x16');
  for (int i = 0; i < 6; ++i) {
    {
      testing::raw_socket s(p.a->port());
      if (i % 3 == 0)
        s.write(garbage.data(), garbage.size());
      else if (i % 3 == 1)
        s.write("GET / HTTP/1.0\r\n\r\n", 18);
      // i % 3 == 2: connects and leaves at once
    }
    CHECK(ping(*p.b, p.at_a) == "a");
  }
  p.check_one_connection();
}

} // namespace starling::test::runtime_node_gate_test
