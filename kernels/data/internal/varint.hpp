// LEB128 varints for the loader's position and the sample ledger: small numbers in few bytes,
// the same bytes on every platform. Internal to kernels/data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace starling::kernels::internal {

/// Appends `v` as an unsigned LEB128 varint (7 bits a byte, low bits first).
inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

/// Reads bytes in order; every read reports whether the input held what was asked.
class byte_reader {
public:
  /// A reader over `bytes`, which must outlive it.
  explicit byte_reader(std::string_view bytes) : bytes_(bytes) {}

  /// Reads a varint into `v`; false when the input ends inside it or it exceeds 64 bits.
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= bytes_.size())
        return false;
      const auto b = static_cast<uint8_t>(bytes_[pos_++]);
      if (shift == 63 && (b & 0xfe) != 0)
        return false;
      v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0)
        return true;
    }
    return false;
  }

  /// Reads one byte; false at the end.
  bool byte(uint8_t& b) {
    if (pos_ >= bytes_.size())
      return false;
    b = static_cast<uint8_t>(bytes_[pos_++]);
    return true;
  }

  /// Reads a little-endian 64-bit word; false when fewer than 8 bytes remain.
  bool u64(uint64_t& v) {
    if (bytes_.size() - pos_ < 8)
      return false;
    v = 0;
    for (int i = 0; i < 8; ++i)
      v |= uint64_t{static_cast<uint8_t>(bytes_[pos_ + i])} << (8 * i);
    pos_ += 8;
    return true;
  }

  /// True when every byte has been read.
  bool at_end() const { return pos_ == bytes_.size(); }

  /// Bytes read so far.
  std::size_t offset() const { return pos_; }

private:
  std::string_view bytes_;
  std::size_t pos_ = 0;
};

/// Appends `v` as 8 little-endian bytes.
inline void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

} // namespace starling::kernels::internal
