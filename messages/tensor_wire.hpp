// A tensor_msg as a `Tensor` field inside a larger Cap'n Proto message (an envelope's payload).
#pragma once

#include "kernels/result.hpp"
#include "messages/tensor.capnp.h"
#include "messages/tensor_msg.hpp"

namespace starling::messages {

/// Writes the defined tensor of `x` into `b` with its codec. An fp32 payload with codec `none`
/// references the tensor's memory (no copy): `x` must outlive the message's serialization.
status write_tensor_msg(wire::Tensor::Builder b, const tensor_msg& x);

/// Reads and checks an untrusted `Tensor` and decodes it into `x` (a CPU tensor).
status read_tensor_msg(wire::Tensor::Reader r, tensor_msg& x);

} // namespace starling::messages
