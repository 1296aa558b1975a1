// A node's admission on live connections: two nodes admit each other in one exchange, envelopes
// of senders never admitted (or no longer) are refused on arrival, roles per payload kind, expiry,
// revocation by a newer deny list, a bound on handshakes left half-open, and what a joiner
// without the run's name learns from the acceptor it refused for it.
#include <doctest/doctest.h>

#include <random>

#include "actors/auth/admission.hpp"
#include "messages/envelope.hpp"
#include "messages/types.hpp"
#include "messages/wire.hpp"
#include "messages/wire_context.hpp"

namespace starling::test::actors_admission_test {

using namespace starling;
using namespace starling::actors::auth;

namespace {

constexpr int64_t sec = 1'000'000'000;
constexpr int64_t t0 = int64_t{1'800'000'000} * sec;

/// A closed run: its authority, a shared virtual clock, and nodes with tokens.
struct run {
  key_pair authority = key_pair::from_test_seed(100);
  int64_t now = t0;
  std::mt19937_64 rng{7};

  std::string token_for(const key_pair& node, std::vector<std::string> roles,
                        int64_t expires = t0 + 3600 * sec, char id = 'i') {
    token t;
    t.id = std::string(16, id);
    t.peer_key = node.public_key();
    t.roles = std::move(roles);
    t.experiment = "exp";
    t.issued_at_ns = t0 - sec;
    t.expires_at_ns = expires;
    return *encode_token(t, authority);
  }

  /// The admission of a node with `key` and `token` (empty `authority_key`: an open run).
  std::unique_ptr<admission> node(uint64_t seed, std::string token, bool open = false,
                                  size_t max_refused_peers = 64, std::string experiment = "exp") {
    admission_options o;
    o.trust = trust_anchor{open ? std::string{} : authority.public_key(), std::move(experiment)};
    o.key = std::make_shared<const key_pair>(key_pair::from_test_seed(seed));
    o.token = std::move(token);
    o.protocol_version = messages::protocol_version;
    o.clock = [this] { return now; };
    o.random = [this](uint8_t* p, size_t n) {
      for (size_t i = 0; i < n; ++i)
        p[i] = static_cast<uint8_t>(rng());
    };
    o.max_pending = 4;
    o.max_refused_peers = max_refused_peers;
    return std::make_unique<admission>(std::move(o));
  }

  std::string deny_token(char id, uint64_t serial) {
    deny_list l;
    l.experiment = "exp";
    l.serial = serial;
    l.issued_at_ns = now;
    deny_entry e;
    e.kind = deny_entry::kind_t::token;
    e.id = std::string(16, id);
    e.reason = "left the run";
    e.added_at_ns = now;
    l.entries.push_back(e);
    return *encode_deny_list(l, authority);
  }
};

std::string allow(admission& at, const admission& from, std::string_view kind) {
  auto r = at.allow(from.peer_id(), kind);
  return r ? r->line() : std::string{};
}

} // namespace

TEST_CASE("two token holders admit each other in one exchange and then pass each message kind") {
  run r;
  auto a = r.node(1, r.token_for(key_pair::from_test_seed(1), {"trainer"}));
  auto b = r.node(2, r.token_for(key_pair::from_test_seed(2), {"any"}, t0 + 3600 * sec, 'j'));
  CHECK(allow(*b, *a, "dht.request").find("refused (no_hello)") == 0);
  REQUIRE(handshake(*a, *b).empty());
  CHECK(allow(*b, *a, "dht.request").empty());
  CHECK(allow(*b, *a, "stage.forward").empty());
  // A trainer may not download a stage's state; the holder of `any` may.
  CHECK(allow(*b, *a, "stage.state").find("refused (role_denied)") == 0);
  CHECK(allow(*a, *b, "stage.state").empty());
  // Administration only from the node itself or the authority.
  CHECK(allow(*b, *a, "admin.preempt").find("refused (role_denied)") == 0);
  CHECK(b->peer(a->peer_id())->roles == std::vector<std::string>{"trainer"});
  CHECK(b->admitted() == 1);
  CHECK(a->admitted() == 1);
  auto counts = b->refusals();
  CHECK(counts.of(reason::no_hello) == 1);
  CHECK(counts.of(reason::role_denied) == 2);
}

TEST_CASE("a node without a token, with another's token or of an open run is refused with why") {
  run r;
  auto b = r.node(2, r.token_for(key_pair::from_test_seed(2), {"any"}));
  auto bare = r.node(3, "");
  CHECK(handshake(*bare, *b).find("refused (no_token)") == 0);
  auto thief = r.node(4, r.token_for(key_pair::from_test_seed(5), {"any"}));
  CHECK(handshake(*thief, *b).find("refused (wrong_key)") == 0);
  // A member does not go on with an acceptor that cannot show a token either.
  auto open_acceptor = r.node(6, "", true);
  CHECK(handshake(*b, *open_acceptor).find("the node refused here: refused") == 0);
  CHECK(allow(*b, *bare, "ping").find("refused (no_hello)") == 0);
  // Two: the bare node's hello, and the open acceptor's hello that b checked as the connector.
  CHECK(b->refusals().of(reason::no_token) == 2);
  CHECK(b->refusals().of(reason::wrong_key) == 1);
}

TEST_CASE("a joiner without the run's name learns it, and whether the run is closed, from the "
          "acceptor it refused for it") {
  run r;
  auto joiner = r.node(3, "", true, 64, "");
  auto open_acceptor = r.node(6, "", true);
  CHECK(joiner->take_foreign_acceptor().experiment.empty());
  CHECK(handshake(*joiner, *open_acceptor)
          .find("the node refused here: refused (foreign_experiment): hello for experiment "
                "'exp'") == 0);
  auto seen = joiner->take_foreign_acceptor();
  CHECK(seen.experiment == "exp");
  CHECK_FALSE(seen.closed);
  // Taken: nothing more until another acceptor is refused for its experiment.
  CHECK(joiner->take_foreign_acceptor().experiment.empty());
  // With the name learned, both sides admit each other (an open run: a plain hello).
  auto named = r.node(3, "", true, 64, "exp");
  CHECK(handshake(*named, *open_acceptor).empty());
  CHECK(named->take_foreign_acceptor().experiment.empty());
  // A closed run's acceptor shows its token in its hello.
  auto closed = r.node(2, r.token_for(key_pair::from_test_seed(2), {"any"}));
  CHECK(handshake(*joiner, *closed).find("refused (foreign_experiment)") != std::string::npos);
  seen = joiner->take_foreign_acceptor();
  CHECK(seen.experiment == "exp");
  CHECK(seen.closed);
  // A refusal for another reason teaches nothing: the closed run refuses the named joiner's
  // hello (no token), and the joiner had admitted the acceptor.
  CHECK(handshake(*named, *closed).find("refused (no_token)") == 0);
  CHECK(named->take_foreign_acceptor().experiment.empty());
}

TEST_CASE("an admitted peer is refused once its token expires or a newer deny list revokes it") {
  run r;
  auto b = r.node(2, r.token_for(key_pair::from_test_seed(2), {"any"}));
  auto a = r.node(1, r.token_for(key_pair::from_test_seed(1), {"any"}, t0 + 60 * sec, 'a'));
  auto c = r.node(3, r.token_for(key_pair::from_test_seed(3), {"any"}, t0 + 3600 * sec, 'c'));
  REQUIRE(handshake(*a, *b).empty());
  REQUIRE(handshake(*c, *b).empty());
  r.now = t0 + 61 * sec;
  CHECK(allow(*b, *a, "ping").find("refused (expired)") == 0);
  // It stays refused, for the same reason, until it comes back with a valid hello.
  CHECK(allow(*b, *a, "ping").find("refused (expired)") == 0);
  CHECK(allow(*b, *c, "ping").empty());
  auto gone = b->update_deny_list(r.deny_token('c', 2));
  REQUIRE(gone.ok());
  CHECK(*gone == std::vector<std::string>{c->peer_id()});
  CHECK(allow(*b, *c, "ping").find("refused (revoked)") == 0);
  CHECK(b->deny_serial() == 2);
  // An older list is not taken; a revoked token cannot come back in.
  CHECK_FALSE(b->update_deny_list(r.deny_token('z', 1)).ok());
  CHECK(handshake(*c, *b).find("refused (revoked)") == 0);
}

TEST_CASE("a ban this node verified itself ends the session and refuses the key, also restarted") {
  run r;
  auto b = r.node(2, r.token_for(key_pair::from_test_seed(2), {"any"}));
  auto a = r.node(1, r.token_for(key_pair::from_test_seed(1), {"any"}, t0 + 3600 * sec, 'a'));
  auto c = r.node(3, r.token_for(key_pair::from_test_seed(3), {"any"}, t0 + 3600 * sec, 'c'));
  REQUIRE(handshake(*a, *b).empty());
  REQUIRE(handshake(*c, *b).empty());
  CHECK_FALSE(b->verified_ban(key_pair::from_test_seed(1).public_key()));
  auto gone = b->ban_verified(key_pair::from_test_seed(1).public_key(), "a wrong aggregate at step 7");
  CHECK(gone == std::vector<std::string>{a->peer_id()});
  CHECK(b->verified_ban(key_pair::from_test_seed(1).public_key()) == "a wrong aggregate at step 7");
  auto line = allow(*b, *a, "ping");
  CHECK(line.find("refused (banned)") == 0);
  CHECK(line.find("a wrong aggregate at step 7") != std::string::npos);
  CHECK(allow(*b, *c, "ping").empty()); // nobody else
  // The same key restarted, with its valid token, stays out; its token alone was never the issue.
  auto again = r.node(1, r.token_for(key_pair::from_test_seed(1), {"any"}, t0 + 3600 * sec, 'a'));
  CHECK(handshake(*again, *b).find("refused (banned)") == 0);
  CHECK(allow(*b, *again, "ping").find("refused (banned)") == 0);
  CHECK(b->refusals().of(reason::banned) >= 3);
  // Counted by peer id, with the verdict's reason (what the node's page shows on its rows).
  auto tally = b->refused_peers();
  auto banned = tally.peers().find(a->peer_id());
  REQUIRE(banned != tally.peers().end());
  CHECK(banned->second.ban_reason.find("a wrong aggregate at step 7") != std::string::npos);
  CHECK(banned->second.counts.of(reason::banned) >= 3);
  // Another node of the run did not verify it: its own gate still admits the key.
  auto d = r.node(4, r.token_for(key_pair::from_test_seed(4), {"any"}, t0 + 3600 * sec, 'd'));
  CHECK(handshake(*again, *d).empty());
}

TEST_CASE("handshakes left half-open are bounded and a hello cannot be used twice") {
  run r;
  auto b = r.node(2, "", true);
  auto a = r.node(1, "", true);
  std::vector<admission::opening> opened;
  for (int i = 0; i < 10; ++i)
    opened.push_back(b->open(std::string(32, 'x'), a->peer_id()));
  // The oldest sessions were dropped (max_pending 4): their hellos are refused.
  auto late = b->admit(opened[0].session, a->hello_for(opened[0].challenge, b->peer_id()));
  CHECK_FALSE(late.ok());
  auto hello = a->hello_for(opened[9].challenge, b->peer_id());
  CHECK(b->admit(opened[9].session, hello).ok());
  // The same hello again (a replay), and on another session (another challenge): refused.
  CHECK_FALSE(b->admit(opened[9].session, hello).ok());
  auto replay = b->admit(opened[8].session, hello);
  REQUIRE_FALSE(replay.ok());
  CHECK(replay.error().why == reason::wrong_challenge);
  // An open run admits any node that answers, with every role but administration.
  CHECK(allow(*b, *a, "stage.state").empty());
  CHECK(allow(*b, *a, "admin.preempt").find("refused (role_denied)") == 0);
}

TEST_CASE("an envelope from a sender the node has not admitted is refused as unauthorized") {
  run r;
  auto b = r.node(2, "", true);
  auto a = r.node(1, "", true);
  messages::wire_options wo;
  wo.experiment = "exp";
  wo.peer_id = b->peer_id();
  wo.require_sender = true;
  wo.clock = [&r] { return r.now; };
  wo.admit = [&b](const std::string& sender, std::string_view kind) {
    auto refused = b->allow(sender, kind);
    return refused ? refused->line() : std::string{};
  };
  messages::wire_context at_b{wo};
  messages::wire_options ao;
  ao.experiment = "exp";
  ao.peer_id = a->peer_id();
  ao.clock = [&r] { return r.now; };
  messages::wire_context at_a{ao};
  auto send = [&] {
    std::vector<char> bytes;
    REQUIRE(messages::encode_envelope(&at_a, [](messages::payload_writer& w) {
      messages::ping_msg p{1, "a"};
      return messages::wire_codec<messages::ping_msg>::write(w, p);
    }, bytes).ok());
    messages::ping_msg got;
    return messages::decode_envelope(
      bytes.data(), bytes.size(), &at_b, "ping",
      [](const messages::payload_reader& p) {
        return messages::wire_codec<messages::ping_msg>::matches(p);
      },
      [&](const messages::payload_reader& p) {
        return messages::wire_codec<messages::ping_msg>::read(p, got);
      });
  };
  auto refused = send();
  REQUIRE(refused);
  CHECK(refused->why == messages::wire_reason::unauthorized);
  CHECK(refused->line().find("no_hello") != std::string::npos);
  CHECK(at_b.refused(messages::wire_reason::unauthorized) == 1);
  REQUIRE(handshake(*a, *b).empty());
  CHECK_FALSE(send());
  CHECK(at_b.admitted() == 1);
}

TEST_CASE("refusals of a party whose key is known are counted by peer id, with the authority's "
          "reason for a revoked token or a banned key") {
  run r;
  auto b = r.node(2, r.token_for(key_pair::from_test_seed(2), {"any"}));
  auto a = r.node(1, r.token_for(key_pair::from_test_seed(1), {"trainer"}, t0 + 3600 * sec, 'a'));
  auto c = r.node(3, r.token_for(key_pair::from_test_seed(3), {"any"}, t0 + 3600 * sec, 'c'));
  auto d = r.node(4, r.token_for(key_pair::from_test_seed(4), {"any"}, t0 + 3600 * sec, 'd'));
  auto stranger = r.node(5, r.token_for(key_pair::from_test_seed(5), {"any"}, t0 + 3600 * sec, 'e'));
  REQUIRE(handshake(*a, *b).empty());
  REQUIRE(handshake(*c, *b).empty());
  // An admitted trainer asks for what its role does not allow.
  CHECK(allow(*b, *a, "admin.preempt").find("role_denied") != std::string::npos);
  // c's token is revoked: the list removes it, and its next envelopes are refused.
  REQUIRE(b->update_deny_list(r.deny_token('c', 2)).ok());
  CHECK(allow(*b, *c, "ping").find("revoked: left the run") != std::string::npos);
  CHECK(allow(*b, *c, "ping").find("refused (revoked)") == 0);
  // A sender never admitted names a peer id that proves nothing: counted by reason only.
  CHECK(allow(*b, *stranger, "ping").find("no_hello") != std::string::npos);
  // d's key is banned: its hello proves the key, and is refused.
  deny_list l;
  l.experiment = "exp";
  l.serial = 3;
  l.issued_at_ns = r.now;
  deny_entry e;
  e.kind = deny_entry::kind_t::peer;
  e.id = key_pair::from_test_seed(4).public_key();
  e.reason = "flooded the DHT";
  e.added_at_ns = r.now;
  l.entries.push_back(e);
  REQUIRE(b->update_deny_list(*encode_deny_list(l, r.authority)).ok());
  CHECK(handshake(*d, *b).find("refused (banned)") == 0);

  auto tally = b->refused_peers();
  auto& peers = tally.peers();
  CHECK(peers.size() == 3);
  REQUIRE(peers.count(a->peer_id()) == 1);
  auto& pa = peers.find(a->peer_id())->second;
  CHECK(pa.peer_key == key_pair::from_test_seed(1).public_key());
  CHECK(pa.counts.of(reason::role_denied) == 1);
  CHECK(pa.ban_reason.empty());
  REQUIRE(peers.count(c->peer_id()) == 1);
  auto& pc = peers.find(c->peer_id())->second;
  CHECK(pc.peer_key == key_pair::from_test_seed(3).public_key());
  // Removed by the list, then two envelopes.
  CHECK(pc.counts.of(reason::revoked) == 3);
  CHECK(pc.ban_reason == "this node's token " + to_hex(std::string(16, 'c')).substr(0, 12)
                           + " was revoked: left the run");
  REQUIRE(peers.count(d->peer_id()) == 1);
  auto& pd = peers.find(d->peer_id())->second;
  CHECK(pd.peer_key == key_pair::from_test_seed(4).public_key());
  CHECK(pd.counts.of(reason::banned) == 1);
  CHECK(pd.ban_reason.find("flooded the DHT") != std::string::npos);
  CHECK(peers.count(stranger->peer_id()) == 0);
  CHECK(tally.other().total() == 0);
  // Every refusal is still counted by reason.
  CHECK(b->refusals().of(reason::no_hello) == 1);
  CHECK(b->refusals().of(reason::banned) == 1);
}

TEST_CASE("the refused parties counted by peer id are bounded: the ones refused least move to "
          "other, a banned one last") {
  run r;
  auto b = r.node(2, "", true, 2);
  auto p1 = r.node(11, "", true);
  auto p2 = r.node(12, "", true);
  auto p3 = r.node(13, "", true);
  for (auto* p : {p1.get(), p2.get(), p3.get()})
    REQUIRE(handshake(*p, *b).empty());
  CHECK(allow(*b, *p1, "admin.stop").find("role_denied") != std::string::npos);
  CHECK(allow(*b, *p1, "admin.stop").find("role_denied") != std::string::npos);
  CHECK(allow(*b, *p2, "admin.stop").find("role_denied") != std::string::npos);
  CHECK(allow(*b, *p3, "admin.stop").find("role_denied") != std::string::npos);
  auto tally = b->refused_peers();
  CHECK(tally.peers().size() == 2);
  CHECK(tally.peers().count(p1->peer_id()) == 1);
  CHECK(tally.peers().count(p3->peer_id()) == 1);
  CHECK(tally.other().of(reason::role_denied) == 1);
  // A banned party outlasts one refused more often.
  peer_refusal_tally t{2};
  t.add("x", "kx", refuse(reason::banned, "banned: cheated"));
  t.add("y", "ky", refuse(reason::role_denied, "no"));
  t.add("y", "ky", refuse(reason::role_denied, "no"));
  t.add("z", "kz", refuse(reason::role_denied, "no"));
  CHECK(t.peers().count("x") == 1);
  CHECK(t.peers().count("z") == 1);
  CHECK(t.peers().find("x")->second.ban_reason == "banned: cheated");
  CHECK(t.other().of(reason::role_denied) == 2);
}

} // namespace starling::test::actors_admission_test
