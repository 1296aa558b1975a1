#include "actors/collab/sparse_pack.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <random>

namespace starling::test::actors_sparse_pack_test {

using namespace starling::actors::collab;
using namespace starling::kernels;

namespace {

/// A valid Top-k payload of `numel` elements at density `ratio`: seeded increasing indices.
std::pair<tensor_header, std::vector<uint8_t>> topk_payload(int64_t numel, double ratio,
                                                            uint64_t seed, uint8_t bits = 0) {
  tensor_header h;
  h.shape = {numel};
  h.codec = codec_id::topk;
  codec_params p;
  p.ratio = ratio;
  p.index_bits = bits;
  h.params = resolve_params(numel, codec_id::topk, p).value();
  auto k = static_cast<size_t>(h.params.k);
  size_t ib = h.params.index_bits / 8;
  std::mt19937_64 gen(seed);
  std::vector<int64_t> idx;
  std::uniform_real_distribution<double> u(0, 1);
  // Every element kept with probability k/numel, then trimmed or filled to exactly k.
  for (int64_t i = 0; i < numel && idx.size() < k; ++i)
    if (u(gen) < ratio || static_cast<int64_t>(k - idx.size()) >= numel - i)
      idx.push_back(i);
  REQUIRE(idx.size() == k);
  std::vector<uint8_t> out(k * (ib + 4));
  std::normal_distribution<float> val;
  for (size_t i = 0; i < k; ++i) {
    if (ib == 4) {
      auto v = static_cast<int32_t>(idx[i]);
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      std::memcpy(out.data() + 8 * i, &idx[i], 8);
    }
    float x = val(gen);
    std::memcpy(out.data() + k * ib + 4 * i, &x, 4);
  }
  REQUIRE(check_payload(h, out.data(), out.size()).ok());
  return {h, out};
}

} // namespace

TEST_CASE("packed top-k payloads unpack to the codec's exact bytes") {
  for (uint8_t bits : {uint8_t{32}, uint8_t{64}}) {
    CAPTURE(int{bits});
    auto [h, payload] = topk_payload(200'000, 0.005, 3, bits);
    auto packed = pack_payload(h, payload.data(), payload.size());
    REQUIRE(packed.ok());
    auto back = unpack_payload(h, packed->data(), packed->size());
    REQUIRE(back.ok());
    CHECK(*back == payload);
  }
  // Edge: index 0, adjacent indices, the last index, k = numel.
  auto [h, payload] = topk_payload(10, 1.0, 1);
  auto packed = pack_payload(h, payload.data(), payload.size());
  REQUIRE(packed.ok());
  CHECK(packed->size() == 10 + 40); // ten zero gaps of one byte each
  CHECK(unpack_payload(h, packed->data(), packed->size()).value() == payload);
}

TEST_CASE("top-k at 0.5% packs to more than 100x fewer bytes than fp32") {
  constexpr int64_t n = 1'000'000;
  auto [h, payload] = topk_payload(n, 0.005, 9);
  auto packed = pack_payload(h, payload.data(), payload.size());
  REQUIRE(packed.ok());
  double fp32 = 4.0 * n;
  // The codec's own layout: 8 bytes per entry, 100x at best.
  CHECK(fp32 / static_cast<double>(payload.size()) <= 100.0);
  // Packed: ~1.5-byte gaps plus 4-byte values.
  CHECK(fp32 / static_cast<double>(packed->size()) >= 130.0);
}

TEST_CASE("other codecs' payloads pass unchanged") {
  tensor_header h;
  h.shape = {3};
  h.codec = codec_id::none;
  h.params = resolve_params(3, codec_id::none, {}).value();
  std::vector<uint8_t> payload(12, 0);
  auto packed = pack_payload(h, payload.data(), payload.size());
  REQUIRE(packed.ok());
  CHECK(*packed == payload);
  CHECK(unpack_payload(h, packed->data(), packed->size()).value() == payload);
  CHECK_FALSE(unpack_payload(h, packed->data(), 11).ok());
}

TEST_CASE("malformed packed top-k is refused, never a crash") {
  auto [h, payload] = topk_payload(5'000, 0.01, 4);
  auto good = pack_payload(h, payload.data(), payload.size()).value();
  auto bad = [&](std::vector<uint8_t> b) { return unpack_payload(h, b.data(), b.size()); };
  CHECK_FALSE(bad({}).ok());
  auto cut = good;
  cut.pop_back();
  CHECK_FALSE(bad(cut).ok());
  auto longer = good;
  longer.push_back(0);
  CHECK_FALSE(bad(longer).ok());
  // An index past numel.
  auto past = good;
  past[0] = 0xff;
  past[1] = 0xff;
  past[2] = 0x7f;
  CHECK_FALSE(bad(past).ok());
  // An endless varint.
  std::vector<uint8_t> endless(good.size(), 0xff);
  CHECK_FALSE(bad(endless).ok());
  // A header that lies about k cannot make it allocate k entries.
  auto lying = h;
  lying.params.k = 4'000;
  CHECK_FALSE(unpack_payload(lying, good.data(), good.size()).ok());
  // An invalid header.
  auto broken = h;
  broken.params.index_bits = 16;
  CHECK_FALSE(unpack_payload(broken, good.data(), good.size()).ok());
  // Random corruptions decode into valid payloads or are refused.
  std::mt19937_64 gen(5);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 3000; ++i) {
    auto b = good;
    for (int j = 0; j < 3; ++j)
      b[static_cast<size_t>(byte(gen)) * 7 % b.size()] = static_cast<uint8_t>(byte(gen));
    if (i % 3 == 0)
      b.resize(static_cast<size_t>(byte(gen)) * 3 % (b.size() + 1));
    auto r = bad(b);
    if (r.ok())
      CHECK(check_payload(h, r->data(), r->size()).ok());
  }
  // Packing refuses a payload that is not valid for its header.
  auto unordered = payload;
  int32_t first = 100, second = 50;
  std::memcpy(unordered.data(), &first, 4);
  std::memcpy(unordered.data() + 4, &second, 4);
  CHECK_FALSE(pack_payload(h, unordered.data(), unordered.size()).ok());
}

} // namespace starling::test::actors_sparse_pack_test
