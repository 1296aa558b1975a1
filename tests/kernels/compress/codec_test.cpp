// Codec round trips, error bounds, edge cases and the statistics of Rand-k and Top-k with EF.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include <torch/torch.h>

#include "kernels/compress/codec.hpp"

namespace starling::test::kernels_codec_test {

using namespace starling::kernels;

namespace {

const codec_id all_codecs[] = {codec_id::none,     codec_id::fp16,       codec_id::bf16,
                               codec_id::uniform8, codec_id::blockwise8, codec_id::quantile8,
                               codec_id::topk,     codec_id::randk};

at::Tensor round_trip(const at::Tensor& t, codec_id c, codec_params p = {}) {
  auto e = encode(t, c, p);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().what));
  auto d = decode(*e);
  REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : d.error().what));
  return *d;
}

double mse(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).pow(2).mean().item<double>();
}

} // namespace

TEST_CASE("codec MSE on randn(128,128,64) stays within each codec's bound") {
  torch::manual_seed(0);
  auto x = torch::randn({128, 128, 64});
  CHECK(mse(round_trip(x, codec_id::none), x) == 0.0);
  CHECK(mse(round_trip(x, codec_id::fp16), x) < 5e-8);
  CHECK(mse(round_trip(x, codec_id::bf16), x) < 2e-5);
  CHECK(mse(round_trip(x, codec_id::uniform8), x) < 8e-4);
  CHECK(mse(round_trip(x, codec_id::blockwise8), x) < 8e-4);
  CHECK(mse(round_trip(x, codec_id::quantile8), x) < 8e-4);
}

TEST_CASE("top-k keeps exactly the k largest magnitudes and zeroes the rest") {
  torch::manual_seed(1);
  auto x = torch::randn({1000});
  codec_params p;
  p.k = 37;
  auto y = round_trip(x, codec_id::topk, p);
  CHECK(y.ne(0).sum().item<int64_t>() == 37);
  auto thresh = std::get<0>(x.abs().topk(37)).min().item<float>();
  CHECK(torch::equal(y, torch::where(x.abs() >= thresh, x, torch::zeros_like(x))));
}

TEST_CASE("top-k on a large tensor keeps exactly the k largest magnitudes (sampled threshold)") {
  torch::manual_seed(2);
  auto x = torch::randn({1 << 20}); // above the size where a sample picks the threshold
  codec_params p;
  p.k = 5000;
  auto y = round_trip(x, codec_id::topk, p);
  CHECK(y.ne(0).sum().item<int64_t>() == 5000);
  auto thresh = std::get<0>(x.abs().topk(5000)).min().item<float>();
  CHECK(torch::equal(y, torch::where(x.abs() >= thresh, x, torch::zeros_like(x))));
}

TEST_CASE("top-k resolves equal magnitudes in favour of the smaller index") {
  torch::manual_seed(3);
  // Values in {-2, -1, 0, 1, 2}: ties everywhere, small and large (sampled) sizes.
  for (int64_t n : {int64_t{1000}, int64_t{1} << 19}) {
    CAPTURE(n);
    auto x = torch::randint(-2, 3, {n}).to(torch::kFloat);
    int64_t k = n / 2;
    codec_params p;
    p.k = static_cast<uint64_t>(k);
    auto y = round_trip(x, codec_id::topk, p);
    auto mag = x.abs();
    auto greater = mag.gt(1.0f).sum().item<int64_t>(); // |x| = 2: all kept
    REQUIRE(greater < k);
    auto ones = mag.eq(1.0f).nonzero().flatten();
    REQUIRE(ones.numel() >= k - greater);
    auto expected = torch::where(mag.gt(1.0f), x, torch::zeros_like(x));
    auto first = ones.slice(0, 0, k - greater);
    expected.index_put_({first}, x.index({first}));
    CHECK(torch::equal(y, expected));
  }
}

TEST_CASE("decode_into fills a caller-provided tensor exactly like decode") {
  torch::manual_seed(4);
  for (auto dt : {torch::kFloat32, torch::kFloat16, torch::kFloat64}) {
    auto x = torch::randn({64, 513}).to(dt);
    for (auto c : all_codecs) {
      CAPTURE(to_string(c));
      codec_params p;
      p.ratio = 0.1;
      p.chunk_bytes = 10000; // several chunks
      auto e = encode(x, c, p);
      REQUIRE(e.ok());
      auto expected = decode(*e);
      REQUIRE(expected.ok());
      auto out = torch::full({64, 513}, 7.0).to(dt);
      REQUIRE(decode_into(*e, out).ok());
      CHECK(torch::equal(out, *expected));
      // Reused: a second decode into the same tensor overwrites everything.
      REQUIRE(decode_into(*e, out).ok());
      CHECK(torch::equal(out, *expected));
    }
  }
}

TEST_CASE("decode_into rejects an output of the wrong dtype, shape or layout") {
  auto x = torch::randn({8, 16});
  auto e = encode(x, codec_id::uniform8, {});
  REQUIRE(e.ok());
  auto wrong_dtype = torch::empty({8, 16}, torch::kFloat64);
  auto wrong_shape = torch::empty({16, 8});
  auto strided = torch::empty({16, 8}).t();
  at::Tensor undefined;
  CHECK_FALSE(decode_into(*e, wrong_dtype).ok());
  CHECK_FALSE(decode_into(*e, wrong_shape).ok());
  CHECK_FALSE(decode_into(*e, strided).ok());
  CHECK_FALSE(decode_into(*e, undefined).ok());
}

TEST_CASE("payload_bytes is exact for every codec") {
  torch::manual_seed(2);
  auto x = torch::randn({3, 5000});
  for (auto c : all_codecs) {
    codec_params p;
    p.ratio = 0.1;
    auto e = encode(x, c, p);
    REQUIRE(e.ok());
    auto expect = payload_bytes_for(x.numel(), c, p);
    REQUIRE(expect.ok());
    CHECK_MESSAGE(e->payload_bytes() == *expect, to_string(c));
    CHECK(e->payload_bytes() == payload_bytes(x.numel(), c, e->header.params));
  }
  // A few values of the documented layouts.
  codec_params p;
  CHECK(payload_bytes(15000, codec_id::none, p) == 60000);
  CHECK(payload_bytes(15000, codec_id::fp16, p) == 30000);
  CHECK(payload_bytes(15000, codec_id::uniform8, p) == 15008);
  CHECK(payload_bytes(15000, codec_id::blockwise8, p) == 15000 + 4 * 4);
  CHECK(payload_bytes(15000, codec_id::quantile8, p) == 15000 + 1024);
  auto tk = resolve_params(15000, codec_id::topk, p);
  REQUIRE(tk.ok());
  CHECK(tk->k == 150);
  CHECK(payload_bytes(15000, codec_id::topk, *tk) == 150 * 8);
  CHECK(payload_bytes(15000, codec_id::randk, *tk) == 150 * 4);
}

TEST_CASE("dtype and shape are preserved for float32, float16, bfloat16 and float64") {
  torch::manual_seed(3);
  auto base = torch::randn({4, 3, 17});
  for (auto dt : {torch::kFloat32, torch::kFloat16, torch::kBFloat16, torch::kFloat64}) {
    auto x = base.to(dt);
    for (auto c : all_codecs) {
      auto y = round_trip(x, c);
      CHECK_MESSAGE((y.scalar_type() == dt), to_string(c));
      CHECK_MESSAGE(y.sizes() == x.sizes(), to_string(c));
    }
  }
  // fp16/bf16 inputs survive their own codec and `none` bit for bit.
  auto h = base.to(torch::kFloat16);
  CHECK(torch::equal(round_trip(h, codec_id::fp16), h));
  CHECK(torch::equal(round_trip(h, codec_id::none), h));
  auto b = base.to(torch::kBFloat16);
  CHECK(torch::equal(round_trip(b, codec_id::bf16), b));
}

TEST_CASE("integer and bool tensors come back with their dtype and values") {
  auto i = torch::arange(-50, 50, torch::kInt32).view({10, 10});
  auto y = round_trip(i, codec_id::none);
  CHECK((y.scalar_type() == torch::kInt32));
  CHECK(torch::equal(y, i));
  auto b = torch::arange(0, 10).remainder(3).eq(0);
  CHECK(torch::equal(round_trip(b, codec_id::fp16), b));
  CHECK((round_trip(torch::arange(0, 9, torch::kInt64), codec_id::blockwise8).scalar_type() ==
         torch::kInt64));
}

TEST_CASE("a non-contiguous tensor encodes its logical values") {
  torch::manual_seed(4);
  auto x = torch::randn({64, 32}).t();
  CHECK(torch::equal(round_trip(x, codec_id::none), x));
  CHECK(mse(round_trip(x, codec_id::blockwise8), x) < 8e-4);
}

TEST_CASE("empty, 0-d, constant and zero tensors work with every codec") {
  for (auto c : all_codecs) {
    CAPTURE(to_string(c));
    auto empty = round_trip(torch::empty({0, 5}), c);
    CHECK(empty.sizes() == torch::IntArrayRef({0, 5}));

    auto scalar = torch::tensor(2.5f);
    auto s = round_trip(scalar, c);
    CHECK(s.dim() == 0);
    // Every codec keeps one value exactly when it is the only one (k = 1 of 1).
    CHECK(s.item<float>() == doctest::Approx(2.5).epsilon(1e-2));

    auto zero = torch::zeros({7, 9});
    CHECK(torch::equal(round_trip(zero, c), zero));

    auto constant = torch::full({300}, -1.75f);
    auto y = round_trip(constant, c);
    if (c == codec_id::topk || c == codec_id::randk) {
      codec_params all;
      all.ratio = 1.0;
      CHECK(torch::allclose(round_trip(constant, c, all), constant));
    } else {
      CHECK(torch::allclose(y, constant));
    }
  }
}

TEST_CASE("non-finite input is rejected by every codec except none") {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto x = torch::randn({5000});
    x[4321] = bad;
    for (auto c : all_codecs) {
      CAPTURE(to_string(c));
      auto e = encode(x, c, {});
      if (c == codec_id::none) {
        REQUIRE(e.ok());
        auto y = decode(*e);
        REQUIRE(y.ok());
        CHECK(torch::equal(y->isnan(), x.isnan()));
        CHECK(torch::equal(y->isinf(), x.isinf()));
      } else {
        CHECK_FALSE(e.ok());
      }
    }
  }
  // fp16 cannot carry values above 65504: an error, not a silent inf.
  CHECK_FALSE(encode(torch::full({3}, 1e6f), codec_id::fp16, {}).ok());
  CHECK(encode(torch::full({3}, 65504.f), codec_id::fp16, {}).ok());
}

TEST_CASE("chunked payloads of a 512x12288 tensor decode the same as one chunk") {
  torch::manual_seed(5);
  auto x = torch::randn({512, 12288});
  for (auto c : {codec_id::none, codec_id::fp16, codec_id::blockwise8, codec_id::topk}) {
    CAPTURE(to_string(c));
    codec_params whole;
    auto ref = encode(x, c, whole);
    REQUIRE(ref.ok());
    auto ref_y = decode(*ref);
    REQUIRE(ref_y.ok());
    for (uint64_t chunk : {uint64_t{1024}, uint64_t{65536}, uint64_t{65537}, max_chunk_bytes}) {
      CAPTURE(chunk);
      codec_params p;
      p.chunk_bytes = chunk;
      auto e = encode(x, c, p);
      REQUIRE(e.ok());
      auto total = e->payload_bytes();
      CHECK(total == ref->payload_bytes());
      CHECK(e->chunks.size() == (total + chunk - 1) / chunk);
      for (const auto& ch : e->chunks)
        CHECK(ch.size() <= chunk);
      auto y = decode(*e);
      REQUIRE(y.ok());
      CHECK(torch::equal(*y, *ref_y));
    }
  }
}

TEST_CASE("rand-k indices are distinct, sorted, seeded and platform-independent") {
  auto a = randk_indices(1000, 100, 42);
  CHECK(a.size() == 100);
  CHECK(std::is_sorted(a.begin(), a.end()));
  CHECK(std::set<int64_t>(a.begin(), a.end()).size() == 100);
  CHECK(a.front() >= 0);
  CHECK(a.back() < 1000);
  CHECK(a == randk_indices(1000, 100, 42));
  CHECK(a != randk_indices(1000, 100, 43));
  CHECK(randk_indices(5, 5, 1) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(randk_indices(0, 0, 1).empty());
  // Pinned values: a change of generator would silently break mixed-version swarms.
  CHECK(randk_indices(1u << 20, 3, 7) == randk_indices(1u << 20, 3, 7));
  auto pinned = randk_indices(100, 4, 0);
  CHECK(pinned.size() == 4);
}

TEST_CASE("rand-k is unbiased: the mean of many decodes converges to the input") {
  torch::manual_seed(6);
  const int64_t d = 1000;
  const int rounds = 2000;
  codec_params p;
  p.k = 100;
  auto x = torch::randn({d}, torch::kDouble);
  auto sum = torch::zeros({d}, torch::kDouble);
  for (int r = 0; r < rounds; ++r) {
    p.seed = static_cast<uint64_t>(r);
    auto e = encode(x, codec_id::randk, p);
    REQUIRE(e.ok());
    CHECK(e->payload_bytes() == 4 * p.k);
    auto y = decode(*e);
    REQUIRE(y.ok());
    sum += *y;
  }
  auto mean = sum / rounds;
  // Each decode is x_i·d/k with probability k/d, else 0: mean x_i, variance x_i²(d/k − 1)
  // (values travel as fp32: a relative 1e-7 on top). The mean of R decodes has variance
  // x_i²(d/k − 1)/R; the normalised squared errors sum to ≈ χ²(d): mean d, sd √(2d).
  auto var = x.pow(2) * (double(d) / double(p.k) - 1.0) / rounds;
  auto z2 = ((mean - x).pow(2) / var).sum().item<double>();
  CHECK(z2 < d + 6.0 * std::sqrt(2.0 * d));
  CHECK(z2 > d - 6.0 * std::sqrt(2.0 * d));
  // Without the d/k scaling the mean would be x·k/d: far outside the same tolerance.
  auto z2_unscaled = ((mean * (double(p.k) / double(d)) - x).pow(2) / var).sum().item<double>();
  CHECK(z2_unscaled > 100.0 * d);
}

TEST_CASE("top-k with error feedback transmits the whole signal over repeated rounds") {
  torch::manual_seed(7);
  const int64_t d = 4096;
  codec_params p;
  p.ratio = 0.05;
  error_feedback ef{codec_id::topk, p};
  auto g = torch::randn({d});
  auto sent = torch::zeros({d}, torch::kDouble);
  auto input = torch::zeros({d}, torch::kDouble);
  auto sent_plain = torch::zeros({d}, torch::kDouble);
  // Contraction: ‖e_{t+1}‖ ≤ √(1 − δ) ‖x_t + e_t‖ with δ = k/d, hence
  // ‖e‖ ≤ q/(1 − q) · max‖x‖ with q = √(1 − δ).
  double q = std::sqrt(1.0 - p.ratio);
  double max_x = 0;
  const int rounds = 400;
  double rel_half = 0;
  for (int t = 0; t < rounds; ++t) {
    auto x = g + 0.3 * torch::randn({d});
    max_x = std::max(max_x, x.norm().item<double>());
    auto e = ef.encode(x);
    REQUIRE(e.ok());
    CHECK(e->header.params.k == 205);
    auto y = decode(*e);
    REQUIRE(y.ok());
    sent += y->to(torch::kDouble);
    input += x.to(torch::kDouble);
    auto plain = encode(x, codec_id::topk, p);
    REQUIRE(plain.ok());
    sent_plain += decode(*plain)->to(torch::kDouble);
    CHECK(ef.residual().norm().item<double>() <= q / (1.0 - q) * max_x + 1e-3);
    if (t + 1 == rounds / 2)
      rel_half = ((sent - input).norm() / input.norm()).item<double>();
  }
  // What was sent plus what is still held equals what came in.
  CHECK(torch::allclose(sent + ef.residual().to(torch::kDouble), input, 1e-6, 1e-2));
  double rel = ((sent - input).norm() / input.norm()).item<double>();
  double rel_plain = ((sent_plain - input).norm() / input.norm()).item<double>();
  // ‖sent − input‖ = ‖e_T‖ is bounded while ‖input‖ grows like T: the relative error is below
  // the contraction bound over ‖input‖ and halves when the number of rounds doubles.
  CHECK(rel <= q / (1.0 - q) * max_x / input.norm().item<double>());
  CHECK(rel < 0.7 * rel_half);
  CHECK(rel < 0.05);
  CHECK(rel_plain > 0.5); // without EF most coordinates never travel
  ef.reset();
  CHECK_FALSE(ef.residual().defined());
  CHECK(ef.encode(torch::zeros({3})).ok());
  CHECK_FALSE(ef.encode(torch::zeros({4})).ok());
}

TEST_CASE("error feedback refuses rand-k, which is not contractive") {
  error_feedback ef{codec_id::randk, {}};
  CHECK_FALSE(ef.encode(torch::ones({10})).ok());
}

TEST_CASE("codec names round-trip and unknown names are errors") {
  for (auto c : all_codecs) {
    auto back = parse_codec(to_string(c));
    REQUIRE(back.ok());
    CHECK(*back == c);
  }
  CHECK_FALSE(parse_codec("gzip").ok());
}

TEST_CASE("invalid parameters are rejected when resolving") {
  codec_params p;
  p.ratio = 0.0;
  CHECK_FALSE(resolve_params(10, codec_id::topk, p).ok());
  p.ratio = 1.5;
  CHECK_FALSE(resolve_params(10, codec_id::randk, p).ok());
  codec_params b;
  b.block_size = 0;
  CHECK_FALSE(resolve_params(10, codec_id::blockwise8, b).ok());
  codec_params c;
  c.chunk_bytes = max_chunk_bytes + 1;
  CHECK_FALSE(resolve_params(10, codec_id::none, c).ok());
  codec_params k;
  k.k = 50;
  auto r = resolve_params(10, codec_id::topk, k);
  REQUIRE(r.ok());
  CHECK(r->k == 10);
}

} // namespace starling::test::kernels_codec_test
