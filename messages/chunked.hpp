// Messages of the chunked transfer (actors/transfer/chunked.hpp): a large encoded payload moves
// as a stream of bounded chunks, each acknowledged, so that a credit window paces the sender.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace starling::messages {

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
  /// The bytes of this chunk (CAF serializes `std::vector<char>` by memcpy).
  std::vector<char> bytes;
};

/// CAF 0.17 inspect for `chunk_msg`.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chunk_msg& x) {
  return f(caf::meta::type_name("chunk_msg"), x.transfer_id, x.index, x.count, x.total_bytes,
           x.bytes);
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
};

/// CAF 0.17 inspect for `chunk_ack_msg`.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chunk_ack_msg& x) {
  return f(caf::meta::type_name("chunk_ack_msg"), x.transfer_id, x.index, x.done, x.error);
}

} // namespace starling::messages
