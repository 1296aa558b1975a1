// libFuzzer target: untrusted bytes through the envelope and tensor decoders (capnp parse,
// header validation, payload size and invariant checks), the direct transport's framing (an
// input may be a frame: 16 header bytes, its meta, then the tensor; or a preamble; or a transfer
// status) and the averager's chunk meta. Must return an error, never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "actors/averager/chunk.hpp"
#include "actors/transfer/link_frame.hpp"
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
  namespace tr = actors::transfer;
  if (size >= tr::link_frame_header_bytes) {
    auto h = tr::parse_link_frame_header(data, tr::link_frame_header_bytes);
    if (h.ok()) {
      // A parsed header re-serializes to the same bytes and declares lengths in range.
      uint8_t again[tr::link_frame_header_bytes];
      tr::write_link_frame_header(*h, again);
      if (std::memcmp(again, data, tr::link_frame_header_bytes) != 0
          || h->meta_bytes < tr::link_min_meta_bytes || h->meta_bytes > tr::link_max_meta_bytes
          || h->payload_bytes > tr::link_max_payload_bytes)
        std::abort();
      auto rest = size - tr::link_frame_header_bytes;
      if (rest >= h->meta_bytes)
        tensor_msg_free_check(bytes + tr::link_frame_header_bytes + h->meta_bytes,
                              rest - h->meta_bytes);
    }
  }
  if (size >= tr::link_preamble_bytes)
    (void) tr::parse_link_preamble(data, tr::link_preamble_bytes);
  if (auto st = tr::decode_transfer_status(data, size); st.ok()) {
    auto again = tr::encode_transfer_status(st->first, st->second);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0)
      std::abort();
  }
  // The averager's chunk meta: a decoded meta re-encodes to exactly the same bytes.
  namespace av = actors::averager;
  auto meta = av::decode_chunk_meta(data, size);
  if (meta.ok()) {
    auto again = av::encode_chunk_meta(*meta);
    if (!again.ok() || again->size() != size || std::memcmp(again->data(), data, size) != 0)
      std::abort();
  }
  return 0;
}
