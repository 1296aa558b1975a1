// libFuzzer target: every decoder that reads untrusted bytes, torch-free. The first byte picks the
// decoder, the rest is its input:
//   0 envelope (header checks with a wire context, then every payload kind via check_payload)
//   1 envelope without a context (structure only), 2 bare Cap'n Proto tensor,
//   3 data channel frame (32-byte header, then a tensor), 4 averager data plane (preamble, frame
//   header, chunk meta), 5 token, 6 deny list, 7 hello (and a gatekeeper admitting it),
//   8 secret key file, 9 public key file, 10 token file text.
// Everything must be refused with a reason or decoded, never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "actors/auth/gatekeeper.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/token.hpp"
#include "actors/averager/plane_frame.hpp"
#include "actors/transfer/frame.hpp"
#include "messages/envelope.hpp"
#include "messages/wire.hpp"

using namespace starling;
using namespace starling::messages;
namespace auth = starling::actors::auth;

namespace {

constexpr int64_t now_ns = int64_t{1'800'000'000} * 1'000'000'000;

/// A fresh receiving context per input: fuzz inputs must not depend on earlier ones.
wire_options context_options() {
  wire_options o;
  o.experiment = "seed";
  o.clock = [] { return now_ns; };
  o.max_clock_skew_ns = 0; // seeds carry send time 0
  return o;
}

const auth::key_pair& authority() {
  // Derived once; a constant, not state.
  static const auto k = auth::key_pair::from_test_seed(100);
  return k;
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

void data_frame(const uint8_t* data, size_t size) {
  using actors::transfer::frame_header_bytes;
  if (size < frame_header_bytes)
    return;
  auto h = actors::transfer::parse_frame_header(data, frame_header_bytes);
  if (!h.ok())
    return;
  // A parsed header re-serializes to the same bytes and declares 1 .. 2^31 bytes.
  uint8_t again[frame_header_bytes];
  actors::transfer::write_frame_header(*h, again);
  if (std::memcmp(again, data, frame_header_bytes) != 0 || h->length == 0
      || h->length > max_message_bytes)
    std::abort();
  bare_tensor(reinterpret_cast<const char*>(data) + frame_header_bytes, size - frame_header_bytes);
}

void plane(const uint8_t* data, size_t size) {
  namespace av = actors::averager;
  if (size >= av::plane_preamble_bytes)
    (void) av::parse_plane_preamble(data, av::plane_preamble_bytes);
  if (size >= av::plane_frame_header_bytes) {
    auto h = av::parse_plane_frame_header(data, av::plane_frame_header_bytes);
    if (h.ok()
        && (h->meta_bytes > av::plane_max_meta_bytes
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

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  auto kind = data[0];
  ++data;
  --size;
  const auto* bytes = reinterpret_cast<const char*>(data);
  std::string_view text(bytes, size);
  switch (kind % 11) {
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
      data_frame(data, size);
      break;
    case 4:
      plane(data, size);
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
  }
  return 0;
}
