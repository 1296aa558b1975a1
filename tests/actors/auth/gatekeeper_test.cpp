#include <doctest/doctest.h>

#include <random>

#include "actors/auth/gatekeeper.hpp"

namespace starling::test::actors_gatekeeper_test {

using namespace starling::actors::auth;

namespace {

constexpr int64_t sec = 1'000'000'000;
constexpr int64_t t0 = int64_t{1'800'000'000} * sec;
constexpr uint16_t version = 2;

/// A run with an authority, one acceptor node and helpers to make peers and hellos.
struct run {
  key_pair authority = key_pair::from_test_seed(100);
  key_pair acceptor = key_pair::from_test_seed(50);
  std::mt19937_64 rng{42};
  gatekeeper gk{options()};

  gatekeeper_options options() {
    gatekeeper_options o;
    o.trust = trust_anchor{authority.public_key(), "exp"};
    o.self_key = acceptor.public_key();
    o.protocol_version = version;
    o.random = [this](uint8_t* p, size_t n) {
      for (size_t i = 0; i < n; ++i)
        p[i] = static_cast<uint8_t>(rng());
    };
    return o;
  }

  std::string token_for(const key_pair& node, std::vector<std::string> roles,
                        int64_t expires = t0 + 3600 * sec, std::string id = std::string(16, 'i')) {
    token t;
    t.id = std::move(id);
    t.peer_key = node.public_key();
    t.roles = std::move(roles);
    t.experiment = "exp";
    t.issued_at_ns = t0 - sec;
    t.expires_at_ns = expires;
    return *encode_token(t, authority);
  }

  hello hello_for(const std::string& challenge, std::string token) {
    hello h;
    h.version = version;
    h.experiment = "exp";
    h.token = std::move(token);
    h.challenge = challenge;
    h.acceptor_peer_id = acceptor.peer_id();
    h.time_ns = t0;
    return h;
  }

  /// Opens `conn` and presents a hello made by `change` from a valid one of `node`.
  template <class Change>
  checked<peer_info> connect(uint64_t conn, const key_pair& node, std::string token,
                             Change&& change) {
    auto h = hello_for(gk.open(conn), std::move(token));
    change(h);
    return gk.admit_hello(conn, make_hello(node, h), t0);
  }

  checked<peer_info> connect(uint64_t conn, const key_pair& node, std::string token) {
    return connect(conn, node, std::move(token), [](hello&) {});
  }
};

reason why(const checked<peer_info>& c) {
  REQUIRE_FALSE(c.ok());
  return c.error().why;
}

} // namespace

TEST_CASE("a node answering the challenge with its own valid token is admitted with its roles") {
  run r;
  auto node = key_pair::from_test_seed(1);
  auto p = r.connect(1, node, r.token_for(node, {"trainer"}));
  REQUIRE_MESSAGE(p.ok(), p.error().line());
  CHECK(p->peer_id == node.peer_id());
  CHECK(p->roles == std::vector<std::string>{"trainer"});
  CHECK(r.gk.admitted() == 1);
  CHECK(r.gk.check(1, "stage.forward", t0).ok());
  CHECK(r.gk.check(1, "dht.request", t0).ok());
  CHECK((*r.gk.check(1, "ping", t0))->peer_id == node.peer_id());
}

TEST_CASE("any message before the hello is refused and the connection stays refused") {
  run r;
  r.gk.open(1);
  auto c = r.gk.check(1, "dht.request", t0);
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().why == reason::no_hello);
  CHECK(c.error().line() == "refused (no_hello): the first message must be the hello, got "
                            "'dht.request'");
  auto node = key_pair::from_test_seed(1);
  auto late = r.gk.admit_hello(1, make_hello(node, r.hello_for("x", r.token_for(node, {"any"}))),
                               t0);
  CHECK(why(late) == reason::protocol_violation);
  CHECK(r.gk.check(7, "ping", t0).error().why == reason::no_hello); // never opened
  CHECK(r.gk.refusals().of(reason::no_hello) == 2);
}

TEST_CASE("hellos are refused for every bad token or binding, each counted by reason") {
  run r;
  auto node = key_pair::from_test_seed(1);
  auto other = key_pair::from_test_seed(2);
  auto good = r.token_for(node, {"trainer"});
  uint64_t conn = 10;
  CHECK(why(r.connect(++conn, node, "")) == reason::no_token);
  CHECK(why(r.connect(++conn, node, r.token_for(node, {"trainer"}, t0 - 1))) == reason::expired);
  // A token of another authority, and one whose signature was tampered with.
  auto stranger = key_pair::from_test_seed(666);
  token t = *decode_token(good);
  CHECK(why(r.connect(++conn, node, *encode_token(t, stranger))) == reason::wrong_authority);
  auto s = *unseal(good, max_token_bytes, "t");
  s.signature[0] ^= 1;
  CHECK(why(r.connect(++conn, node, pack_sealed(s))) == reason::forged);
  // Another node's valid token presented with this node's key.
  CHECK(why(r.connect(++conn, other, good)) == reason::wrong_key);
  CHECK(why(r.connect(++conn, node, good, [](hello& h) { h.experiment = "other"; }))
        == reason::foreign_experiment);
  CHECK(why(r.connect(++conn, node, good, [](hello& h) { h.version = 1; }))
        == reason::version_mismatch);
  CHECK(why(r.connect(++conn, node, good, [](hello& h) { h.time_ns = t0 + 3600 * sec; }))
        == reason::stale);
  // A hello recorded on one connection and replayed on another.
  auto h = r.hello_for(r.gk.open(++conn), good);
  auto recorded = make_hello(node, h);
  REQUIRE(r.gk.admit_hello(conn, recorded, t0).ok());
  r.gk.open(++conn);
  CHECK(why(r.gk.admit_hello(conn, recorded, t0)) == reason::wrong_challenge);
  // A hello addressed to another acceptor.
  CHECK(why(r.connect(++conn, node, good, [](hello& h) { h.acceptor_peer_id = std::string(20, 'z'); }))
        == reason::wrong_challenge);
  // A hello signed by a key other than the one it names.
  r.gk.open(++conn);
  auto forged = unseal(make_hello(node, r.hello_for("ignored-challenge-xx", good)), 8192, "h");
  auto resigned = seal(hello_domain, forged->body, other);
  CHECK(why(r.gk.admit_hello(conn, resigned, t0)) == reason::forged);
  r.gk.open(++conn);
  CHECK(why(r.gk.admit_hello(conn, "garbage!", t0)) == reason::malformed);
  auto& n = r.gk.refusals();
  CHECK(n.of(reason::no_token) == 1);
  CHECK(n.of(reason::wrong_challenge) == 2);
  CHECK(n.total() == 12);
  CHECK(n.summary().find("expired=1") != std::string::npos);
}

TEST_CASE("roles decide which messages an admitted peer may send") {
  run r;
  auto trainer = key_pair::from_test_seed(1);
  auto stage = key_pair::from_test_seed(2);
  REQUIRE(r.connect(1, trainer, r.token_for(trainer, {"trainer"})).ok());
  REQUIRE(r.connect(2, stage, r.token_for(stage, {"stage"})).ok());
  CHECK(r.gk.check(1, "stage.backward", t0).ok());
  auto denied = r.gk.check(1, "stage.state_part", t0);
  REQUIRE_FALSE(denied.ok());
  CHECK(denied.error().why == reason::role_denied);
  CHECK(denied.error().line().find("needs one of the roles stage") != std::string::npos);
  CHECK(r.gk.check(2, "stage.state_part", t0).ok());
  CHECK(r.gk.check(2, "averager.join", t0).ok());
  CHECK_FALSE(r.gk.check(1, "averager.join", t0).ok());
  CHECK_FALSE(r.gk.check(2, "stage.forward", t0).ok());
  CHECK_FALSE(r.gk.check(2, "mystery.kind", t0).ok()); // unknown kinds are refused
  // Administration only from this node or the authority, whatever the token says.
  auto any = key_pair::from_test_seed(3);
  REQUIRE(r.connect(3, any, r.token_for(any, {"any"})).ok());
  CHECK(r.gk.check(3, "stage.state", t0).ok());
  CHECK(r.gk.check(3, "admin.preempt", t0).error().why == reason::role_denied);
  REQUIRE(r.connect(4, r.authority, "").ok());
  CHECK(r.gk.check(4, "admin.preempt", t0).ok());
  REQUIRE(r.connect(5, r.acceptor, "").ok());
  CHECK(r.gk.check(5, "admin.shutdown", t0).ok());
  // Refused messages do not end the connection.
  CHECK(r.gk.check(1, "stage.forward", t0).ok());
}

TEST_CASE("a token that expires during the session ends it") {
  run r;
  auto node = key_pair::from_test_seed(1);
  REQUIRE(r.connect(1, node, r.token_for(node, {"trainer"}, t0 + 10 * sec)).ok());
  CHECK(r.gk.check(1, "stage.forward", t0 + 9 * sec).ok());
  CHECK(r.gk.check(1, "stage.forward", t0 + 10 * sec).error().why == reason::expired);
  CHECK(r.gk.check(1, "ping", t0 + 11 * sec).error().why == reason::protocol_violation);
}

TEST_CASE("a newer deny list ends revoked and banned sessions and refuses them afterwards") {
  run r;
  auto a = key_pair::from_test_seed(1);
  auto b = key_pair::from_test_seed(2);
  auto c = key_pair::from_test_seed(3);
  REQUIRE(r.connect(1, a, r.token_for(a, {"trainer"}, t0 + 3600 * sec, std::string(16, 'a'))).ok());
  REQUIRE(r.connect(2, b, r.token_for(b, {"trainer"}, t0 + 3600 * sec, std::string(16, 'b'))).ok());
  REQUIRE(r.connect(3, c, r.token_for(c, {"trainer"}, t0 + 3600 * sec, std::string(16, 'c'))).ok());
  deny_list d;
  d.experiment = "exp";
  d.serial = 2;
  d.entries.push_back({deny_entry::kind_t::token, std::string(16, 'a'), "leaked"});
  d.entries.push_back({deny_entry::kind_t::peer, b.public_key(), "cheated in round 7"});
  auto gone = r.gk.update_deny_list(*encode_deny_list(d, r.authority), t0);
  REQUIRE_MESSAGE(gone.ok(), gone.error().line());
  CHECK(*gone == std::vector<uint64_t>{1, 2});
  CHECK_FALSE(r.gk.check(1, "ping", t0).ok());
  CHECK(r.gk.check(3, "ping", t0).ok());
  // b comes back with a fresh token: still banned.
  auto again = r.connect(4, b, r.token_for(b, {"trainer"}, t0 + 3600 * sec, std::string(16, 'd')));
  CHECK(why(again) == reason::banned);
  CHECK(again.error().line().find("cheated in round 7") != std::string::npos);
  // An older or forged list changes nothing.
  d.serial = 1;
  d.entries.clear();
  CHECK_FALSE(r.gk.update_deny_list(*encode_deny_list(d, r.authority), t0).ok());
  CHECK_FALSE(r.gk.update_deny_list(*encode_deny_list(d, key_pair::from_test_seed(9)), t0).ok());
  CHECK(r.gk.current_deny_list().serial == 2);
}

TEST_CASE("an open run admits any node that answers its challenge, without administration") {
  auto self = key_pair::from_test_seed(50);
  gatekeeper_options o;
  o.trust.experiment = "demo";
  o.self_key = self.public_key();
  o.protocol_version = version;
  uint64_t counter = 0;
  o.random = [&](uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i)
      p[i] = static_cast<uint8_t>(counter++);
  };
  gatekeeper gk{o};
  auto node = key_pair::from_test_seed(1);
  hello h;
  h.version = version;
  h.experiment = "demo";
  h.challenge = gk.open(1);
  h.acceptor_peer_id = self.peer_id();
  h.time_ns = t0;
  auto p = gk.admit_hello(1, make_hello(node, h), t0);
  REQUIRE_MESSAGE(p.ok(), p.error().line());
  CHECK(gk.check(1, "stage.state", t0).ok());
  CHECK_FALSE(gk.check(1, "admin.preempt", t0).ok());
}

TEST_CASE("the same random source gives the same challenges (simulations replay)") {
  run a, b;
  CHECK(a.gk.open(1) == b.gk.open(1));
  CHECK(a.gk.open(2) != a.gk.open(3));
  CHECK(a.gk.open_connections() == 3);
  a.gk.close(2);
  CHECK(a.gk.open_connections() == 2);
}

} // namespace starling::test::actors_gatekeeper_test
