// Little-endian fixed-width fields for the BTARD encodings (digest inputs, signed statements):
// appended to a string, and read back with bounds checks. Internal to actors/btard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace starling::actors::btard::detail {

/// Appends the `bytes` low bytes of `v`, least significant first.
inline void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

/// Appends `v` as 8 little-endian bytes.
inline void put_u64(std::string& out, uint64_t v) {
  put_le(out, v, 8);
}

/// Appends the bit pattern of `v` as 8 little-endian bytes.
inline void put_f64(std::string& out, double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  put_u64(out, bits);
}

/// Reads fields from the front of a byte string; every read checks that the bytes are there.
class reader {
public:
  explicit reader(std::string_view bytes) : rest_(bytes) {}

  /// Bytes not read yet.
  size_t left() const noexcept { return rest_.size(); }

  /// Reads a `bytes`-byte little-endian number; false when fewer bytes are left.
  bool le(uint64_t& v, int bytes) {
    if (rest_.size() < static_cast<size_t>(bytes))
      return false;
    v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(rest_[i])) << (8 * i);
    rest_.remove_prefix(static_cast<size_t>(bytes));
    return true;
  }

  /// Reads an fp64 bit pattern.
  bool f64(double& v) {
    uint64_t bits = 0;
    if (!le(bits, 8))
      return false;
    std::memcpy(&v, &bits, sizeof(v));
    return true;
  }

  /// Reads `n` raw bytes.
  bool raw(std::string& v, size_t n) {
    if (rest_.size() < n)
      return false;
    v.assign(rest_.data(), n);
    rest_.remove_prefix(n);
    return true;
  }

private:
  std::string_view rest_;
};

} // namespace starling::actors::btard::detail
