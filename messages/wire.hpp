// Cap'n Proto on the wire, without torch or CAF: writing tensor headers into builders and reading
// untrusted flat arrays (alignment, traversal limit, kj exceptions, header and payload checks).
// This is the layer the fuzzer exercises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <capnp/message.h>

#include "kernels/compress/format.hpp"
#include "kernels/result.hpp"
#include "messages/tensor.capnp.h"

namespace starling::messages {

/// The wire protocol version this build speaks (Envelope.protocolVersion); messages/README.md
/// says which changes bump it. 2: every cross-process message is an envelope, with sequence
/// numbers and send times. 3: an envelope may carry its sender's signature after it (closed runs
/// sign every envelope). 4: a state (and each part of one) carries the model's buffers (batch
/// norm's running statistics, averaged in state rounds, and integer counters). 5: a state may
/// carry the optimizer's compact form (`packedMoments`: lamb8's 8-bit codes and scales) instead
/// of fp32 moments.
inline constexpr uint16_t protocol_version = 5;

/// Largest flat array accepted from the network (BASP carries at most ~2 GB per message anyway).
inline constexpr size_t max_message_bytes = size_t{1} << 31;

/// A tensor header and its contiguous payload, read from an untrusted `Tensor` and checked by
/// `kernels::check_payload`: decoding it cannot read out of bounds.
struct tensor_view {
  /// The validated header.
  kernels::tensor_header header;
  /// Start of the payload: inside the message when it was one chunk, else `gathered.data()`.
  const uint8_t* data = nullptr;
  /// Payload bytes.
  size_t size = 0;
  /// Owns the payload when it had to be gathered from several chunks (or copied).
  std::vector<uint8_t> gathered;
};

/// Writes every field of `header` into `b` except the payload chunks.
void write_tensor_fields(wire::Tensor::Builder b, const kernels::tensor_header& header);

/// Writes `header` into `b` and allocates its payload chunks; returns writable pointers to them,
/// in order, whose sizes sum to `kernels::payload_bytes` of the header.
std::vector<kj::ArrayPtr<kj::byte>> write_tensor(wire::Tensor::Builder b,
                                                 const kernels::tensor_header& header);

/// Reads and checks a `Tensor` from an untrusted message into `out` (which may then point into
/// the message: use it while the message lives). kj exceptions become a failure.
status read_tensor(wire::Tensor::Reader r, tensor_view& out);

/// Runs `f` on a reader over untrusted flat-array bytes: checks the size (non-empty, a multiple of
/// 8, at most `max_message_bytes`), copies into aligned words when `bytes` is not 8-byte aligned,
/// bounds traversal by the message size, and turns every kj or std exception into a failure.
status read_flat(const char* bytes, size_t size,
                 const std::function<status(capnp::MessageReader&)>& f);

/// Serializes a built message into `out` (replacing its content) as one flat array.
void write_flat(capnp::MessageBuilder& msg, std::vector<char>& out);

} // namespace starling::messages
