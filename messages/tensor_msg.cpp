#include "messages/tensor_msg.hpp"

#include <exception>

#include <capnp/message.h>

#include "messages/wire.hpp"

namespace starling::messages {

status save_tensor(const tensor_msg& x, std::vector<char>& out) {
  try {
    auto header = kernels::make_header(x.tensor, x.codec, x.params);
    if (!header)
      return fail(header.error().what);
    auto n = x.tensor.numel();
    auto size = kernels::payload_bytes(n, x.codec, header->params);
    // One first segment big enough for the whole message: the payload is written in place.
    capnp::MallocMessageBuilder msg(static_cast<unsigned>(
      std::min<uint64_t>(size / sizeof(capnp::word) + 256, uint64_t{1} << 29)));
    auto chunks = write_tensor(msg.initRoot<wire::Tensor>(), *header);
    if (chunks.size() == 1) {
      if (auto st = kernels::encode_into(x.tensor, *header, chunks[0].begin(), chunks[0].size());
          !st)
        return st;
    } else if (!chunks.empty()) {
      std::vector<uint8_t> whole(size);
      if (auto st = kernels::encode_into(x.tensor, *header, whole.data(), size); !st)
        return st;
      size_t off = 0;
      for (auto c : chunks) {
        std::memcpy(c.begin(), whole.data() + off, c.size());
        off += c.size();
      }
    }
    write_flat(msg, out);
    return {};
  } catch (const kj::Exception& e) {
    return fail("encoding failed: " + std::string{e.getDescription().cStr()});
  } catch (const std::exception& e) {
    return fail(std::string{"encoding failed: "} + e.what());
  }
}

status load_tensor(const std::vector<char>& bytes, tensor_msg& x) {
  return read_flat(bytes.data(), bytes.size(), [&](capnp::MessageReader& reader) -> status {
    tensor_view view;
    if (auto st = read_tensor(reader.getRoot<wire::Tensor>(), view); !st)
      return st;
    auto t = kernels::decode_payload(view.header, view.data, view.size);
    if (!t)
      return fail(t.error().what);
    x.tensor = std::move(*t);
    x.codec = view.header.codec;
    x.params = view.header.params;
    return {};
  });
}

std::string describe(const tensor_msg& x) {
  std::string s = "tensor_msg(";
  if (!x.tensor.defined()) {
    s += "undefined";
  } else {
    s += c10::toString(x.tensor.scalar_type());
    s += "[";
    for (int64_t i = 0; i < x.tensor.dim(); ++i)
      s += (i ? "," : "") + std::to_string(x.tensor.size(i));
    s += "]";
  }
  s += ", ";
  s += kernels::to_string(x.codec);
  if (!x.error.empty())
    s += ", error: " + x.error;
  return s + ")";
}

} // namespace starling::messages
