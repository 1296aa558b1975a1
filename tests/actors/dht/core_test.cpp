#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "actors/dht/lookup.hpp"
#include "actors/dht/node_id.hpp"
#include "actors/dht/record_store.hpp"
#include "actors/dht/routing_table.hpp"
#include "actors/dht/signing.hpp"

namespace starling::test::actors_core_test {

using namespace starling::actors::dht;
using starling::messages::dht_record;

namespace {

dht_record plain(const std::string& key, const std::string& value, int64_t exp) {
  dht_record r;
  r.key = key;
  r.value.assign(value.begin(), value.end());
  r.expiration_ns = exp;
  return r;
}

dht_record sub(const std::string& key, const std::string& subkey, const std::string& value,
               int64_t exp) {
  auto r = plain(key, value, exp);
  r.has_subkey = true;
  r.subkey = subkey;
  return r;
}

std::string text(const dht_record& r) {
  return std::string(r.value.begin(), r.value.end());
}

} // namespace

TEST_CASE("key ids are 20-byte BLAKE2b digests and XOR distance orders peers") {
  auto a = node_id::of_key("alpha");
  CHECK(a == node_id::of_key("alpha"));
  CHECK(a != node_id::of_key("beta"));
  CHECK(a.to_hex().size() == 40);
  CHECK(a.to_hex() != node_id::of_key("").to_hex());
  node_id back;
  REQUIRE(node_id::from_bytes(a.to_bytes(), back));
  CHECK(back == a);
  CHECK_FALSE(node_id::from_bytes("short", back));
  CHECK(common_prefix(a, a) == 160);
  auto b = a;
  b.bytes[2] ^= 0x10; // differs at bit 16 + 3
  CHECK(common_prefix(a, b) == 19);
  auto c = a;
  c.bytes[0] ^= 0x80;
  CHECK(closer(a, b, c));
  CHECK_FALSE(closer(a, c, b));
  CHECK(distance(a, b).bytes[2] == 0x10);
}

TEST_CASE("the routing table splits only the bucket holding its own id and keeps k per bucket") {
  std::mt19937_64 rng{7};
  auto self = node_id::random(rng);
  routing_table t{self, routing_options{4, 2, 1}};
  int full = 0;
  for (int i = 0; i < 400; ++i) {
    auto r = t.add_or_update(node_id::random(rng), "p" + std::to_string(i), i);
    if (r.outcome == add_outcome::full) {
      ++full;
      REQUIRE(r.oldest.has_value());
    }
  }
  CHECK(t.num_buckets() > 3);
  CHECK(t.size() <= 4 * t.num_buckets());
  CHECK(full > 0);
  CHECK(t.add_or_update(self, "me", 0).outcome == add_outcome::self);
  // nearest() really returns the nearest known peers, ordered.
  auto target = node_id::random(rng);
  auto near = t.nearest(target, 5);
  REQUIRE(near.size() == 5);
  for (size_t i = 1; i < near.size(); ++i)
    CHECK(closer(target, near[i - 1].id, near[i].id));
  auto all = t.nearest(target, 100000);
  CHECK(all.size() == t.size());
  CHECK(all.front().id == near.front().id);
}

TEST_CASE("an unresponsive peer is evicted and a replacement takes its place") {
  std::mt19937_64 rng{9};
  auto self = node_id::random(rng);
  routing_table t{self, routing_options{2, 4, 2}};
  // Peers far from self (first bit flipped) all land in the same non-splittable bucket.
  auto far = [&](int salt) {
    std::mt19937_64 r2{static_cast<uint64_t>(salt)};
    auto id = node_id::random(r2);
    id.bytes[0] = static_cast<uint8_t>((self.bytes[0] ^ 0x80) & 0x80) | (id.bytes[0] & 0x7f);
    return id;
  };
  // The first add splits the root (it covers self); after that the far half is full at 2.
  auto p1 = far(1), p2 = far(2), p3 = far(3);
  CHECK(t.add_or_update(p1, "p1", 1).outcome == add_outcome::added);
  CHECK(t.add_or_update(p2, "p2", 2).outcome == add_outcome::added);
  auto r = t.add_or_update(p3, "p3", 3);
  // The root bucket covers self and splits; p3 then goes to the far bucket, which is full.
  REQUIRE(r.outcome == add_outcome::full);
  CHECK(r.oldest->id == p1);
  CHECK_FALSE(t.mark_failed(p1)); // first failure of two allowed
  CHECK(t.find(p1).has_value());
  CHECK(t.mark_failed(p1));
  CHECK_FALSE(t.find(p1).has_value());
  CHECK(t.find(p3).has_value());
  CHECK(t.evictions() == 1);
  // Hearing from a peer again makes it the most recently seen.
  CHECK(t.add_or_update(p2, "p2b", 4).outcome == add_outcome::updated);
  CHECK(t.find(p2)->address == "p2b");
}

TEST_CASE("a store with an older expiration is rejected and expired records are never returned") {
  record_store s;
  CHECK(s.put(plain("k", "v1", 100), 0) == store_status::accepted);
  CHECK(s.put(plain("k", "v0", 50), 0) == store_status::older);
  CHECK(text(s.get("k", 0).at(0)) == "v1");
  CHECK(s.put(plain("k", "v2", 200), 0) == store_status::accepted);
  CHECK(text(s.get("k", 99).at(0)) == "v2");
  CHECK(s.put(plain("k", "late", 150), 160) == store_status::expired);
  CHECK(s.get("k", 200).empty());
  CHECK(s.get("k", 199).size() == 1);
  CHECK(s.counters().older == 1);
  CHECK(s.counters().expired == 1);
  // Once the held record expired, an older-than-it-was record is fine again.
  CHECK(s.put(plain("k", "v3", 300), 250) == store_status::accepted);
  CHECK(text(s.get("k", 250).at(0)) == "v3");
}

TEST_CASE("dictionary sub-keys merge and expire independently") {
  record_store s;
  CHECK(s.put(sub("stage0", "peerA", "a", 100), 0) == store_status::accepted);
  CHECK(s.put(sub("stage0", "peerB", "b", 200), 0) == store_status::accepted);
  CHECK(s.put(sub("stage0", "peerA", "a-old", 90), 0) == store_status::older);
  CHECK(s.get("stage0", 0).size() == 2);
  auto later = s.get("stage0", 150);
  REQUIRE(later.size() == 1);
  CHECK(later[0].subkey == "peerB");
  // A plain value with an earlier expiration than the dictionary's latest sub-key loses...
  CHECK(s.put(plain("stage0", "flat", 150), 0) == store_status::older);
  // ...and one with a later expiration replaces it.
  CHECK(s.put(plain("stage0", "flat", 300), 0) == store_status::accepted);
  auto now = s.get("stage0", 0);
  REQUIRE(now.size() == 1);
  CHECK_FALSE(now[0].has_subkey);
  CHECK(s.size() == 1);
}

TEST_CASE("record size and record count limits are enforced and counted") {
  record_store s{store_limits{16, 2}};
  CHECK(s.put(plain("k", std::string(20, 'x'), 10), 0) == store_status::too_large);
  CHECK(s.put(plain("a", "1", 10), 0) == store_status::accepted);
  CHECK(s.put(sub("b", "s", "2", 20), 0) == store_status::accepted);
  CHECK(s.put(sub("b", "t", "3", 20), 0) == store_status::full);
  CHECK(s.put(plain("c", "4", 20), 0) == store_status::full);
  // Replacing a held record needs no extra room.
  CHECK(s.put(plain("a", "5", 15), 0) == store_status::accepted);
  // Expired records make room.
  CHECK(s.put(plain("c", "6", 30), 16) == store_status::accepted);
  CHECK(s.counters().too_large == 1);
  CHECK(s.counters().full == 2);
}

TEST_CASE("an owned key accepts only records signed by its owner") {
  auto alice = identity::from_seed(1);
  auto mallory = identity::from_seed(2);
  CHECK(alice.public_key.size() == 32);
  CHECK(alice.public_key != mallory.public_key);
  auto key = "ban-list" + owner_marker(alice.public_key);
  CHECK(owner_of(key) == alice.public_key);
  record_store s;
  auto unsigned_rec = plain(key, "forged", 100);
  CHECK(s.put(unsigned_rec, 0) == store_status::bad_signature);
  auto forged = plain(key, "forged", 100);
  sign(forged, mallory);
  CHECK(s.put(forged, 0) == store_status::bad_signature);
  auto good = plain(key, "real", 100);
  sign(good, alice);
  CHECK(verify(good));
  CHECK(s.put(good, 0) == store_status::accepted);
  // A signature does not carry over to other contents.
  auto tampered = good;
  tampered.value.push_back('!');
  CHECK_FALSE(verify(tampered));
  auto later = good;
  later.expiration_ns = 200;
  CHECK_FALSE(verify(later));
  CHECK(s.counters().bad_signature == 2);
  // Owned sub-keys of a shared key.
  auto rec = sub("peers", owner_marker(mallory.public_key), "m", 100);
  sign(rec, alice);
  CHECK(s.put(rec, 0) == store_status::bad_signature);
  sign(rec, mallory);
  CHECK(s.put(rec, 0) == store_status::accepted);
  // A malformed marker makes the key unwritable rather than free.
  auto bad = plain("x[owner:zz]", "v", 100);
  sign(bad, alice);
  CHECK_FALSE(verify(bad));
}

TEST_CASE("a banned signer's records are dropped, refused and counted; others stay") {
  auto alice = identity::from_seed(1);
  auto mallory = identity::from_seed(2);
  record_store s;
  auto own = [](const std::string& key, const identity& who, const std::string& v, int64_t exp) {
    auto r = plain(key + owner_marker(who.public_key), v, exp);
    sign(r, who);
    return r;
  };
  auto in_dict = [](const std::string& key, const identity& who, const std::string& v) {
    auto r = sub(key, owner_marker(who.public_key), v, 100);
    sign(r, who);
    return r;
  };
  REQUIRE(s.put(own("a", alice, "1", 100), 0) == store_status::accepted);
  REQUIRE(s.put(own("m", mallory, "2", 100), 0) == store_status::accepted);
  REQUIRE(s.put(in_dict("progress", alice, "a"), 0) == store_status::accepted);
  REQUIRE(s.put(in_dict("progress", mallory, "m"), 0) == store_status::accepted);
  REQUIRE(s.put(in_dict("only-m", mallory, "m"), 0) == store_status::accepted);
  REQUIRE(s.put(plain("free", "v", 100), 0) == store_status::accepted);
  CHECK(s.size() == 6);
  CHECK(s.ban_signer(mallory.public_key) == 3);
  CHECK(s.ban_signer(mallory.public_key) == 0); // once
  CHECK(s.size() == 3);
  CHECK(s.get("m" + owner_marker(mallory.public_key), 0).empty());
  CHECK(s.get("only-m", 0).empty());
  auto progress = s.get("progress", 0);
  REQUIRE(progress.size() == 1);
  CHECK(std::string(progress[0].value.begin(), progress[0].value.end()) == "a");
  CHECK(s.get("a" + owner_marker(alice.public_key), 0).size() == 1);
  CHECK(s.get("free", 0).size() == 1); // unsigned records name no signer to ban
  // Later writes, even newer ones, are refused and counted.
  CHECK(s.put(own("m", mallory, "3", 200), 0) == store_status::banned);
  CHECK(s.put(in_dict("progress", mallory, "m2"), 0) == store_status::banned);
  CHECK(s.counters().banned == 2);
  CHECK(s.signer_banned(own("x", mallory, "y", 100)));
  CHECK_FALSE(s.signer_banned(own("x", alice, "y", 100)));
  CHECK(s.put(own("a", alice, "4", 200), 0) == store_status::accepted);
}

TEST_CASE("a signature verified once vouches for exactly that record, never for a variant") {
  auto alice = identity::from_seed(11);
  auto mallory = identity::from_seed(12);
  auto key = "progress" + owner_marker(alice.public_key);
  auto good = plain(key, "step 7", 500);
  sign(good, alice);
  // Verified twice: the second answer comes from the process's cache of good signatures.
  CHECK(verify(good));
  CHECK(verify(good));
  // Every field of the record, and the signature itself, still decides.
  auto v = good;
  v.value.back() = '8';
  CHECK_FALSE(verify(v));
  v = good;
  v.expiration_ns += 1;
  CHECK_FALSE(verify(v));
  v = good;
  v.key = "progress" + owner_marker(mallory.public_key);
  CHECK_FALSE(verify(v));
  v = good;
  v.signature[0] = static_cast<char>(v.signature[0] ^ 1);
  CHECK_FALSE(verify(v));
  // The same contents signed by someone else under alice's key: still refused after alice's
  // signature of them was cached.
  v = good;
  sign(v, mallory);
  CHECK_FALSE(verify(v));
  CHECK(verify(good));
}

TEST_CASE("the lookup keeps alpha requests in flight and converges on the k closest") {
  std::mt19937_64 rng{3};
  // A static network of 300 peers where everyone knows everyone: a response names the k
  // closest peers to the target that the responder knows.
  std::vector<node_id> peers;
  for (int i = 0; i < 300; ++i)
    peers.push_back(node_id::random(rng));
  auto self = node_id::random(rng);
  auto target = node_id::random(rng);
  auto sorted = peers;
  std::sort(sorted.begin(), sorted.end(),
            [&](const node_id& a, const node_id& b) { return closer(target, a, b); });
  lookup l{target, self, lookup_options{8, 3}};
  // Start from 8 arbitrary peers; peer i's answer lists 8 peers from a random half of the network.
  for (int i = 0; i < 8; ++i)
    l.add(peers[static_cast<size_t>(i)], "a", 1);
  size_t max_in_flight = 0;
  int rounds = 0;
  while (!l.done() && rounds < 1000) {
    auto batch = l.next();
    max_in_flight = std::max(max_in_flight, l.in_flight());
    for (auto& c : batch) {
      std::vector<std::pair<node_id, std::string>> answer;
      // A responder knows the peers whose hash parity matches its own first byte's parity,
      // plus the true nearest ones with a probability.
      for (auto& p : sorted) {
        if (answer.size() >= 8)
          break;
        if ((p.bytes[1] & 1) == (c.id.bytes[1] & 1) || (rng() % 3 == 0))
          answer.emplace_back(p, "a");
      }
      if (c.id.bytes[0] % 10 == 0)
        l.on_failure(c.id);
      else
        l.on_response(c.id, answer);
    }
    ++rounds;
  }
  REQUIRE(l.done());
  CHECK(max_in_flight <= 3);
  CHECK(max_in_flight >= 1);
  auto best = l.closest_responded(8);
  REQUIRE_FALSE(best.empty());
  // The true nearest peer is found unless it failed.
  if (sorted[0].bytes[0] % 10 != 0)
    CHECK(best[0].id == sorted[0]);
  for (size_t i = 1; i < best.size(); ++i)
    CHECK(closer(target, best[i - 1].id, best[i].id));
  CHECK(l.hops() >= 2);
  CHECK(l.next().empty());
}

} // namespace starling::test::actors_core_test
