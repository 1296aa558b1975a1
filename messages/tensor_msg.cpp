#include "messages/tensor_msg.hpp"

#include <cstring>
#include <exception>

#include <ATen/ATen.h>
#include <capnp/message.h>

#include "messages/wire.hpp"

namespace starling::messages {

namespace {

/// Builds the Cap'n Proto message of `x` (payload encoded in place) into `msg`.
status build_tensor(const tensor_msg& x, capnp::MessageBuilder& msg) {
  auto header = kernels::make_header(x.tensor, x.codec, x.params);
  if (!header)
    return fail(header.error().what);
  auto n = x.tensor.numel();
  auto size = kernels::payload_bytes(n, x.codec, header->params);
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
  return {};
}

/// First segment big enough for the whole message: the payload is written in place.
unsigned first_segment_words(const tensor_msg& x) {
  uint64_t size = 0;
  if (auto header = kernels::make_header(x.tensor, x.codec, x.params))
    size = kernels::payload_bytes(x.tensor.numel(), x.codec, header->params);
  return static_cast<unsigned>(
    std::min<uint64_t>(size / sizeof(capnp::word) + 256, uint64_t{1} << 29));
}

/// A built tensor message as the pieces of its flat serialization (segment table, segments).
class builder_source : public chunk_source {
public:
  explicit builder_source(const tensor_msg& x)
    : msg_(std::make_unique<capnp::MallocMessageBuilder>(first_segment_words(x))) {}

  status build(const tensor_msg& x) {
    if (auto st = build_tensor(x, *msg_); !st)
      return st;
    auto segs = msg_->getSegmentsForOutput();
    // The stream framing of capnp::writeMessage: (count - 1), each size in words, padded to 8.
    table_.assign((segs.size() + 2) & ~size_t{1}, 0);
    table_[0] = static_cast<uint32_t>(segs.size() - 1);
    for (size_t i = 0; i < segs.size(); ++i)
      table_[i + 1] = static_cast<uint32_t>(segs[i].size());
    total_ = table_.size() * sizeof(uint32_t);
    pieces_.emplace_back(reinterpret_cast<const char*>(table_.data()), total_);
    for (auto seg : segs) {
      auto bytes = seg.size() * sizeof(capnp::word);
      pieces_.emplace_back(reinterpret_cast<const char*>(seg.begin()), bytes);
      total_ += bytes;
    }
    return {};
  }

  uint64_t size() const override { return total_; }

private:
  // Behind a pointer: the builder's destructor may throw, chunk_source's may not.
  std::unique_ptr<capnp::MallocMessageBuilder> msg_;
  std::vector<uint32_t> table_;
  uint64_t total_ = 0;
};

} // namespace

status save_tensor(const tensor_msg& x, std::vector<char>& out) {
  try {
    capnp::MallocMessageBuilder msg(first_segment_words(x));
    if (auto st = build_tensor(x, msg); !st)
      return st;
    write_flat(msg, out);
    return {};
  } catch (const kj::Exception& e) {
    return fail("encoding failed: " + std::string{e.getDescription().cStr()});
  } catch (const std::exception& e) {
    return fail(std::string{"encoding failed: "} + e.what());
  }
}

result<std::shared_ptr<const chunk_source>> encode_tensor_source(const tensor_msg& x) {
  try {
    auto src = std::make_shared<builder_source>(x);
    if (auto st = src->build(x); !st)
      return fail(st.what());
    return std::shared_ptr<const chunk_source>{std::move(src)};
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

status load_tensor(std::vector<char>&& bytes, tensor_msg& x) {
  // Where an fp32 `none` payload sits inside `bytes`, found while the reader is open.
  bool alias = false;
  size_t offset = 0;
  kernels::tensor_header header;
  auto st = read_flat(bytes.data(), bytes.size(), [&](capnp::MessageReader& reader) -> status {
    tensor_view view;
    if (auto st = read_tensor(reader.getRoot<wire::Tensor>(), view); !st)
      return st;
    if (view.header.codec == kernels::codec_id::none &&
        view.header.dtype == kernels::wire_dtype::float32 && view.gathered.empty() &&
        view.size > 0 && reinterpret_cast<uintptr_t>(view.data) % alignof(float) == 0 &&
        reinterpret_cast<const char*>(view.data) >= bytes.data() &&
        reinterpret_cast<const char*>(view.data) + view.size <= bytes.data() + bytes.size()) {
      alias = true;
      offset = static_cast<size_t>(reinterpret_cast<const char*>(view.data) - bytes.data());
      header = view.header;
      return {};
    }
    auto t = kernels::decode_payload(view.header, view.data, view.size);
    if (!t)
      return fail(t.error().what);
    x.tensor = std::move(*t);
    x.codec = view.header.codec;
    x.params = view.header.params;
    return {};
  });
  if (!st || !alias)
    return st;
  try {
    auto owner = std::make_shared<std::vector<char>>(std::move(bytes));
    auto* data = owner->data() + offset;
    x.tensor = at::from_blob(
      data, header.shape, [owner](void*) mutable { owner.reset(); },
      at::TensorOptions().dtype(at::kFloat));
    x.codec = header.codec;
    x.params = header.params;
    return {};
  } catch (const std::exception& e) {
    return fail(std::string{"decode failed: "} + e.what());
  }
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
