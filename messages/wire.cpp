#include "messages/wire.hpp"

#include <cstring>
#include <exception>

#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>

namespace starling::messages {

namespace {

constexpr uint64_t max_dims = 64;

} // namespace

void write_tensor_fields(wire::Tensor::Builder b, const kernels::tensor_header& h) {
  b.setDtype(static_cast<uint8_t>(h.dtype));
  auto shape = b.initShape(static_cast<unsigned>(h.shape.size()));
  for (size_t i = 0; i < h.shape.size(); ++i)
    shape.set(static_cast<unsigned>(i), h.shape[i]);
  b.setCodec(static_cast<uint8_t>(h.codec));
  auto p = b.initParams();
  p.setRatio(h.params.ratio);
  p.setK(h.params.k);
  p.setSeed(h.params.seed);
  p.setBlockSize(h.params.block_size);
  p.setSampleSize(h.params.sample_size);
  p.setIndexBits(h.params.index_bits);
  p.setChunkBytes(h.params.chunk_bytes);
}

std::vector<kj::ArrayPtr<kj::byte>> write_tensor(wire::Tensor::Builder b,
                                                 const kernels::tensor_header& h) {
  write_tensor_fields(b, h);
  auto numel = kernels::checked_numel(h.shape);
  uint64_t size = numel ? kernels::payload_bytes(*numel, h.codec, h.params) : 0;
  uint64_t chunk = h.params.chunk_bytes == 0 ? kernels::max_chunk_bytes : h.params.chunk_bytes;
  auto count = (size + chunk - 1) / chunk;
  auto chunks = b.initChunks(static_cast<unsigned>(count));
  std::vector<kj::ArrayPtr<kj::byte>> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    auto len = std::min(chunk, size - i * chunk);
    auto d = chunks.init(static_cast<unsigned>(i), static_cast<unsigned>(len));
    out.emplace_back(d.begin(), d.size());
  }
  return out;
}

status read_tensor(wire::Tensor::Reader r, tensor_view& out) {
  try {
    kernels::tensor_header h;
    h.dtype = static_cast<kernels::wire_dtype>(r.getDtype());
    h.codec = static_cast<kernels::codec_id>(r.getCodec());
    auto shape = r.getShape();
    if (shape.size() > max_dims)
      return fail("tensor has " + std::to_string(shape.size()) + " dimensions (at most 64)");
    for (auto d : shape)
      h.shape.push_back(d);
    auto p = r.getParams();
    h.params.ratio = p.getRatio();
    h.params.k = p.getK();
    h.params.seed = p.getSeed();
    h.params.block_size = p.getBlockSize();
    h.params.sample_size = p.getSampleSize();
    h.params.index_bits = p.getIndexBits();
    h.params.chunk_bytes = p.getChunkBytes();
    if (auto st = kernels::validate_header(h); !st)
      return st;
    auto chunks = r.getChunks();
    uint64_t total = 0;
    for (auto c : chunks) {
      if (c.size() > h.params.chunk_bytes)
        return fail("payload chunk of " + std::to_string(c.size()) + " bytes exceeds chunkBytes "
                    + std::to_string(h.params.chunk_bytes));
      total += c.size();
    }
    if (auto st = kernels::validate(h, total); !st)
      return st;
    out.gathered.clear();
    if (chunks.size() == 1) {
      out.data = chunks[0].begin();
    } else {
      out.gathered.reserve(total);
      for (auto c : chunks)
        out.gathered.insert(out.gathered.end(), c.begin(), c.end());
      out.data = out.gathered.data();
    }
    out.size = total;
    if (auto st = kernels::check_payload(h, out.data, out.size); !st)
      return st;
    out.header = std::move(h);
    return {};
  } catch (const kj::Exception& e) {
    return fail("malformed tensor: " + std::string{e.getDescription().cStr()});
  } catch (const std::exception& e) {
    return fail(std::string{"malformed tensor: "} + e.what());
  }
}

status read_flat(const char* bytes, size_t size,
                 const std::function<status(capnp::MessageReader&)>& f) {
  if (size == 0)
    return fail("empty message");
  if (size % sizeof(capnp::word) != 0)
    return fail("message of " + std::to_string(size) + " bytes is not a whole number of words");
  if (size > max_message_bytes)
    return fail("message of " + std::to_string(size) + " bytes exceeds the limit");
  try {
    auto words = size / sizeof(capnp::word);
    kj::Array<capnp::word> copy;
    kj::ArrayPtr<const capnp::word> view;
    if (reinterpret_cast<uintptr_t>(bytes) % alignof(capnp::word) == 0) {
      view = kj::arrayPtr(reinterpret_cast<const capnp::word*>(bytes), words);
    } else {
      copy = kj::heapArray<capnp::word>(words);
      std::memcpy(copy.begin(), bytes, size);
      view = copy.asPtr();
    }
    capnp::ReaderOptions opts;
    // A valid message is read at most a few times over (chunk sizes, then gathering); the bound
    // stops amplification by overlapping pointers at a small multiple of the input.
    opts.traversalLimitInWords = 4 * words + 1024;
    capnp::FlatArrayMessageReader reader(view, opts);
    if (reader.getEnd() != view.end())
      return fail("trailing bytes after the message");
    return f(reader);
  } catch (const kj::Exception& e) {
    return fail("malformed message: " + std::string{e.getDescription().cStr()});
  } catch (const std::exception& e) {
    return fail(std::string{"malformed message: "} + e.what());
  }
}

void write_flat(capnp::MessageBuilder& msg, std::vector<char>& out) {
  auto words = capnp::computeSerializedSizeInWords(msg);
  out.resize(words * sizeof(capnp::word));
  kj::ArrayOutputStream stream(
    kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()), out.size()));
  capnp::writeMessage(stream, msg);
}

} // namespace starling::messages
