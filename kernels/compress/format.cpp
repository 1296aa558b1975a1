#include "kernels/compress/format.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/seeded_hash.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "payloads are little-endian and read in place");

namespace starling::kernels {

namespace {

constexpr std::string_view codec_names[] = {"none",       "fp16",      "bf16", "uniform8",
                                            "blockwise8", "quantile8", "topk", "randk"};
static_assert(std::size(codec_names) == codec_count);

constexpr std::string_view dtype_names[] = {"float32", "float16", "bfloat16", "float64",
                                            "uint8",   "int8",    "int16",    "int32",
                                            "int64",   "bool"};
static_assert(std::size(dtype_names) == wire_dtype_count);

constexpr int64_t int32_max = std::numeric_limits<int32_t>::max();

bool is_sparse(codec_id c) {
  return c == codec_id::topk || c == codec_id::randk;
}

float payload_f32(const uint8_t* p) {
  float x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// Checks the fields `resolve_params` derives; shared by resolve (own output) and validate.
status check_resolved(int64_t numel, codec_id codec, const codec_params& p) {
  if (p.chunk_bytes == 0 || p.chunk_bytes > max_chunk_bytes)
    return fail("chunk_bytes must be in [1, " + std::to_string(max_chunk_bytes) + "], got "
                + std::to_string(p.chunk_bytes));
  switch (codec) {
    case codec_id::blockwise8:
      if (p.block_size == 0)
        return fail("blockwise8 needs block_size >= 1");
      break;
    case codec_id::quantile8:
      if (p.sample_size == 0)
        return fail("quantile8 needs sample_size >= 1");
      break;
    case codec_id::topk:
    case codec_id::randk:
      if (p.k > static_cast<uint64_t>(numel))
        return fail(std::string{to_string(codec)} + ": k = " + std::to_string(p.k)
                    + " exceeds numel = " + std::to_string(numel));
      if (numel > 0 && p.k == 0)
        return fail(std::string{to_string(codec)} + ": k must be >= 1 for a non-empty tensor");
      if (codec == codec_id::topk) {
        if (p.index_bits != 32 && p.index_bits != 64)
          return fail("topk: index_bits must be 32 or 64, got "
                      + std::to_string(int{p.index_bits}));
        if (p.index_bits == 32 && numel - 1 > int32_max)
          return fail("topk: 32-bit indices cannot address numel = " + std::to_string(numel));
      }
      break;
    default:
      break;
  }
  return {};
}

} // namespace

std::string_view to_string(codec_id c) noexcept {
  auto i = static_cast<size_t>(c);
  return i < codec_count ? codec_names[i] : std::string_view{"unknown"};
}

result<codec_id> parse_codec(std::string_view name) {
  for (size_t i = 0; i < codec_count; ++i)
    if (codec_names[i] == name)
      return static_cast<codec_id>(i);
  return fail("unknown codec '" + std::string{name}
              + "' (expected none, fp16, bf16, uniform8, blockwise8, quantile8, topk, randk)");
}

std::string_view to_string(wire_dtype d) noexcept {
  auto i = static_cast<size_t>(d);
  return i < wire_dtype_count ? dtype_names[i] : std::string_view{"unknown"};
}

result<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  bool zero = false;
  for (auto d : shape) {
    if (d < 0)
      return fail("negative dimension " + std::to_string(d) + " in shape");
    if (d == 0) {
      zero = true;
      continue;
    }
    if (d > max_numel || n > max_numel / d)
      return fail("shape has more than 2^40 elements");
    n *= d;
  }
  return zero ? int64_t{0} : n;
}

result<codec_params> resolve_params(int64_t numel, codec_id codec, const codec_params& params) {
  if (static_cast<uint8_t>(codec) >= codec_count)
    return fail("unknown codec id " + std::to_string(static_cast<int>(codec)));
  if (numel < 0 || numel > max_numel)
    return fail("numel " + std::to_string(numel) + " out of range");
  auto p = params;
  if (is_sparse(codec)) {
    if (p.k == 0) {
      if (!(p.ratio > 0.0 && p.ratio <= 1.0))
        return fail(std::string{to_string(codec)} + ": ratio must be in (0, 1], got "
                    + std::to_string(p.ratio));
      auto k = static_cast<uint64_t>(std::ceil(p.ratio * static_cast<double>(numel)));
      p.k = std::max<uint64_t>(k, numel > 0 ? 1 : 0);
    }
    p.k = std::min<uint64_t>(p.k, static_cast<uint64_t>(numel));
    if (codec == codec_id::topk && p.index_bits == 0)
      p.index_bits = numel - 1 <= int32_max ? 32 : 64;
  }
  if (auto st = check_resolved(numel, codec, p); !st)
    return fail(st.what());
  return p;
}

uint64_t payload_bytes(int64_t numel, codec_id codec, const codec_params& p) noexcept {
  auto n = static_cast<uint64_t>(numel);
  switch (codec) {
    case codec_id::none:
      return 4 * n;
    case codec_id::fp16:
    case codec_id::bf16:
      return 2 * n;
    case codec_id::uniform8:
      return 8 + n;
    case codec_id::blockwise8: {
      uint64_t b = p.block_size == 0 ? 1 : p.block_size;
      return 4 * ((n + b - 1) / b) + n;
    }
    case codec_id::quantile8:
      return 256 * 4 + n;
    case codec_id::topk:
      return p.k * (p.index_bits / 8 + 4);
    case codec_id::randk:
      return 4 * p.k;
  }
  return 0;
}

result<uint64_t> payload_bytes_for(int64_t numel, codec_id codec, const codec_params& params) {
  auto p = resolve_params(numel, codec, params);
  if (!p)
    return p.error();
  return payload_bytes(numel, codec, *p);
}

status validate_header(const tensor_header& h) {
  if (static_cast<uint8_t>(h.dtype) >= wire_dtype_count)
    return fail("unknown dtype id " + std::to_string(static_cast<int>(h.dtype)));
  if (static_cast<uint8_t>(h.codec) >= codec_count)
    return fail("unknown codec id " + std::to_string(static_cast<int>(h.codec)));
  if (h.shape.size() > 64)
    return fail("shape has " + std::to_string(h.shape.size()) + " dimensions (at most 64)");
  auto n = checked_numel(h.shape);
  if (!n)
    return n.error();
  return check_resolved(*n, h.codec, h.params);
}

status validate(const tensor_header& h, uint64_t payload_size) {
  if (auto st = validate_header(h); !st)
    return st;
  auto n = *checked_numel(h.shape);
  auto expected = payload_bytes(n, h.codec, h.params);
  if (payload_size != expected)
    return fail(std::string{to_string(h.codec)} + " payload of " + std::to_string(n)
                + " elements must be " + std::to_string(expected) + " bytes, got "
                + std::to_string(payload_size));
  return {};
}

status check_payload(const tensor_header& h, const uint8_t* data, size_t size) {
  if (auto st = validate(h, size); !st)
    return st;
  auto n = *checked_numel(h.shape);
  switch (h.codec) {
    case codec_id::uniform8: {
      auto lo = payload_f32(data);
      auto step = payload_f32(data + 4);
      if (!std::isfinite(lo) || !std::isfinite(step) || step < 0.0f
          || !std::isfinite(255.0f * step) || !std::isfinite(lo + 255.0f * step))
        return fail("uniform8: range (lo, step) must be finite with step >= 0");
      break;
    }
    case codec_id::blockwise8: {
      auto blocks = (static_cast<uint64_t>(n) + h.params.block_size - 1) / h.params.block_size;
      for (uint64_t b = 0; b < blocks; ++b) {
        auto s = payload_f32(data + 4 * b);
        if (!std::isfinite(s) || s < 0.0f)
          return fail("blockwise8: block " + std::to_string(b) + " has a bad absmax");
      }
      break;
    }
    case codec_id::quantile8:
      for (size_t i = 0; i < 256; ++i)
        if (!std::isfinite(payload_f32(data + 4 * i)))
          return fail("quantile8: lookup table entry " + std::to_string(i) + " is not finite");
      break;
    case codec_id::topk: {
      int64_t prev = -1;
      auto k = h.params.k;
      for (uint64_t i = 0; i < k; ++i) {
        int64_t idx;
        if (h.params.index_bits == 32) {
          int32_t v;
          std::memcpy(&v, data + 4 * i, 4);
          idx = v;
        } else {
          std::memcpy(&idx, data + 8 * i, 8);
        }
        if (idx <= prev || idx >= n)
          return fail("topk: index " + std::to_string(idx) + " at position " + std::to_string(i)
                      + " is out of range or not increasing");
        prev = idx;
      }
      break;
    }
    default:
      break;
  }
  return {};
}

std::vector<int64_t> randk_indices(int64_t numel, int64_t k, uint64_t seed) {
  std::vector<int64_t> out;
  if (numel <= 0 || k <= 0)
    return out;
  if (k >= numel) {
    out.resize(static_cast<size_t>(numel));
    for (int64_t i = 0; i < numel; ++i)
      out[static_cast<size_t>(i)] = i;
    return out;
  }
  // SplitMix64 and Lemire's unbiased bounded draw: the same sequence on every platform (unlike
  // std::uniform_int_distribution, whose algorithm is implementation-defined).
  splitmix64_stream rng{seed ^ splitmix64_gamma};
  // Floyd's algorithm over a bitmap: k draws, then the set bits in increasing order.
  auto n = static_cast<uint64_t>(numel);
  std::vector<uint64_t> bits((n + 63) / 64, 0);
  auto test_set = [&bits](uint64_t i) {
    auto& w = bits[i >> 6];
    auto m = uint64_t{1} << (i & 63);
    bool was = (w & m) != 0;
    w |= m;
    return was;
  };
  for (uint64_t j = n - static_cast<uint64_t>(k); j < n; ++j) {
    auto t = rng.below(j + 1);
    if (test_set(t))
      test_set(j);
  }
  out.reserve(static_cast<size_t>(k));
  for (uint64_t w = 0; w < bits.size(); ++w) {
    auto word = bits[w];
    while (word != 0) {
      out.push_back(static_cast<int64_t>(w * 64 + static_cast<uint64_t>(__builtin_ctzll(word))));
      word &= word - 1;
    }
  }
  return out;
}

} // namespace starling::kernels
