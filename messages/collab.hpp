// Messages of data-parallel peers (actors/dp_peer) besides the averager's and the state parts
// they share with SWARM stages (messages/swarm.hpp): DiLoCo's compressed pseudo-gradients on
// their way to the round's reducer and back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

namespace starling::messages {

/// A codec-compressed flat tensor as it travels (collab::wire_tensor): the codec header's fields
/// and the packed payload (collab/sparse_pack.hpp). Untrusted on arrival: decoding validates it.
struct wire_tensor_msg {
  /// `kernels::wire_dtype` as a number.
  uint8_t dtype = 0;
  std::vector<int64_t> shape;
  /// `kernels::codec_id` as a number.
  uint8_t codec = 0;
  /// The resolved codec parameters (`kernels::codec_params`).
  double ratio = 0;
  uint64_t k = 0;
  uint64_t seed = 0;
  uint32_t block_size = 0;
  uint32_t sample_size = 0;
  uint8_t index_bits = 0;
  uint64_t chunk_bytes = 0;
  /// The packed payload.
  std::vector<char> bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_tensor_msg& x) {
  return f(caf::meta::type_name("wire_tensor_msg"), x.dtype, x.shape, x.codec, x.ratio, x.k,
           x.seed, x.block_size, x.sample_size, x.index_bits, x.chunk_bytes, x.bytes);
}

/// A DiLoCo member's pseudo-gradient for the round's reducer (a request; the reply is the
/// round's compressed average as a `wire_tensor_msg`, or an error when the round failed).
struct diloco_contribution {
  /// The round (`<prefix>/diloco/<step>`).
  std::string round;
  /// The sender's peer address (for logs and its reducer's member count).
  std::string sender;
  /// Samples behind the pseudo-gradient: the weight of the mean.
  double weight = 0;
  /// The compressed pseudo-gradient (with the sender's error feedback).
  wire_tensor_msg delta;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, diloco_contribution& x) {
  return f(caf::meta::type_name("diloco_contribution"), x.round, x.sender, x.weight, x.delta);
}

} // namespace starling::messages
