// libFuzzer target: untrusted bytes through the envelope and tensor decoders (capnp parse,
// header validation, payload size and invariant checks) and the data channel's frame header
// (an input may be a frame: 32 header bytes, then the tensor), and the averager data plane's
// preamble, frame header and chunk meta. Must return an error, never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "actors/averager/plane_frame.hpp"
#include "actors/transfer/frame.hpp"
#include "messages/wire.hpp"

using namespace starling;
using namespace starling::messages;

namespace {

// The receiving side of a data frame: the bytes after the header through the tensor decoder.
void tensor_msg_free_check(const char* bytes, size_t size) {
  auto st = read_flat(bytes, size, [](capnp::MessageReader& r) -> status {
    tensor_view v;
    return read_tensor(r.getRoot<wire::Tensor>(), v);
  });
  (void) st;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const char*>(data);
  envelope_view env;
  if (read_envelope(bytes, size, env).ok() && env.kind == wire::Envelope::Payload::TENSOR) {
    // A checked payload has exactly the size its header promises.
    auto n = kernels::checked_numel(env.tensor.header.shape);
    if (!n.ok()
        || kernels::payload_bytes(*n, env.tensor.header.codec, env.tensor.header.params)
             != env.tensor.size)
      std::abort();
  }
  auto st = read_flat(bytes, size, [](capnp::MessageReader& r) -> status {
    tensor_view v;
    auto s = read_tensor(r.getRoot<wire::Tensor>(), v);
    if (s.ok()) {
      // Touch every payload byte: out-of-bounds views show up under ASan.
      volatile uint8_t acc = 0;
      for (size_t i = 0; i < v.size; ++i)
        acc = acc ^ v.data[i];
    }
    return s;
  });
  (void) st;
  using actors::transfer::frame_header_bytes;
  if (size >= frame_header_bytes) {
    auto h = actors::transfer::parse_frame_header(data, frame_header_bytes);
    if (h.ok()) {
      // A parsed header re-serializes to the same bytes and declares 1 .. 2^31 bytes.
      uint8_t again[frame_header_bytes];
      actors::transfer::write_frame_header(*h, again);
      if (std::memcmp(again, data, frame_header_bytes) != 0 || h->length == 0 ||
          h->length > max_message_bytes)
        std::abort();
      tensor_msg_free_check(bytes + frame_header_bytes, size - frame_header_bytes);
    }
  }
  // The averager data plane: preamble, frame header and meta parsers on the same bytes.
  namespace av = actors::averager;
  if (size >= av::plane_preamble_bytes)
    (void) av::parse_plane_preamble(data, av::plane_preamble_bytes);
  if (size >= av::plane_frame_header_bytes) {
    auto h = av::parse_plane_frame_header(data, av::plane_frame_header_bytes);
    if (h.ok() && (h->meta_bytes > av::plane_max_meta_bytes
                   || h->payload_bytes > av::plane_max_payload_bytes))
      std::abort();
  }
  auto meta = av::decode_plane_meta(data, size);
  if (meta.ok()) {
    // A decoded meta re-encodes to exactly the same bytes.
    auto again = av::encode_plane_meta(*meta);
    if (!again.ok() || again->size() != size || std::memcmp(again->data(), data, size) != 0)
      std::abort();
  }
  return 0;
}
