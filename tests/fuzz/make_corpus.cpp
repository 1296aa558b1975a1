// Writes seed inputs for decode_fuzz into the directory given as argv[1]: envelopes with a ping
// and with a small tensor of every codec, the bare tensors, and the tensors as direct-link frames.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <capnp/message.h>

#include "actors/transfer/link_frame.hpp"
#include "messages/wire.hpp"

using namespace starling;
using namespace starling::messages;

namespace {

void save(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A small, valid payload for each codec (zero bytes, with the invariants a checker wants).
void fill(const kernels::tensor_header& h, std::vector<kj::ArrayPtr<kj::byte>>& chunks) {
  std::vector<uint8_t> whole;
  for (auto c : chunks)
    whole.insert(whole.end(), c.begin(), c.end());
  std::memset(whole.data(), 0, whole.size());
  if (h.codec == kernels::codec_id::topk)
    for (uint64_t i = 0; i < h.params.k; ++i) {
      auto idx = static_cast<int32_t>(i * 3);
      std::memcpy(whole.data() + 4 * i, &idx, 4);
    }
  size_t off = 0;
  for (auto c : chunks) {
    std::memcpy(c.begin(), whole.data() + off, c.size());
    off += c.size();
  }
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus DIR\n");
    return 2;
  }
  std::string dir = argv[1];
  std::vector<char> bytes;
  {
    capnp::MallocMessageBuilder msg;
    auto env = msg.initRoot<wire::Envelope>();
    env.setProtocolVersion(protocol_version);
    env.setExperimentId("seed");
    env.getPayload().initPing().setSeq(1);
    write_flat(msg, bytes);
    save(dir + "/envelope-ping", bytes);
  }
  for (uint8_t c = 0; c < kernels::codec_count; ++c) {
    kernels::tensor_header h;
    h.codec = static_cast<kernels::codec_id>(c);
    h.shape = {3, 7};
    kernels::codec_params p;
    p.ratio = 0.25;
    p.block_size = 8;
    p.chunk_bytes = 16;
    h.params = *kernels::resolve_params(21, h.codec, p);
    std::string name{kernels::to_string(h.codec)};
    capnp::MallocMessageBuilder msg;
    auto env = msg.initRoot<wire::Envelope>();
    env.setProtocolVersion(protocol_version);
    env.setExperimentId("seed");
    auto chunks = write_tensor(env.getPayload().initTensor(), h);
    fill(h, chunks);
    write_flat(msg, bytes);
    save(dir + "/envelope-" + name, bytes);
    capnp::MallocMessageBuilder bare;
    auto chunks2 = write_tensor(bare.initRoot<wire::Tensor>(), h);
    fill(h, chunks2);
    write_flat(bare, bytes);
    save(dir + "/tensor-" + name, bytes);
    // The same tensor as a direct-link frame: header (meta and payload lengths), the meta
    // (the transfer channel and a token), then the bytes.
    namespace tr = actors::transfer;
    auto meta = tr::make_link_meta(tr::transfer_channel, std::vector<uint8_t>(16, 0x5a));
    std::vector<char> frame(tr::link_frame_header_bytes);
    tr::write_link_frame_header({static_cast<uint32_t>(meta.size()), bytes.size()},
                                reinterpret_cast<uint8_t*>(frame.data()));
    frame.insert(frame.end(), meta.begin(), meta.end());
    frame.insert(frame.end(), bytes.begin(), bytes.end());
    save(dir + "/frame-" + name, frame);
  }
  return 0;
}
