// Envelopes without CAF: the header a sender stamps, and every reason a receiver refuses one for,
// each counted; the replay window per sender.
#include <doctest/doctest.h>

#include <capnp/message.h>
#include <sodium.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "messages/averager.hpp"
#include "messages/dht.hpp"
#include "messages/envelope.hpp"
#include "messages/types.hpp"
#include "messages/wire.hpp"
#include "messages/wire_context.hpp"

namespace starling::test::messages_envelope_test {

using namespace starling;
using namespace starling::messages;

namespace {

constexpr int64_t sec = 1'000'000'000;

/// A context of experiment `exp` for peer `id` whose clock reads `*now`.
std::shared_ptr<wire_context> make_ctx(const std::string& exp, char id, const int64_t* now) {
  wire_options o;
  o.experiment = exp;
  o.peer_id = std::string(20, id);
  o.clock = [now] { return *now; };
  return std::make_shared<wire_context>(o);
}

template <class T>
std::vector<char> encode(wire_context* ctx, const T& x) {
  std::vector<char> out;
  auto st = encode_envelope(ctx, [&](payload_writer& w) { return wire_codec<T>::write(w, x); },
                            out);
  REQUIRE_MESSAGE(st.ok(), st.what());
  return out;
}

template <class T>
std::optional<wire_refusal> decode(wire_context* ctx, const std::vector<char>& bytes, T& x) {
  return decode_envelope(
    bytes.data(), bytes.size(), ctx, wire_codec<T>::name,
    [](const payload_reader& p) { return wire_codec<T>::matches(p); },
    [&](const payload_reader& p) { return wire_codec<T>::read(p, x); });
}

} // namespace

TEST_CASE("an envelope carries the sender's header and is admitted once") {
  int64_t now = 1000 * sec;
  auto a = make_ctx("exp", 'a', &now);
  auto b = make_ctx("exp", 'b', &now);
  auto bytes = encode(a.get(), ping_msg{7, "node-a"});
  ping_msg got;
  auto r = decode(b.get(), bytes, got);
  REQUIRE_FALSE(r);
  CHECK(got.seq == 7);
  CHECK(got.origin == "node-a");
  CHECK(b->admitted() == 1);
  // The same bytes again: a replay.
  auto again = decode(b.get(), bytes, got);
  REQUIRE(again);
  CHECK(again->why == wire_reason::replay);
  CHECK(b->refused(wire_reason::replay) == 1);
  CHECK(again->line().rfind("envelope refused (replay): ", 0) == 0);
  // The next envelope from a has the next sequence number and is admitted.
  CHECK_FALSE(decode(b.get(), encode(a.get(), ping_msg{8, "node-a"}), got));
  CHECK(b->summary() == "replay=1");
}

TEST_CASE("envelopes of another experiment or version, or sent too far in time, are refused") {
  int64_t now = 1000 * sec;
  int64_t skewed = now + 301 * sec;
  auto b = make_ctx("exp", 'b', &now);
  ping_msg got;
  auto other_run = make_ctx("other", 'a', &now);
  auto r = decode(b.get(), encode(other_run.get(), ping_msg{1, "x"}), got);
  REQUIRE(r);
  CHECK(r->why == wire_reason::experiment);
  CHECK(r->detail.find("'other'") != std::string::npos);

  auto fast_clock = make_ctx("exp", 'c', &skewed);
  r = decode(b.get(), encode(fast_clock.get(), ping_msg{1, "x"}), got);
  REQUIRE(r);
  CHECK(r->why == wire_reason::stale);

  capnp::MallocMessageBuilder msg;
  auto env = msg.initRoot<wire::Envelope>();
  env.setProtocolVersion(protocol_version + 1);
  env.setExperimentId("exp");
  env.getPayload().initPing();
  std::vector<char> bytes;
  write_flat(msg, bytes);
  r = decode(b.get(), bytes, got);
  REQUIRE(r);
  CHECK(r->why == wire_reason::version);
  CHECK(r->detail.find("this node speaks " + std::to_string(protocol_version))
        != std::string::npos);
  CHECK(b->refused_total() == 3);
}

TEST_CASE("a payload of another kind, or a field out of range, is refused by reason") {
  int64_t now = 1000 * sec;
  auto a = make_ctx("exp", 'a', &now);
  auto b = make_ctx("exp", 'b', &now);
  dht_request req;
  auto r = decode(b.get(), encode(a.get(), ping_msg{1, "x"}), req);
  REQUIRE(r);
  CHECK(r->why == wire_reason::wrong_payload);
  CHECK(r->detail == "carries ping, expected dht.request");

  req.kind = 9; // not an RPC
  r = decode(b.get(), encode(a.get(), req), req);
  REQUIRE(r);
  CHECK(r->why == wire_reason::out_of_range);
  CHECK(r->detail.find("request kind is 9") != std::string::npos);

  dht_record rec;
  rec.signature = "short";
  dht_record got;
  r = decode(b.get(), encode(a.get(), rec), got);
  REQUIRE(r);
  CHECK(r->why == wire_reason::out_of_range);
  // A round report's received weights: one per member at most, each -1 or a finite weight >= 0
  // (the contribution ledger credits peers from them).
  average_result ar;
  ar.report.members = {member_info{"a", 1, false}, member_info{"b", 1, false}};
  average_result got_ar;
  for (auto bad : {std::vector<double>{1, 2, 3}, std::vector<double>{-2, 1},
                   std::vector<double>{std::nan(""), 1}}) {
    ar.report.received = bad;
    r = decode(b.get(), encode(a.get(), ar), got_ar);
    REQUIRE(r);
    CHECK(r->why == wire_reason::out_of_range);
  }
  ar.report.received = {-1, 4};
  CHECK_FALSE(decode(b.get(), encode(a.get(), ar), got_ar));
  CHECK(got_ar.report.received == (std::vector<double>{-1, 4}));
  CHECK(b->refused(wire_reason::out_of_range) == 5);
  CHECK(b->refused(wire_reason::wrong_payload) == 1);
}

TEST_CASE("garbage, truncated and oversized envelopes are refused, never crash") {
  int64_t now = 1000 * sec;
  auto a = make_ctx("exp", 'a', &now);
  wire_options small;
  small.experiment = "exp";
  small.max_envelope_bytes = 64;
  small.clock = [&] { return now; };
  wire_context b{small};
  ping_msg got;
  std::vector<char> garbage(40, '\x7f');
  CHECK(decode(&b, garbage, got)->why == wire_reason::malformed);
  auto bytes = encode(a.get(), ping_msg{1, std::string(100, 'x')});
  CHECK(decode(&b, bytes, got)->why == wire_reason::too_large);
  bytes.resize(56);
  CHECK(decode(&b, bytes, got)->why == wire_reason::malformed);
  CHECK(decode(&b, std::vector<char>{}, got)->why == wire_reason::malformed);
  CHECK(b.refused(wire_reason::malformed) == 3);
}

TEST_CASE("a run that requires senders refuses envelopes without one, and without a context "
          "only structure is checked") {
  int64_t now = 1000 * sec;
  wire_options o;
  o.experiment = "exp";
  o.require_sender = true;
  o.clock = [&] { return now; };
  wire_context strict{o};
  wire_options no_id;
  no_id.experiment = "exp";
  no_id.clock = [&] { return now; };
  wire_context anonymous_sender{no_id};
  ping_msg got;
  auto anonymous = encode<ping_msg>(&anonymous_sender, ping_msg{1, "x"});
  CHECK(decode(&strict, anonymous, got)->why == wire_reason::sender);
  // Without a context: no experiment, clock or replay checks.
  auto bare = encode<ping_msg>(nullptr, ping_msg{1, "x"});
  CHECK_FALSE(decode<ping_msg>(nullptr, bare, got));
  CHECK_FALSE(decode<ping_msg>(nullptr, bare, got));
}

TEST_CASE("the replay window takes reordered numbers once and refuses those below it") {
  int64_t now = 0;
  wire_options o;
  o.replay_window = 128;
  o.clock = [&] { return now; };
  wire_context ctx{o};
  envelope_header h;
  h.sender = std::string(20, 's');
  wire_refusal why;
  auto take = [&](uint64_t seq) {
    h.sequence = seq;
    return ctx.record(h, why);
  };
  CHECK(take(1000));
  CHECK(take(1002));
  CHECK(take(1001)); // late but new
  CHECK_FALSE(take(1001));
  CHECK(take(1100));
  CHECK(take(1010)); // within the window (1100 - 127 .. 1100), unseen
  CHECK_FALSE(take(1002)); // remembered across the shift
  CHECK(take(1300));
  CHECK_FALSE(take(1100)); // below the window now
  CHECK(why.why == wire_reason::replay);
  CHECK(take(1299));
  CHECK_FALSE(take(1300));
  // Another sender has its own window; senders without an id are not tracked.
  h.sender = std::string(20, 't');
  CHECK(take(1));
  h.sender.clear();
  CHECK(take(1));
  CHECK(take(1));
}

TEST_CASE("a sender's sequence numbers start at its clock and increase") {
  int64_t now = 5 * sec;
  auto a = make_ctx("exp", 'a', &now);
  auto [s1, t1] = a->stamp();
  auto [s2, t2] = a->stamp();
  CHECK(s1 == static_cast<uint64_t>(5 * sec));
  CHECK(s2 == s1 + 1);
  CHECK(t1 == now);
  // A restart later starts above everything the old incarnation sent.
  now = 6 * sec;
  auto restarted = make_ctx("exp", 'a', &now);
  CHECK(restarted->stamp().first > s2);
}

TEST_CASE("check_payload decodes torch-free payloads and refuses bad fields") {
  int64_t now = 0;
  auto a = make_ctx("exp", 'a', &now);
  dht_response resp;
  resp.accepted = {1, 0, 2};
  auto bytes = encode(a.get(), resp);
  auto st = read_flat(bytes.data(), bytes.size(), [](capnp::MessageReader& r) {
    return check_payload(payload_reader{r.getRoot<wire::Envelope>().getPayload()});
  });
  CHECK_FALSE(st.ok());
  CHECK(st.what().find("accepted flag") != std::string::npos);
  resp.accepted = {1, 0};
  bytes = encode(a.get(), resp);
  st = read_flat(bytes.data(), bytes.size(), [](capnp::MessageReader& r) {
    return check_payload(payload_reader{r.getRoot<wire::Envelope>().getPayload()});
  });
  CHECK(st.ok());
}

namespace {

/// An Ed25519 key pair (libsodium), for signed envelopes.
struct signer {
  unsigned char pk[crypto_sign_PUBLICKEYBYTES];
  unsigned char sk[crypto_sign_SECRETKEYBYTES];
  explicit signer(unsigned char seed_byte) {
    REQUIRE(sodium_init() >= 0);
    unsigned char seed[crypto_sign_SEEDBYTES];
    std::fill(std::begin(seed), std::end(seed), seed_byte);
    crypto_sign_seed_keypair(pk, sk, seed);
  }
  std::string sign(std::string_view digest) const {
    std::string sig(crypto_sign_BYTES, '\0');
    crypto_sign_detached(reinterpret_cast<unsigned char*>(sig.data()), nullptr,
                         reinterpret_cast<const unsigned char*>(digest.data()), digest.size(), sk);
    return sig;
  }
  std::string public_key() const { return std::string(reinterpret_cast<const char*>(pk), sizeof pk); }
};

/// A context that claims peer id `id` and signs with `key` (null: unsigned).
std::shared_ptr<wire_context> signing_ctx(char id, const signer* key, const int64_t* now) {
  wire_options o;
  o.experiment = "exp";
  o.peer_id = std::string(20, id);
  o.clock = [now] { return *now; };
  if (key)
    o.sign = [key](std::string_view digest) { return key->sign(digest); };
  return std::make_shared<wire_context>(o);
}

} // namespace

TEST_CASE("signed envelopes: a member cannot speak for another, a changed byte is caught") {
  int64_t now = 1000 * sec;
  signer alice{1}, mallory{2};
  std::map<std::string, std::string> admitted{{std::string(20, 'a'), alice.public_key()},
                                              {std::string(20, 'm'), mallory.public_key()}};
  wire_options o;
  o.experiment = "exp";
  o.peer_id = std::string(20, 'b');
  o.clock = [&] { return now; };
  o.require_signature = true;
  o.verify = [&](const std::string& sender, std::string_view digest, std::string_view sig) {
    auto k = admitted.find(sender);
    if (k == admitted.end())
      return std::string{"not admitted"};
    bool ok = sig.size() == crypto_sign_BYTES && digest.size() == envelope_digest_bytes
              && crypto_sign_verify_detached(
                   reinterpret_cast<const unsigned char*>(sig.data()),
                   reinterpret_cast<const unsigned char*>(digest.data()), digest.size(),
                   reinterpret_cast<const unsigned char*>(k->second.data()))
                   == 0;
    return ok ? std::string{} : std::string{"not the sender's signature"};
  };
  wire_context bob{o};
  auto a = signing_ctx('a', &alice, &now);
  // Mallory, a member, puts Alice's peer id on envelopes she signs with her own key; both
  // contexts start their sequence numbers at the same clock reading.
  auto forger = signing_ctx('a', &mallory, &now);
  ping_msg got;
  auto forged = encode(forger.get(), ping_msg{1, "node-a"});
  auto honest = encode(a.get(), ping_msg{1, "node-a"});
  CHECK(honest.size() % 8 == 0);
  auto r = decode(&bob, forged, got);
  REQUIRE(r);
  CHECK(r->why == wire_reason::signature);
  CHECK(r->line().rfind("envelope refused (signature): not the sender's signature", 0) == 0);
  // The forgery used up none of Alice's sequence numbers: her envelope with the same one passes.
  CHECK_FALSE(decode(&bob, honest, got));
  CHECK(got.origin == "node-a");
  // Bytes changed on the way: "node-a" becomes "node-x" in Alice's next envelope.
  auto next = encode(a.get(), ping_msg{2, "node-a"});
  std::string text{"node-a"};
  auto at = std::search(next.begin(), next.end(), text.begin(), text.end());
  REQUIRE(at != next.end());
  *(at + 5) = 'x';
  r = decode(&bob, next, got);
  REQUIRE(r);
  CHECK(r->why == wire_reason::signature);
  // An unsigned envelope where the run requires signatures.
  auto bare = signing_ctx('a', nullptr, &now);
  r = decode(&bob, encode(bare.get(), ping_msg{3, "node-a"}), got);
  REQUIRE(r);
  CHECK(r->why == wire_reason::signature);
  CHECK(r->detail.find("unsigned") != std::string::npos);
  // A ragged trailer (63 bytes after the message) is no signature: malformed.
  auto ragged = encode(a.get(), ping_msg{4, "node-a"});
  ragged.resize(ragged.size() - 1);
  CHECK(decode(&bob, ragged, got)->why == wire_reason::malformed);
  // Mallory signing as herself is admitted.
  auto m = signing_ctx('m', &mallory, &now);
  CHECK_FALSE(decode(&bob, encode(m.get(), ping_msg{5, "node-m"}), got));
  CHECK(bob.refused(wire_reason::signature) == 3);
  CHECK(bob.admitted() == 2);
  // A receiver that checks no signatures (an open run) reads a signed envelope as any other.
  auto open = make_ctx("exp", 'c', &now);
  CHECK_FALSE(decode(open.get(), encode(a.get(), ping_msg{6, "node-a"}), got));
  CHECK(got.seq == 6);
  CHECK_FALSE(decode<ping_msg>(nullptr, encode(a.get(), ping_msg{7, "node-a"}), got));
}

} // namespace starling::test::messages_envelope_test
