#include "messages/tensor_msg.hpp"

#include <algorithm>
#include <cstring>
#include <exception>

#include <ATen/ATen.h>
#include <capnp/message.h>
#include <capnp/orphan.h>

#include "messages/envelope.hpp"
#include "messages/tensor_wire.hpp"
#include "messages/wire.hpp"

namespace starling::messages {

namespace {

/// What the encoder will write for `x`: its header, payload size and whether the payload can be
/// referenced in place (see `referenceable`).
struct plan {
  kernels::tensor_header header;
  uint64_t size = 0;
  bool reference = false;
};

/// True when the payload is exactly the tensor's memory: codec `none` of a contiguous fp32 CPU
/// tensor, word-aligned, in whole words per chunk (Cap'n Proto references external data as whole
/// words, so a ragged tail would expose the bytes after the storage).
bool referenceable(const at::Tensor& t, const kernels::tensor_header& h, uint64_t size) {
  return h.codec == kernels::codec_id::none && size > 0 && t.scalar_type() == at::kFloat &&
         t.device().is_cpu() && t.is_contiguous() && !t.is_neg() && !t.is_conj() &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % sizeof(capnp::word) == 0 &&
         size % sizeof(capnp::word) == 0 && h.params.chunk_bytes % sizeof(capnp::word) == 0 &&
         size == static_cast<uint64_t>(t.numel()) * sizeof(float);
}

result<plan> make_plan(const tensor_msg& x) {
  auto header = kernels::make_header(x.tensor, x.codec, x.params);
  if (!header)
    return fail(header.error().what);
  plan p;
  p.header = std::move(*header);
  p.size = kernels::payload_bytes(x.tensor.numel(), x.codec, p.header.params);
  p.reference = referenceable(x.tensor, p.header, p.size);
  return p;
}

/// Builds the Cap'n Proto message of `x` into `msg`: the payload is encoded in place, or, for a
/// referenceable payload, the chunks point at the tensor's storage (which must outlive `msg`).
status build_tensor(const tensor_msg& x, const plan& p, wire::Tensor::Builder root) {
  if (p.reference) {
    write_tensor_fields(root, p.header);
    auto chunk = p.header.params.chunk_bytes;
    auto count = (p.size + chunk - 1) / chunk;
    auto chunks = root.initChunks(static_cast<unsigned>(count));
    auto orphanage = capnp::Orphanage::getForMessageContaining(root);
    auto* base = static_cast<const kj::byte*>(x.tensor.data_ptr());
    for (uint64_t i = 0; i < count; ++i) {
      auto len = std::min(chunk, p.size - i * chunk);
      chunks.adopt(static_cast<unsigned>(i),
                   orphanage.referenceExternalData(capnp::Data::Reader(base + i * chunk, len)));
    }
    return {};
  }
  auto chunks = write_tensor(root, p.header);
  if (chunks.size() == 1) {
    if (auto st = kernels::encode_into(x.tensor, p.header, chunks[0].begin(), chunks[0].size());
        !st)
      return st;
  } else if (!chunks.empty()) {
    std::vector<uint8_t> whole(p.size);
    if (auto st = kernels::encode_into(x.tensor, p.header, whole.data(), p.size); !st)
      return st;
    size_t off = 0;
    for (auto c : chunks) {
      std::memcpy(c.begin(), whole.data() + off, c.size());
      off += c.size();
    }
  }
  return {};
}

/// First segment: big enough for the whole message when the payload is encoded in place, just
/// the header and chunk pointers (with their landing pads) when it is referenced.
unsigned first_segment_words(const plan& p) {
  if (p.reference) {
    auto count = (p.size + p.header.params.chunk_bytes - 1) / p.header.params.chunk_bytes;
    return static_cast<unsigned>(
      std::min<uint64_t>(256 + p.header.shape.size() + 3 * count, uint64_t{1} << 29));
  }
  return static_cast<unsigned>(
    std::min<uint64_t>(p.size / sizeof(capnp::word) + 256, uint64_t{1} << 29));
}

/// A built tensor message as the pieces of its flat serialization (segment table, segments).
class builder_source : public chunk_source {
public:
  explicit builder_source(const plan& p)
    : msg_(std::make_unique<capnp::MallocMessageBuilder>(first_segment_words(p))) {}

  status build(const tensor_msg& x, const plan& p) {
    if (p.reference)
      tensor_ = x.tensor; // the message references its storage
    if (auto st = build_tensor(x, p, msg_->initRoot<wire::Tensor>()); !st)
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
  at::Tensor tensor_;
  std::vector<uint32_t> table_;
  uint64_t total_ = 0;
};

} // namespace

status save_tensor(const tensor_msg& x, std::vector<char>& out) {
  try {
    auto p = make_plan(x);
    if (!p)
      return fail(p.error().what);
    capnp::MallocMessageBuilder msg(first_segment_words(*p));
    if (auto st = build_tensor(x, *p, msg.initRoot<wire::Tensor>()); !st)
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
    auto p = make_plan(x);
    if (!p)
      return fail(p.error().what);
    auto src = std::make_shared<builder_source>(*p);
    if (auto st = src->build(x, *p); !st)
      return fail(st.what());
    return std::shared_ptr<const chunk_source>{std::move(src)};
  } catch (const kj::Exception& e) {
    return fail("encoding failed: " + std::string{e.getDescription().cStr()});
  } catch (const std::exception& e) {
    return fail(std::string{"encoding failed: "} + e.what());
  }
}

status write_tensor_msg(wire::Tensor::Builder b, const tensor_msg& x) {
  auto p = make_plan(x);
  if (!p)
    return fail(p.error().what);
  return build_tensor(x, *p, b);
}

status read_tensor_msg(wire::Tensor::Reader r, tensor_msg& x) {
  tensor_view view;
  if (auto st = read_tensor(r, view); !st)
    return st;
  auto t = kernels::decode_payload(view.header, view.data, view.size);
  if (!t)
    return fail(t.error().what);
  x.tensor = std::move(*t);
  x.codec = view.header.codec;
  x.params = view.header.params;
  x.error.clear();
  return {};
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

namespace starling::messages {

bool wire_codec<tensor_msg>::matches(const payload_reader& r) {
  return r.get().isTensor();
}

status wire_codec<tensor_msg>::write(payload_writer& w, const tensor_msg& x) {
  // An undefined tensor leaves the payload's pointer unset (the union already names `tensor`).
  if (!x.tensor.defined())
    return {};
  return write_tensor_msg(w.get().initTensor(), x);
}

status wire_codec<tensor_msg>::read(const payload_reader& r, tensor_msg& x) {
  if (!r.get().hasTensor())
    return {};
  return read_tensor_msg(r.get().getTensor(), x);
}

} // namespace starling::messages
