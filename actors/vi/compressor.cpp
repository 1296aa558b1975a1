#include "actors/vi/compressor.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace starling::actors::vi {

using messages::vi_codec;
using messages::vi_vector;

namespace {

compressed finish(vi_vector wire) {
  compressed out;
  out.bits = messages::payload_bits(wire);
  auto seen = decode(wire, wire.dim);
  // Our own encodings are well-formed by construction; a failure here is a programming error.
  if (!seen)
    throw std::logic_error("vi compressor produced an undecodable vector: " + seen.error().what);
  out.seen = std::move(*seen);
  out.wire = std::move(wire);
  return out;
}

class dense_compressor final : public vector_compressor {
public:
  compressed compress(const std::vector<double>& v, std::mt19937_64&) const override {
    vi_vector w;
    w.codec = static_cast<uint8_t>(vi_codec::dense);
    w.dim = static_cast<uint32_t>(v.size());
    w.values.assign(v.begin(), v.end());
    return finish(std::move(w));
  }
  bool unbiased() const override { return true; }
  double parameter(std::size_t) const override { return 1.0; }
  std::string name() const override { return "dense"; }
};

class rand_k_compressor final : public vector_compressor {
public:
  explicit rand_k_compressor(std::size_t k) : k_(k) {}
  compressed compress(const std::vector<double>& v, std::mt19937_64& rng) const override {
    vi_vector w;
    w.codec = static_cast<uint8_t>(vi_codec::rand_k);
    w.dim = static_cast<uint32_t>(v.size());
    w.seed = rng();
    const auto k = std::min(k_, v.size());
    // Raw values travel; the receiver applies the dim/k scale, a protocol constant.
    for (auto i : rand_k_indices(w.seed, v.size(), k))
      w.values.push_back(static_cast<float>(v[i]));
    return finish(std::move(w));
  }
  bool unbiased() const override { return true; }
  double parameter(std::size_t dim) const override {
    return static_cast<double>(dim) / static_cast<double>(std::min(k_, dim));
  }
  std::string name() const override { return fmt::format("rand-k({})", k_); }

private:
  std::size_t k_;
};

class top_k_compressor final : public vector_compressor {
public:
  explicit top_k_compressor(std::size_t k) : k_(k) {}
  compressed compress(const std::vector<double>& v, std::mt19937_64&) const override {
    vi_vector w;
    w.codec = static_cast<uint8_t>(vi_codec::top_k);
    w.dim = static_cast<uint32_t>(v.size());
    const auto k = std::min(k_, v.size());
    std::vector<uint32_t> order(v.size());
    std::iota(order.begin(), order.end(), 0u);
    auto larger = [&](uint32_t a, uint32_t b) {
      auto fa = std::fabs(v[a]);
      auto fb = std::fabs(v[b]);
      return fa != fb ? fa > fb : a < b;
    };
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      larger);
    order.resize(k);
    std::sort(order.begin(), order.end());
    for (auto i : order)
      w.values.push_back(static_cast<float>(v[i]));
    w.indices = std::move(order);
    return finish(std::move(w));
  }
  bool unbiased() const override { return false; }
  double parameter(std::size_t dim) const override {
    return static_cast<double>(std::min(k_, dim)) / static_cast<double>(dim);
  }
  std::string name() const override { return fmt::format("top-k({})", k_); }

private:
  std::size_t k_;
};

} // namespace

std::unique_ptr<vector_compressor> make_dense() {
  return std::make_unique<dense_compressor>();
}

std::unique_ptr<vector_compressor> make_rand_k(std::size_t k) {
  return std::make_unique<rand_k_compressor>(std::max<std::size_t>(k, 1));
}

std::unique_ptr<vector_compressor> make_top_k(std::size_t k) {
  return std::make_unique<top_k_compressor>(std::max<std::size_t>(k, 1));
}

std::vector<uint32_t> rand_k_indices(uint64_t seed, std::size_t dim, std::size_t k) {
  // Partial Fisher–Yates with our own uniform draw: std::uniform_int_distribution is not
  // specified bit-for-bit, and sender and receiver may be built by different compilers.
  std::mt19937_64 gen{seed};
  std::vector<uint32_t> pool(dim);
  std::iota(pool.begin(), pool.end(), 0u);
  for (std::size_t i = 0; i < k; ++i) {
    const uint64_t span = dim - i;
    // Rejection sampling keeps the draw exactly uniform.
    const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t r;
    do {
      r = gen();
    } while (r >= limit);
    std::swap(pool[i], pool[i + r % span]);
  }
  pool.resize(k);
  return pool;
}

result<std::vector<double>> decode(const vi_vector& v, std::size_t expected_dim) {
  if (v.dim != expected_dim)
    return fail(fmt::format("vi vector has dim {}, expected {}", v.dim, expected_dim));
  std::vector<double> out(v.dim, 0.0);
  switch (static_cast<vi_codec>(v.codec)) {
    case vi_codec::dense:
      if (v.values.size() != v.dim || !v.indices.empty())
        return fail(fmt::format("dense vi vector carries {} values and {} indices, expected {} "
                                "values and none",
                                v.values.size(), v.indices.size(), v.dim));
      std::copy(v.values.begin(), v.values.end(), out.begin());
      return out;
    case vi_codec::rand_k: {
      const auto k = v.values.size();
      if (k == 0 || k > v.dim || !v.indices.empty())
        return fail(fmt::format("rand-k vi vector carries {} values and {} indices, expected "
                                "1..{} values and none",
                                k, v.indices.size(), v.dim));
      const double scale = static_cast<double>(v.dim) / static_cast<double>(k);
      auto idx = rand_k_indices(v.seed, v.dim, k);
      for (std::size_t i = 0; i < k; ++i)
        out[idx[i]] = scale * static_cast<double>(v.values[i]);
      return out;
    }
    case vi_codec::top_k:
      if (v.indices.size() != v.values.size() || v.values.size() > v.dim)
        return fail(fmt::format("top-k vi vector carries {} values and {} indices, expected "
                                "equal counts of at most {}",
                                v.values.size(), v.indices.size(), v.dim));
      for (std::size_t i = 0; i < v.values.size(); ++i) {
        if (v.indices[i] >= v.dim)
          return fail(fmt::format("top-k vi vector index {} is {}, expected < {}", i,
                                  v.indices[i], v.dim));
        out[v.indices[i]] = static_cast<double>(v.values[i]);
      }
      return out;
  }
  return fail(fmt::format("vi vector has unknown codec {}, expected 0 (dense), 1 (rand-k) or "
                          "2 (top-k)",
                          static_cast<int>(v.codec)));
}

} // namespace starling::actors::vi
