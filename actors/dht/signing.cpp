#include "actors/dht/signing.hpp"

#include <sodium.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_set>

namespace starling::actors::dht {

namespace {

constexpr const char* marker_prefix = "[owner:";

void append_field(std::string& out, const char* data, size_t n) {
  auto len = static_cast<uint64_t>(n);
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out.append(data, n);
}

/// Length-prefixed fields, so that no two distinct records share a payload.
std::string payload(const messages::dht_record& r) {
  std::string out = "starling.dht.v1";
  append_field(out, r.key.data(), r.key.size());
  out.push_back(r.has_subkey ? 1 : 0);
  append_field(out, r.subkey.data(), r.subkey.size());
  append_field(out, r.value.data(), r.value.size());
  auto e = static_cast<uint64_t>(r.expiration_ns);
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((e >> (8 * i)) & 0xff));
  return out;
}

int unhex(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

} // namespace

identity identity::from_seed(uint64_t seed) {
  unsigned char s[crypto_sign_SEEDBYTES] = {};
  unsigned char in[8];
  for (int i = 0; i < 8; ++i)
    in[i] = static_cast<unsigned char>((seed >> (8 * i)) & 0xff);
  crypto_generichash(s, sizeof(s), in, sizeof(in), nullptr, 0);
  unsigned char pk[crypto_sign_PUBLICKEYBYTES];
  unsigned char sk[crypto_sign_SECRETKEYBYTES];
  crypto_sign_seed_keypair(pk, sk, s);
  return {std::string(reinterpret_cast<char*>(pk), sizeof(pk)),
          std::string(reinterpret_cast<char*>(sk), sizeof(sk))};
}

identity identity::generate() {
  unsigned char pk[crypto_sign_PUBLICKEYBYTES];
  unsigned char sk[crypto_sign_SECRETKEYBYTES];
  crypto_sign_keypair(pk, sk);
  return {std::string(reinterpret_cast<char*>(pk), sizeof(pk)),
          std::string(reinterpret_cast<char*>(sk), sizeof(sk))};
}

std::string owner_marker(const std::string& public_key) {
  static const char* digits = "0123456789abcdef";
  std::string s = marker_prefix;
  for (unsigned char c : public_key) {
    s.push_back(digits[c >> 4]);
    s.push_back(digits[c & 15]);
  }
  s.push_back(']');
  return s;
}

std::optional<std::string> owner_of(const std::string& text) {
  auto pos = text.find(marker_prefix);
  if (pos == std::string::npos)
    return std::nullopt;
  auto start = pos + std::strlen(marker_prefix);
  constexpr size_t hex_len = 2 * crypto_sign_PUBLICKEYBYTES;
  // A malformed marker still marks the key as owned, by a key nobody has: it cannot be written.
  if (text.size() < start + hex_len + 1 || text[start + hex_len] != ']')
    return std::string{};
  std::string pk;
  for (size_t i = 0; i < hex_len; i += 2) {
    auto hi = unhex(text[start + i]);
    auto lo = unhex(text[start + i + 1]);
    if (hi < 0 || lo < 0)
      return std::string{};
    pk.push_back(static_cast<char>(hi * 16 + lo));
  }
  return pk;
}

std::optional<std::string> required_signer(const messages::dht_record& r) {
  if (auto k = owner_of(r.key))
    return k;
  if (r.has_subkey)
    return owner_of(r.subkey);
  return std::nullopt;
}

void sign(messages::dht_record& r, const identity& id) {
  auto msg = payload(r);
  unsigned char sig[crypto_sign_BYTES];
  crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
                       reinterpret_cast<const unsigned char*>(id.secret_key.data()));
  r.signature.assign(reinterpret_cast<char*>(sig), sizeof(sig));
}

namespace {

/// Signatures this process has already checked and found good, keyed by (signer, signature,
/// BLAKE2b-256 of the signed payload). A record is read many times (every lookup of a progress
/// key returns every peer's sub-key record from several replicas), and Ed25519 verification
/// costs ~50 µs where the digest costs well under 1 µs: 64 simulated dedloc peers spent a third
/// of their CPU time re-verifying the same records. Only successes are kept (a bad signature
/// costs its sender as much as us), in a bounded FIFO.
class verified_cache {
public:
  static constexpr size_t capacity = 1 << 15;

  bool contains(const std::string& k) {
    std::lock_guard<std::mutex> g{mu_};
    return set_.count(k) > 0;
  }

  void insert(std::string k) {
    std::lock_guard<std::mutex> g{mu_};
    if (!set_.insert(k).second)
      return;
    order_.push_back(std::move(k));
    if (order_.size() > capacity) {
      set_.erase(order_.front());
      order_.pop_front();
    }
  }

private:
  std::mutex mu_;
  std::unordered_set<std::string> set_;
  std::deque<std::string> order_;
};

verified_cache& verified() {
  static verified_cache c;
  return c;
}

} // namespace

bool verify(const messages::dht_record& r) {
  auto signer = required_signer(r);
  if (!signer)
    return true;
  if (signer->size() != crypto_sign_PUBLICKEYBYTES || r.signature.size() != crypto_sign_BYTES)
    return false;
  auto msg = payload(r);
  std::string key = *signer + r.signature;
  unsigned char h[32];
  crypto_generichash(h, sizeof(h), reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
                     nullptr, 0);
  key.append(reinterpret_cast<const char*>(h), sizeof(h));
  if (verified().contains(key))
    return true;
  bool ok = crypto_sign_verify_detached(reinterpret_cast<const unsigned char*>(r.signature.data()),
                                        reinterpret_cast<const unsigned char*>(msg.data()),
                                        msg.size(),
                                        reinterpret_cast<const unsigned char*>(signer->data())) == 0;
  if (ok)
    verified().insert(std::move(key));
  return ok;
}

} // namespace starling::actors::dht
