#include "actors/dht/node_id.hpp"

#include <sodium.h>

namespace starling::actors::dht {

node_id node_id::of_key(const std::string& key) {
  node_id r;
  crypto_generichash(r.bytes.data(), size, reinterpret_cast<const unsigned char*>(key.data()),
                     key.size(), nullptr, 0);
  return r;
}

node_id node_id::random(std::mt19937_64& rng) {
  node_id r;
  for (auto& b : r.bytes)
    b = static_cast<uint8_t>(rng() & 0xff);
  return r;
}

bool node_id::from_bytes(const std::string& raw, node_id& out) {
  if (raw.size() != size)
    return false;
  for (size_t i = 0; i < size; ++i)
    out.bytes[i] = static_cast<uint8_t>(raw[i]);
  return true;
}

std::string node_id::to_bytes() const {
  return std::string(reinterpret_cast<const char*>(bytes.data()), size);
}

std::string node_id::to_hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * size);
  for (auto b : bytes) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

node_id distance(const node_id& a, const node_id& b) {
  node_id r;
  for (size_t i = 0; i < node_id::size; ++i)
    r.bytes[i] = a.bytes[i] ^ b.bytes[i];
  return r;
}

bool closer(const node_id& target, const node_id& a, const node_id& b) {
  for (size_t i = 0; i < node_id::size; ++i) {
    auto da = a.bytes[i] ^ target.bytes[i];
    auto db = b.bytes[i] ^ target.bytes[i];
    if (da != db)
      return da < db;
  }
  return false;
}

size_t common_prefix(const node_id& a, const node_id& b) {
  for (size_t i = 0; i < node_id::size; ++i) {
    auto x = a.bytes[i] ^ b.bytes[i];
    if (x != 0) {
      size_t n = 0;
      while (!(x & 0x80)) {
        x <<= 1;
        ++n;
      }
      return i * 8 + n;
    }
  }
  return 8 * node_id::size;
}

} // namespace starling::actors::dht
