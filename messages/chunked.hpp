// Messages of the chunked transfer (actors/transfer/chunked.hpp): a large encoded payload moves
// as a stream of bounded chunks, each acknowledged, so that a credit window paces the sender.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/serializer.hpp>
#include "messages/enveloped.hpp"

namespace starling::messages {

/// The sender's whole payload as a list of contiguous pieces (e.g. a Cap'n Proto segment table
/// and the segments of the builder that holds the encoded tensor), shared by all chunks of a
/// transfer so that cutting a chunk copies nothing: CAF's serializer reads the bytes straight
/// from the pieces into its buffer. Never serialized itself.
class chunk_source {
public:
  virtual ~chunk_source() = default;
  /// Total bytes.
  virtual uint64_t size() const = 0;
  /// Calls `f(const char* data, size_t n)` for the bytes [offset, offset + length), in order;
  /// stops at the first non-empty error `f` returns and returns it.
  template <class F>
  caf::error for_each(uint64_t offset, uint64_t length, F&& f) const {
    uint64_t pos = 0;
    for (auto& [p, n] : pieces_) {
      if (length == 0)
        break;
      if (offset < pos + n) {
        auto skip = offset - pos;
        auto take = std::min<uint64_t>(n - skip, length);
        if (auto err = f(p + skip, static_cast<size_t>(take)))
          return err;
        offset += take;
        length -= take;
      }
      pos += n;
    }
    return caf::none;
  }

protected:
  /// The pieces, in order; set by the subclass that owns their memory.
  std::vector<std::pair<const char*, uint64_t>> pieces_;
};

/// One piece of a chunked transfer. Chunks of a transfer arrive in order (CAF keeps the order
/// between two actors); `index` lets the receiver check that.
struct chunk_msg {
  /// Chosen by the sender, unique among its transfers in flight.
  uint64_t transfer_id = 0;
  /// Position of this chunk, 0 .. count - 1.
  uint32_t index = 0;
  /// Number of chunks of the transfer.
  uint32_t count = 0;
  /// Size of the whole payload, so the receiver reserves it once.
  uint64_t total_bytes = 0;
  /// The bytes of this chunk (CAF serializes `std::vector<char>` by memcpy). On the sending
  /// side they may instead be given as a range of `source` (see below).
  std::vector<char> bytes;
  /// Sender side only (never on the wire): when set, the chunk's bytes are
  /// [offset, offset + length) of `source` and `bytes` is empty. Serialization writes exactly
  /// what `bytes` holding that range would write, so receivers always see `bytes`; a receiver
  /// in the same process (no serialization) must use `view`.
  std::shared_ptr<const chunk_source> source;
  uint64_t offset = 0;
  uint64_t length = 0;

  /// Number of payload bytes this chunk carries.
  uint64_t size() const { return source ? length : bytes.size(); }

  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;

  /// Calls `f(const char*, size_t)` (returning caf::error) on the chunk's bytes, in order.
  template <class F>
  caf::error view(F&& f) const {
    if (source)
      return source->for_each(offset, length, std::forward<F>(f));
    return bytes.empty() ? caf::none : f(bytes.data(), bytes.size());
  }
};

template <>
struct wire_codec<chunk_msg> {
  static constexpr const char* name = "transfer.chunk";
  static bool matches(const payload_reader& r);
  /// A chunk cut from a `source` writes that range (what `bytes` would hold).
  static status write(payload_writer& w, const chunk_msg& x);
  static status read(const payload_reader& r, chunk_msg& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp); receivers always see
/// `bytes`.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chunk_msg& x) {
  return inspect_enveloped(f, x, "chunk_msg", [&] {
    return f(caf::meta::type_name("chunk_msg"), x.transfer_id, x.index, x.count, x.total_bytes,
             x.bytes);
  });
}

/// The receiver's acknowledgement of one chunk: one credit back to the sender. The ack of the
/// last chunk is sent after the payload was decoded and says whether that worked.
struct chunk_ack_msg {
  /// The transfer acknowledged.
  uint64_t transfer_id = 0;
  /// The chunk acknowledged.
  uint32_t index = 0;
  /// True on the ack of the last chunk, or on the first ack after a failure.
  bool done = false;
  /// Why the transfer failed (bad order, sizes, undecodable payload); empty when it did not.
  std::string error;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<chunk_ack_msg> {
  static constexpr const char* name = "transfer.chunk_ack";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const chunk_ack_msg& x);
  static status read(const payload_reader& r, chunk_ack_msg& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chunk_ack_msg& x) {
  return inspect_enveloped(f, x, "chunk_ack_msg", [&] {
    return f(caf::meta::type_name("chunk_ack_msg"), x.transfer_id, x.index, x.done, x.error);
  });
}

} // namespace starling::messages
