// libFuzzer target: untrusted bytes through the envelope and tensor decoders (capnp parse,
// header validation, payload size and invariant checks). Must return an error, never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "messages/wire.hpp"

using namespace starling;
using namespace starling::messages;

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
  return 0;
}
