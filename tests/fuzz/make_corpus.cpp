// Writes seed inputs for decode_fuzz into the directory given as argv[1], each prefixed with the
// byte that selects its decoder (see decode_fuzz.cpp): envelopes of every payload kind, bare
// tensors of every codec and the same as direct-link frames, an averager chunk meta, a token,
// a deny list, a hello, key files, a token file and a patch codebook.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <capnp/message.h>

#include "actors/auth/gatekeeper.hpp"
#include "actors/btard/commitment.hpp"
#include "actors/btard/membership.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/token.hpp"
#include "actors/averager/chunk.hpp"
#include "actors/transfer/link_crypto.hpp"
#include "actors/transfer/link_frame.hpp"
#include "kernels/optim/quant8.hpp"
#include "messages/chunked.hpp"
#include "messages/dht.hpp"
#include "messages/direct.hpp"
#include "actors/collab/ledger_record.hpp"
#include "messages/envelope.hpp"
#include "messages/metrics.hpp"
#include "messages/types.hpp"
#include "messages/vi.hpp"
#include "messages/wire.hpp"
#include "runtime/experiment/package.hpp"
#include "kernels/t2i/codebook.hpp"

using namespace starling;
using namespace starling::messages;
namespace auth = starling::actors::auth;

namespace {

std::string dir;

void save(const std::string& name, uint8_t kind, const char* data, size_t size) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(kind));
  out.write(data, static_cast<std::streamsize>(size));
}

void save(const std::string& name, uint8_t kind, const std::vector<char>& bytes) {
  save(name, kind, bytes.data(), bytes.size());
}

void save(const std::string& name, uint8_t kind, const std::string& bytes) {
  save(name, kind, bytes.data(), bytes.size());
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

kernels::tensor_header header(kernels::codec_id c) {
  kernels::tensor_header h;
  h.codec = c;
  h.shape = {3, 7};
  kernels::codec_params p;
  p.ratio = 0.25;
  p.block_size = 8;
  p.chunk_bytes = 16;
  h.params = *kernels::resolve_params(21, h.codec, p);
  return h;
}

void tensor_into(wire::Tensor::Builder b, kernels::codec_id c) {
  auto h = header(c);
  auto chunks = write_tensor(b, h);
  fill(h, chunks);
}

/// An envelope of the seed experiment whose payload `write` fills; `signed_by` signs it (as a
/// closed run's nodes do).
template <class Write>
std::vector<char> envelope(Write&& write, const auth::key_pair* signed_by = nullptr) {
  wire_options o;
  o.experiment = "seed";
  o.peer_id = signed_by ? signed_by->peer_id() : std::string(20, 'p');
  o.clock = [] { return int64_t{0}; };
  if (signed_by)
    o.sign = [signed_by](std::string_view digest) { return signed_by->sign(digest); };
  wire_context ctx{o};
  std::vector<char> out;
  auto st = encode_envelope(&ctx, [&](payload_writer& w) {
    write(w.get());
    return status{};
  }, out);
  if (!st) {
    std::fprintf(stderr, "make_corpus: %s\n", st.what().c_str());
    std::exit(1);
  }
  return out;
}

template <class T>
void typed(const std::string& name, const T& x) {
  save("envelope-" + name, 0, envelope([&](wire::Envelope::Payload::Builder p) {
         payload_writer w{p};
         (void) wire_codec<T>::write(w, x);
       }));
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus DIR\n");
    return 2;
  }
  dir = argv[1];
  // Envelopes: torch-free message types through their codecs.
  dht_peer peer{std::string(20, 'i'), "127.0.0.1:1/dht"};
  dht_record rec{"key", true, "sub", {'v'}, 5, std::string(64, 's')};
  typed("ping", ping_msg{1, "seed"});
  // Signed as a closed run's node signs (the fuzzer's context checks it with the test key).
  auto signer = auth::key_pair::from_test_seed(100);
  save("envelope-ping-signed", 0, envelope([](wire::Envelope::Payload::Builder p) {
         payload_writer w{p};
         (void) wire_codec<ping_msg>::write(w, ping_msg{2, "signed"});
       }, &signer));
  typed("blob", blob_msg{"t", {'x'}});
  typed("metric", metric_event{"trainer.0", "microbatch", {{"loss", 1.5}}, {{"peer", "p"}}, 2.0});
  typed("dht-request", dht_request{1, peer, {}, "key", {rec}});
  typed("dht-response", dht_response{peer, {peer}, {rec}, {1}, ""});
  typed("dht-put", dht_put{"key", false, "", {'v'}, 9, true});
  typed("dht-get-result", dht_get_result{true, {rec}, 2});
  typed("dht-stats", dht_stats{1, 2, 3, 4, 5, 6, 7, 8, 9});
  vi_vector v{2, 8, 3, {1, 4}, {0.5f, 1.5f}};
  typed("vi-uplink", vi_uplink{1, 2, 1, v});
  typed("vi-downlink", vi_downlink{2, 1, true, v});
  typed("vi-report", vi_report{3, {1.0}, 4, 5, 2});
  typed("transfer-announce", direct_announce{std::vector<char>(16, 't'), 64, 0, {4, 4}, 0});
  typed("transfer-endpoint", direct_endpoint{"127.0.0.1", 9});
  chunk_msg c;
  c.count = 2;
  c.total_bytes = 8;
  c.bytes = {'a', 'b', 'c', 'd'};
  typed("transfer-chunk", c);
  typed("transfer-ack", chunk_ack_msg{1, 0, true, ""});
  // Stage and averager payloads, with tensors.
  save("envelope-stage-backward", 0, envelope([](wire::Envelope::Payload::Builder p) {
         auto b = p.initStage().initBackward();
         tensor_into(b.initInput(), kernels::codec_id::none);
         tensor_into(b.initGradOutput(), kernels::codec_id::blockwise8);
         b.setMicrobatchId(7);
         b.setAttempt(1);
       }));
  save("envelope-stage-state-part", 0, envelope([](wire::Envelope::Payload::Builder p) {
         auto s = p.initStage().initStatePart();
         s.setParts(2);
         s.setPart(1);
         s.setDigest(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(
                                            std::string(32, 'd').data()),
                                          32));
         tensor_into(s.initParams(), kernels::codec_id::fp16);
       }));
  save("envelope-averager-chunk", 0, envelope([](wire::Envelope::Payload::Builder p) {
         auto c = p.initAverager().initChunk();
         c.setKind(1);
         c.setWeight(2.0);
         tensor_into(c.initValues(), kernels::codec_id::topk);
         c.initContributors(2).set(1, 1);
       }));
  save("envelope-averager-result", 0, envelope([](wire::Envelope::Payload::Builder p) {
         auto r = p.initAverager().initAverageResult();
         tensor_into(r.initTensors(2)[0].initTensor(), kernels::codec_id::quantile8);
         auto rep = r.initReport();
         auto m = rep.initMembers(2);
         m[0].setAddress("a");
         m[0].setBandwidth(1.0);
         m[1].setBandwidth(0.0);
         auto parts = rep.initParts(1);
         parts[0].initSegments(1)[0].setSize(3);
       }));
  save("envelope-averager-join", 0, envelope([](wire::Envelope::Payload::Builder p) {
         auto j = p.initAverager().initJoin();
         j.setGroupKey("g");
         j.initMember().setBandwidth(1.0);
         j.setNumel(10);
       }));
  // Tensors of every codec: in an envelope, bare, and as direct-link frames.
  for (uint8_t i = 0; i < kernels::codec_count; ++i) {
    auto codec = static_cast<kernels::codec_id>(i);
    std::string name{kernels::to_string(codec)};
    save("envelope-tensor-" + name, 0, envelope([&](wire::Envelope::Payload::Builder p) {
           tensor_into(p.initTensor(), codec);
         }));
    capnp::MallocMessageBuilder bare;
    tensor_into(bare.initRoot<wire::Tensor>(), codec);
    std::vector<char> bytes;
    write_flat(bare, bytes);
    save("tensor-" + name, 2, bytes);
    // The direct-link frame: header (meta and payload lengths), the meta (the transfer channel
    // and a token), then the bytes.
    namespace tr = actors::transfer;
    auto lm = tr::make_link_meta(tr::transfer_channel, std::vector<uint8_t>(16, 0x5a));
    std::vector<char> frame(tr::link_frame_header_bytes);
    tr::write_link_frame_header({static_cast<uint32_t>(lm.size()), bytes.size()},
                                reinterpret_cast<uint8_t*>(frame.data()));
    frame.insert(frame.end(), lm.begin(), lm.end());
    frame.insert(frame.end(), bytes.begin(), bytes.end());
    save("frame-" + name, 3, frame);
  }
  actors::averager::chunk_meta meta;
  meta.kind = 1;
  meta.weight = 1.0;
  if (auto m = actors::averager::encode_chunk_meta(meta); m.ok())
    save("chunk-meta", 4, reinterpret_cast<const char*>(m->data()), m->size());
  // Membership: a token, a deny list, a hello, key files and a token file.
  auto authority = auth::key_pair::from_test_seed(100);
  auto node = auth::key_pair::from_test_seed(1);
  auth::token t;
  t.id = std::string(16, 'i');
  t.peer_key = node.public_key();
  t.roles = {"trainer", "stage"};
  t.experiment = "seed";
  t.issued_at_ns = 1;
  t.expires_at_ns = int64_t{1} << 62;
  auto signed_token = *auth::encode_token(t, authority);
  save("token", 5, signed_token);
  auth::deny_list d;
  d.experiment = "seed";
  d.serial = 3;
  d.entries.push_back({auth::deny_entry::kind_t::token, std::string(16, 'x'), "leaked", 1, 0});
  d.entries.push_back({auth::deny_entry::kind_t::peer, std::string(32, 'y'), "", 1, 99});
  save("deny-list", 6, *auth::encode_deny_list(d, authority));
  auth::hello h;
  h.version = protocol_version;
  h.experiment = "seed";
  h.token = signed_token;
  h.challenge = std::string(auth::challenge_bytes, '\x07');
  h.acceptor_peer_id = auth::key_pair::from_test_seed(50).peer_id();
  h.time_ns = int64_t{1'800'000'000} * 1'000'000'000;
  save("hello", 7, auth::make_hello(node, h));
  save("secret-key", 8, auth::format_secret_key(node, auth::key_role::node));
  save("public-key", 9, auth::format_public_key(node.public_key(), auth::key_role::node));
  save("token-file", 10, auth::format_token_file(signed_token));
  // The sealed direct link: a hello, a reply, a finish and a record under the fuzzer's key.
  {
    namespace tr = actors::transfer;
    tr::link_token token{};
    tr::link_handshake c{node, "seed", token};
    tr::link_handshake s{authority, "seed", token};
    auto hello = c.hello();
    save("sealed-hello", 11, reinterpret_cast<const char*>(hello.data()), hello.size());
    if (s.on_hello(hello.data(), hello.size()).ok())
      if (auto r = s.reply(); r.ok()) {
        save("sealed-reply", 11, reinterpret_cast<const char*>(r->data()), r->size());
        if (c.on_reply(r->data(), r->size()).ok()) {
          auto f = c.finish();
          std::vector<char> both(hello.begin(), hello.end());
          both.insert(both.end(), f.begin(), f.end());
          save("sealed-hello-finish", 11, both);
          save("sealed-finish", 11, reinterpret_cast<const char*>(f.data()), f.size());
        }
      }
    std::array<uint8_t, 32> key{};
    key.fill(0x11);
    tr::record_cipher rc{tr::cipher_xchacha20, key};
    std::vector<uint8_t> plain(100, 0x42);
    std::vector<char> rec(plain.size() + tr::sealed_header_bytes + tr::sealed_tag_bytes);
    rc.seal(plain.data(), plain.size(), reinterpret_cast<uint8_t*>(rec.data()));
    save("sealed-record", 11, rec);
    uint8_t pre[tr::link_preamble_bytes];
    tr::write_sealed_preamble(token, pre);
    save("sealed-preamble", 11, reinterpret_cast<const char*>(pre), sizeof pre);
  }
  {
    // Ring positions: three payloads claimed in order (the third on the next lap of a 64 KiB
    // ring), the first and third released.
    namespace tr = actors::transfer;
    std::vector<char> rec;
    auto record = [&](uint64_t pos, uint32_t n, uint8_t op) {
      uint8_t r[13];
      tr::write_le(r, pos, 8);
      tr::write_le(r + 8, n, 4);
      r[12] = op;
      rec.insert(rec.end(), r, r + sizeof r);
    };
    record(0, 30000, 0);
    record(30016, 30000, 0);
    record(65536, 6000, 0);
    record(0, 0, 1);
    record(2, 0, 1);
    save("ring-claims", 12, rec);
  }
  {
    // Ledger summaries: a peer with credits, and one that left with none. The decoder reads the
    // sub-key from the first byte's length (the fuzz target's framing).
    namespace collab = actors::collab;
    collab::contribution_summary s;
    s.id = "@0/dedloc.1|[owner:00]";
    s.name = "dedloc.1";
    s.time = 12.5;
    s.started = 1;
    s.computed = 640;
    s.dropped = 32;
    s.rounds = 9;
    s.rounds_averaged = 8;
    s.bytes_sent = 1e6;
    s.bytes_received = 2e6;
    s.credits = {{"dedloc.0", 300}, {"dedloc.2", 120.5}};
    s.credits_other = 4;
    auto framed = [](const collab::contribution_summary& x) {
      std::vector<char> out;
      out.push_back(static_cast<char>(x.id.size()));
      out.insert(out.end(), x.id.begin(), x.id.end());
      auto v = collab::encode_summary(x);
      out.insert(out.end(), v.begin(), v.end());
      return out;
    };
    save("ledger-summary", 13, framed(s));
    s.credits.clear();
    s.left = true;
    save("ledger-summary-left", 13, framed(s));
    // A SWARM stage-0 peer of a closed run: a credit to a trainer's tag, its loss, step, stage
    // and token id.
    s.left = false;
    s.credits = {{collab::trainer_credit_name_of("trainer.0"), 512}};
    s.loss = 3.25;
    s.step = 17;
    s.stage = 0;
    s.token_id = "00112233445566778899aabbccddeeff";
    save("ledger-summary-stage", 13, framed(s));
    // A node's gate record: refusals by reason and by a party's key, one banned.
    collab::gate_summary g;
    g.id = "gate|[owner:" + std::string(64, 'a') + "]";
    g.time = 20;
    g.started = 1;
    g.others = 2;
    g.by_reason = {{"banned", 3}, {"no_hello", 2}};
    g.parties = {{"0123456789abcdef", 3, "banned by verdict: a NaN part at step 2"}};
    std::vector<char> gate;
    gate.push_back(static_cast<char>(g.id.size()));
    gate.insert(gate.end(), g.id.begin(), g.id.end());
    auto gv = collab::encode_gate_summary(g);
    gate.insert(gate.end(), gv.begin(), gv.end());
    save("gate-record", 17, gate);
  }
  {
    // lamb8 states: an 8-bit tensor (two blocks, one partial), an fp32 one and one without state.
    using namespace starling::kernels;
    std::vector<float> m(4100), v(4100), small_m{0.5f, -0.25f}, small_v{0.25f, 0.0625f};
    for (size_t i = 0; i < m.size(); ++i) {
      m[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.01f;
      v[i] = m[i] * m[i];
    }
    std::vector<uint8_t> mc(m.size()), vc(v.size());
    std::vector<float> ms(static_cast<size_t>(quant8_blocks(4100))), vs(ms.size());
    quantize8(code8::dynamic_signed, m.data(), 4100, mc.data(), ms.data());
    quantize8(code8::log_unsigned, v.data(), 4100, vc.data(), vs.data());
    std::vector<lamb8_tensor_ref> refs(3);
    refs[0] = {4100, 3, lamb8_form::quantized, nullptr, nullptr, ms.data(), vs.data(), mc.data(),
               vc.data()};
    refs[1] = {2, 3, lamb8_form::full, small_m.data(), small_v.data()};
    refs[2] = {7, 0, lamb8_form::empty};
    save("lamb8-state", 14, encode_lamb8_state(refs));
    refs.resize(2);
    refs[0] = refs[1];
    save("lamb8-small", 14, encode_lamb8_state(refs));
  }
  // A small patch codebook (two 2×2 codes).
  kernels::patch_codebook cb;
  cb.patch = 2;
  cb.codes = {0.0f, 0.25f, 0.5f, 1.0f, 1.0f, 0.75f, 0.5f, 0.0f};
  save("codebook", 15, kernels::encode_codebook(cb));
  // An experiment package with one named file and a signature, and a signature file.
  {
    runtime::experiment_package p;
    p.yaml = "experiment: {name: t, kind: dedloc}\ndedloc: {model: {files: [m.pt]}}\n";
    p.nodes = 2;
    p.files.push_back({"dedloc.model.files[0]", "m.pt", runtime::blake2b_256("m"), 1});
    p.digest = runtime::experiment_digest(p.yaml, p.sets, p.files);
    p.signature = auth::key_pair::from_test_seed(1).sign(
        runtime::experiment_signing_message(p.digest, p.nodes));
    p.endpoint = "127.0.0.1:4000";
    p.reach_detail = "unreachable: nothing listens there";
    if (auto b = runtime::encode_package(p); b.ok())
      save("experiment-package", 16, *b);
    save("experiment-signature", 16,
         runtime::format_experiment_signature({p.digest, p.nodes, p.signature}));
  }
  {
    // BTARD: a signed statement of each digest-carrying kind, and a membership state.
    namespace bt = starling::actors::btard;
    auto k = auth::key_pair::from_test_seed(7);
    bt::digest d{};
    d[0] = 1;
    for (auto kind : {bt::statement_kind::part_digest, bt::statement_kind::state_digest}) {
      bt::statement st{kind, "fuzz-run", 3, k.public_key(),
                       kind == bt::statement_kind::state_digest ? std::string(32, 'p')
                                                                : bt::index_slot(0, 1),
                       bt::digest_payload(d)};
      if (auto s = bt::sign_statement(st, k); s.ok())
        save(std::string("btard-") + bt::kind_name(kind), 18, bt::encode(*s));
    }
    bt::membership m;
    (void)m.join(std::string(32, 'a'), 0);
    (void)m.join(std::string(32, 'b'), 0);
    (void)m.silent(std::string(32, 'b'), 2);
    m.ban(std::string(32, 'c'), "wrong_gradient");
    save("btard-membership", 19, m.encode());
  }
  return 0;
}
