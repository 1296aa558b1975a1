// libFuzzer target: every decoder that reads untrusted bytes, torch-free. The first byte picks the
// decoder, the rest is its input:
//   0 envelope (header checks with a wire context, then every payload kind via check_payload)
//   1 envelope without a context (structure only), 2 bare Cap'n Proto tensor,
//   3 direct transport link (16-byte frame header, its meta, then a tensor; or a preamble; or a
//   transfer status), 4 averager chunk meta, 5 token, 6 deny list, 7 hello (and a gatekeeper admitting it),
//   8 secret key file, 9 public key file, 10 token file text, 11 sealed direct link (a
//   handshake message of each kind, a sealed preamble, a record header and its record opened
//   with a fixed key, and an acceptor's handshake run on the input: hello, then finish),
//   12 shared-memory ring positions of a same-host link (13-byte records: position u64, size
//   u32, then 0 to claim at a fresh ring's reader or 1 to release an earlier claim),
//   13 ledger summary record (a length byte, that many bytes of sub-key, then the value; a
//   decoded record must encode back to the same bytes), 14 a lamb8 optimizer state (codes and
//   scales, kernels/optim/quant8.hpp): decoded, it re-encodes to the same bytes and its codes
//   dequantize to finite values, 15 a patch codebook file of the text-to-image demo
//   (decoded, then re-encoded byte for byte), 16 an experiment package a node serves a joiner
//   (runtime/experiment/package.hpp: decoded, it re-encodes byte for byte, and its digest check
//   runs) and an experiment signature file's text, 17 a node's gate record of the ledger (a
//   length byte, that many bytes of sub-key, then the value; a decoded record must encode back
//   to the same bytes).
// Everything must be refused with a reason or decoded, never crash.
#include <vector>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "actors/btard/commitment.hpp"
#include "actors/btard/membership.hpp"
#include "actors/auth/gatekeeper.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/token.hpp"
#include "actors/averager/chunk.hpp"
#include "actors/collab/ledger_record.hpp"
#include "actors/transfer/link_crypto.hpp"
#include "actors/transfer/link_frame.hpp"
#include "actors/transfer/shm_ring.hpp"
#include "kernels/optim/quant8.hpp"
#include "kernels/t2i/codebook.hpp"
#include "messages/envelope.hpp"
#include "messages/wire.hpp"
#include "runtime/experiment/package.hpp"

using namespace starling;
using namespace starling::messages;
namespace auth = starling::actors::auth;

namespace {

constexpr int64_t now_ns = int64_t{1'800'000'000} * 1'000'000'000;

const auth::key_pair& authority() {
  // Derived once; a constant, not state.
  static const auto k = auth::key_pair::from_test_seed(100);
  return k;
}

/// A fresh receiving context per input: fuzz inputs must not depend on earlier ones. A signature
/// after an envelope is checked against the test key (unsigned envelopes are read on, so that
/// every payload reader stays reachable).
wire_options context_options() {
  wire_options o;
  o.experiment = "seed";
  o.clock = [] { return now_ns; };
  o.max_clock_skew_ns = 0; // seeds carry send time 0
  o.verify = [](const std::string&, std::string_view digest, std::string_view signature) {
    return auth::verify_signature(authority().public_key(), digest, signature)
             ? std::string{}
             : std::string{"not the test key's signature"};
  };
  return o;
}

auth::trust_anchor trust() {
  return auth::trust_anchor{authority().public_key(), "seed"};
}

void envelope(const char* bytes, size_t size, wire_context* ctx) {
  auto r = decode_envelope(
    bytes, size, ctx, "any", [](const payload_reader&) { return true; },
    [](const payload_reader& p) { return check_payload(p); });
  (void) r;
}

void bare_tensor(const char* bytes, size_t size) {
  auto st = read_flat(bytes, size, [](capnp::MessageReader& r) -> status {
    tensor_view v;
    auto s = read_tensor(r.getRoot<wire::Tensor>(), v);
    if (s.ok()) {
      // A checked payload has exactly the size its header promises; touch every byte (ASan).
      auto n = kernels::checked_numel(v.header.shape);
      if (!n.ok() || kernels::payload_bytes(*n, v.header.codec, v.header.params) != v.size)
        std::abort();
      volatile uint8_t acc = 0;
      for (size_t i = 0; i < v.size; ++i)
        acc = acc ^ v.data[i];
    }
    return s;
  });
  (void) st;
}

void link(const uint8_t* data, size_t size) {
  namespace tr = actors::transfer;
  const auto* bytes = reinterpret_cast<const char*>(data);
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
        bare_tensor(bytes + tr::link_frame_header_bytes + h->meta_bytes, rest - h->meta_bytes);
    }
  }
  if (size >= tr::link_preamble_bytes)
    (void) tr::parse_link_preamble(data, tr::link_preamble_bytes);
  if (auto st = tr::decode_transfer_status(data, size); st.ok()) {
    auto again = tr::encode_transfer_status(st->first, st->second);
    if (again.size() != size || std::memcmp(again.data(), data, size) != 0)
      std::abort();
  }
}

void sealed(const uint8_t* data, size_t size) {
  namespace tr = actors::transfer;
  for (uint8_t kind = 0; kind <= 4; ++kind)
    (void) tr::parse_link_hello(data, size, kind);
  if (size >= tr::link_preamble_bytes)
    (void) tr::parse_sealed_preamble(data, tr::link_preamble_bytes);
  if (size >= tr::sealed_header_bytes) {
    auto n = tr::parse_sealed_header(data, tr::sealed_header_bytes);
    if (n.ok()) {
      if (*n == 0 || *n > tr::sealed_max_record)
        std::abort();
      if (size >= tr::sealed_header_bytes + *n + tr::sealed_tag_bytes) {
        // The seed's key: a seed record opens, anything else must fail its tag.
        std::array<uint8_t, 32> key{};
        key.fill(0x11);
        tr::record_cipher rc{tr::cipher_xchacha20, key};
        std::vector<uint8_t> body(data + tr::sealed_header_bytes,
                                  data + tr::sealed_header_bytes + *n);
        (void) rc.open(data, body.data(), body.size(), data + tr::sealed_header_bytes + *n);
      }
    }
  }
  if (size >= tr::link_hello_bytes) {
    static const auto key = auth::key_pair::from_test_seed(60);
    tr::link_token token{};
    tr::link_handshake hs{key, "seed", token};
    if (hs.on_hello(data, tr::link_hello_bytes).ok()) {
      auto r = hs.reply();
      if (r.ok() && size >= tr::link_hello_bytes + tr::link_finish_bytes
          && hs.on_finish(data + tr::link_hello_bytes, tr::link_finish_bytes).ok())
        std::abort(); // a finish signed for this acceptor's fresh ephemeral key: unforgeable
    }
  }
}

void chunk_meta(const uint8_t* data, size_t size) {
  namespace av = actors::averager;
  auto meta = av::decode_chunk_meta(data, size);
  if (meta.ok()) {
    // A decoded meta re-encodes to exactly the same bytes.
    auto again = av::encode_chunk_meta(*meta);
    if (!again.ok() || again->size() != size || std::memcmp(again->data(), data, size) != 0)
      std::abort();
  }
}

void token(std::string_view bytes) {
  auto t = auth::verify_token(bytes, trust(), now_ns);
  // Only the authority's signature makes a token valid, and fuzzing cannot forge it unless the
  // input is a seed token unchanged in its signed bytes.
  if (t.ok() && t->authority_key != authority().public_key())
    std::abort();
  (void) auth::decode_token(bytes);
}

void deny(std::string_view bytes) {
  auto d = auth::verify_deny_list(bytes, trust());
  if (d.ok())
    for (auto& e : d->entries)
      (void) e.active(now_ns);
}

void hello(std::string_view bytes) {
  (void) auth::decode_hello(bytes);
  auth::gatekeeper_options o;
  o.trust = trust();
  o.self_key = auth::key_pair::from_test_seed(50).public_key();
  o.protocol_version = protocol_version;
  o.random = [](uint8_t* p, size_t n) { std::memset(p, 7, n); };
  auth::gatekeeper gk{o};
  gk.open(1);
  auto p = gk.admit_hello(1, bytes, now_ns);
  (void) gk.check(1, p.ok() ? "stage.forward" : "ping", now_ns);
}

/// Claims and releases of a peer's ring positions: a claim is accepted only where the writer
/// must have placed it, inside the ring, and the release position never passes what was claimed.
void ring_claims(const uint8_t* data, size_t size) {
  namespace tr = actors::transfer;
  auto ring = tr::ring_map::create(tr::ring_min_bytes);
  if (!ring.ok())
    return;
  tr::ring_reader reader{*ring};
  std::vector<uint64_t> claimed;
  uint64_t end = 0;
  for (; size >= 13; data += 13, size -= 13) {
    auto pos = tr::read_le(data, 8);
    auto n = tr::read_le(data + 8, 4);
    if ((data[12] & 1) != 0) {
      if (!claimed.empty())
        reader.release(claimed[pos % claimed.size()]);
      continue;
    }
    if (reader.claim(pos, n).ok()) {
      if (n == 0 || n > (*ring)->capacity() || pos % tr::ring_align != 0 ||
          pos % (*ring)->capacity() + n > (*ring)->capacity() || pos < end)
        std::abort();
      claimed.push_back(pos);
      end = pos + n;
    }
    if ((*ring)->tail().load() > end || (*ring)->claimed().load() != end)
      std::abort();
  }
}

/// A record of the ledger's keys as the fuzzer frames it: a length byte, that many bytes of
/// sub-key, then the value; none when the input is shorter.
std::optional<std::pair<std::string, std::vector<char>>> framed_record(const char* bytes,
                                                                       size_t size) {
  if (size == 0)
    return std::nullopt;
  auto n = static_cast<uint8_t>(bytes[0]);
  if (size < 1u + n)
    return std::nullopt;
  return std::make_pair(std::string(bytes + 1, n), std::vector<char>(bytes + 1 + n, bytes + size));
}

void ledger_summary(const char* bytes, size_t size) {
  auto r = framed_record(bytes, size);
  if (!r)
    return;
  auto s = actors::collab::decode_summary_record(r->first, r->second);
  // What decodes is exactly what an honest peer encodes: nothing is read past its bounds and
  // nothing is silently dropped.
  if (s.ok() && actors::collab::encode_summary(*s) != r->second)
    std::abort();
}

void gate_record(const char* bytes, size_t size) {
  auto r = framed_record(bytes, size);
  if (!r)
    return;
  auto g = actors::collab::decode_gate_record(r->first, r->second);
  if (g.ok() && actors::collab::encode_gate_summary(*g) != r->second)
    std::abort();
}

void lamb8_state(const char* bytes, size_t size) {
  using namespace starling::kernels;
  auto st = decode_lamb8_state(bytes, size);
  if (!st.ok())
    return;
  std::vector<lamb8_tensor_ref> refs;
  std::vector<uint64_t> numels;
  std::vector<float> y;
  for (auto& t : *st) {
    lamb8_tensor_ref r{t.numel, t.step, t.form, t.m.data(), t.v.data(), t.m_scales.data(),
                       t.v_scales.data(), t.m_codes.data(), t.v_codes.data()};
    refs.push_back(r);
    numels.push_back(t.numel);
    if (t.form == lamb8_form::quantized) {
      auto n = static_cast<int64_t>(t.numel);
      y.resize(t.numel);
      dequantize8(code8::dynamic_signed, t.m_codes.data(), t.m_scales.data(), n, y.data());
      for (auto x : y)
        if (!std::isfinite(x))
          std::abort();
      dequantize8(code8::log_unsigned, t.v_codes.data(), t.v_scales.data(), n, y.data());
      for (auto x : y)
        if (!std::isfinite(x) || x < 0)
          std::abort();
    }
  }
  auto again = encode_lamb8_state(refs);
  if (again.size() != size || std::memcmp(again.data(), bytes, size) != 0)
    std::abort();
  // The sizes it carries are the sizes it accepts.
  if (!decode_lamb8_state(bytes, size, &numels).ok())
    std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  auto kind = data[0];
  ++data;
  --size;
  const auto* bytes = reinterpret_cast<const char*>(data);
  std::string_view text(bytes, size);
  switch (kind % 20) {
    case 0: {
      wire_context ctx{context_options()};
      envelope(bytes, size, &ctx);
      break;
    }
    case 1:
      envelope(bytes, size, nullptr);
      break;
    case 2:
      bare_tensor(bytes, size);
      break;
    case 3:
      link(data, size);
      break;
    case 4:
      chunk_meta(data, size);
      break;
    case 5:
      token(text);
      break;
    case 6:
      deny(text);
      break;
    case 7:
      hello(text);
      break;
    case 8:
      (void) auth::parse_secret_key(text, auth::key_role::node, "fuzz");
      (void) auth::parse_secret_key(text, auth::key_role::authority, "fuzz");
      break;
    case 9:
      (void) auth::parse_public_key(text, auth::key_role::node, "fuzz");
      break;
    case 10:
      if (auto t = auth::parse_token_file(text, "fuzz"); t.ok())
        (void) auth::decode_token(*t);
      break;
    case 11:
      sealed(data, size);
      break;
    case 12:
      ring_claims(data, size);
      break;
    case 13:
      ledger_summary(bytes, size);
      break;
    case 14:
      lamb8_state(bytes, size);
      break;
    case 15:
      // An accepted codebook is exactly what encoding it gives back.
      if (auto cb = kernels::decode_codebook(bytes, size); cb.ok() &&
          kernels::encode_codebook(*cb) != std::string(bytes, size))
        std::abort();
      break;
    case 16: {
      // An accepted package is exactly what encoding it gives back.
      if (auto p = runtime::decode_package(text); p.ok()) {
        (void) runtime::check_package_digest(*p);
        auto again = runtime::encode_package(*p);
        if (!again.ok() || *again != text)
          std::abort();
      }
      (void) runtime::parse_experiment_signature(text);
      break;
    }
    case 17:
      gate_record(bytes, size);
      break;
    case 18:
      // A BTARD statement read from the board: an accepted one is exactly its encoding.
      if (auto s = actors::btard::decode(text); s.ok() && actors::btard::encode(*s) != text)
        std::abort();
      break;
    case 19:
      // A BTARD membership state (in a state offered to a peer coming back): an accepted one
      // encodes to bytes that decode to the same encoding.
      if (auto m = actors::btard::membership::decode(text, {}); m.ok()) {
        auto again = actors::btard::membership::decode(m->encode(), {});
        if (!again.ok() || again->encode() != m->encode())
          std::abort();
      }
      break;
  }
  return 0;
}
