// The tensor as a CAF message: a torch::Tensor moved by reference inside a process and encoded
// to Cap'n Proto (with the chosen codec) only when CAF serializes it for another node.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include "kernels/compress/codec.hpp"
#include "kernels/result.hpp"
#include "messages/chunked.hpp"
#include "messages/enveloped.hpp"

namespace starling::messages {

/// A tensor plus the codec it travels with when it leaves the process. Inside one process CAF
/// messages are shared, so the tensor is never encoded; across nodes `inspect` encodes it.
/// A receiver must check `ok()`: a payload that failed validation arrives with `error` set and an
/// undefined tensor instead of killing the connection or the actor.
struct tensor_msg {
  /// The tensor (any supported dtype and shape; on the receiving node a CPU tensor).
  at::Tensor tensor;
  /// Codec used when serialized.
  kernels::codec_id codec = kernels::codec_id::none;
  /// Codec parameters used when serialized.
  kernels::codec_params params;
  /// Why decoding failed on the receiving side; empty when the tensor is valid.
  std::string error;

  /// True when the tensor arrived intact (or never left the process).
  bool ok() const noexcept { return error.empty(); }
};

/// Encodes `x` (tensor and codec) as a Cap'n Proto `Tensor` flat array into `out`.
status save_tensor(const tensor_msg& x, std::vector<char>& out);

/// Decodes an untrusted flat array into `x` (tensor, codec and params); never throws.
status load_tensor(const std::vector<char>& bytes, tensor_msg& x);

/// Like `load_tensor`, but takes the buffer: when the payload is fp32 sent with codec `none`
/// in one Cap'n Proto chunk, the tensor aliases the bytes inside `bytes` (kept alive by the
/// tensor) instead of copying them. Other payloads decode as `load_tensor` does.
status load_tensor(std::vector<char>&& bytes, tensor_msg& x);

/// Encodes `x` like `save_tensor` but leaves the message in its Cap'n Proto builder: the result
/// lists the segment table and the segments, i.e. the very bytes `save_tensor` would write,
/// without the copy into one flat buffer. `size()` of the result is the flat size. An fp32
/// payload with codec `none` (contiguous, word-aligned) is not copied at all: the result
/// references the tensor's storage and keeps the tensor alive, so the tensor must not be modified
/// in place until the result is dropped.
result<std::shared_ptr<const chunk_source>> encode_tensor_source(const tensor_msg& x);

/// One line describing the message (dtype, shape, codec) for logs; never the values.
std::string describe(const tensor_msg& x);

template <>
struct wire_codec<tensor_msg> {
  static constexpr const char* name = "tensor";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const tensor_msg& x);
  static status read(const payload_reader& r, tensor_msg& x);
};

/// A refused tensor arrives undefined with `error` set.
inline void mark_refused(tensor_msg& x, const std::string& why) {
  x.error = why;
}

/// CAF 0.17 inspect: across processes an envelope whose payload is the tensor (an undefined
/// tensor travels as an envelope without one); a refused or invalid payload arrives as an
/// undefined tensor with `error` set; other inspectors (to_string) see a description.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_msg& x) {
  return inspect_enveloped(f, x, "tensor_msg", [&] {
    auto text = describe(x);
    return f(caf::meta::type_name("tensor_msg"), text);
  });
}

} // namespace starling::messages
