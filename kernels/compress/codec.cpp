#include "kernels/compress/codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <string>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "kernels/compress/detail/loops.hpp"
#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

namespace {

// Elements per parallel work item: fixed, so results do not depend on the thread count.
constexpr int64_t work_chunk = int64_t{1} << 18;

// Calls f(begin, end) for consecutive ranges of `chunk` elements, in parallel.
template <class F>
void for_ranges(int64_t n, int64_t chunk, F&& f) {
  if (n <= 0)
    return;
  int64_t count = (n + chunk - 1) / chunk;
  at::parallel_for(0, count, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c)
      f(c * chunk, std::min(n, (c + 1) * chunk));
  });
}

// Runs a per-range predicate in parallel; true when it held for every range.
template <class F>
bool all_ranges(int64_t n, int64_t chunk, F&& f) {
  if (n <= 0)
    return true;
  int64_t count = (n + chunk - 1) / chunk;
  std::vector<uint8_t> ok(static_cast<size_t>(count), 1);
  for_ranges(n, chunk, [&](int64_t b, int64_t e) { ok[b / chunk] = f(b, e) ? 1 : 0; });
  return std::all_of(ok.begin(), ok.end(), [](uint8_t v) { return v != 0; });
}

at::Tensor as_float_contiguous(const at::Tensor& t) {
  auto x = t;
  if (!x.device().is_cpu())
    x = x.cpu();
  if (x.scalar_type() != at::kFloat)
    x = x.to(at::kFloat);
  return x.contiguous();
}

template <class T>
bool aligned_for(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % alignof(T) == 0;
}

void store_f32(uint8_t* p, float v) {
  std::memcpy(p, &v, 4);
}

float load_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

detail::range_stats parallel_stats(const float* x, int64_t n) {
  int64_t count = (n + work_chunk - 1) / work_chunk;
  std::vector<detail::range_stats> parts(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
    parts[b / work_chunk] = detail::stats(x + b, static_cast<size_t>(e - b));
  });
  detail::range_stats total;
  size_t seen = 0;
  for (int64_t c = 0; c < count; ++c) {
    auto len = static_cast<size_t>(std::min(n, (c + 1) * work_chunk) - c * work_chunk);
    detail::merge(total, parts[c], seen, len);
    seen += len;
  }
  return total;
}

bool parallel_all_finite(const float* x, int64_t n) {
  return all_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
    return detail::all_finite(x + b, static_cast<size_t>(e - b));
  });
}

failure not_finite(codec_id c) {
  return fail(std::string{to_string(c)} + ": input has inf or NaN (only codec none carries them)");
}

// Writes into `out` when suitably aligned for T, else through an aligned temporary.
template <class T, class F>
bool write_aligned(uint8_t* out, size_t count, F&& f) {
  if (aligned_for<T>(out))
    return f(reinterpret_cast<T*>(out));
  std::vector<T> tmp(count);
  bool ok = f(tmp.data());
  std::memcpy(out, tmp.data(), count * sizeof(T));
  return ok;
}

// Reads from `in` in place when suitably aligned for T, else from an aligned copy.
template <class T, class F>
void read_aligned(const uint8_t* in, size_t count, F&& f) {
  if (aligned_for<T>(in)) {
    f(reinterpret_cast<const T*>(in));
    return;
  }
  std::vector<T> tmp(count);
  std::memcpy(tmp.data(), in, count * sizeof(T));
  f(static_cast<const T*>(tmp.data()));
}

status encode_uniform8(const float* x, int64_t n, uint8_t* out) {
  auto st = parallel_stats(x, n);
  if (!st.finite)
    return not_finite(codec_id::uniform8);
  float lo = 0.0f;
  float step = 0.0f;
  if (n > 0) {
    double mean = st.sum / static_cast<double>(n);
    double var = std::max(0.0, st.sum_sq / static_cast<double>(n) - mean * mean);
    double sigma = std::sqrt(var);
    double lo_d = std::max<double>(st.min, mean - 6.0 * sigma);
    double hi_d = std::min<double>(st.max, mean + 6.0 * sigma);
    lo = static_cast<float>(lo_d);
    step = static_cast<float>(std::max(0.0, hi_d - lo_d) / 255.0);
    if (!std::isfinite(255.0f * step) || !std::isfinite(lo + 255.0f * step))
      return fail("uniform8: value range exceeds what fp32 can represent");
  }
  float inv = step > 0.0f ? 1.0f / step : 0.0f;
  if (!std::isfinite(inv))
    inv = 0.0f;
  store_f32(out, lo);
  store_f32(out + 4, step);
  uint8_t* codes = out + 8;
  for_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
    detail::uniform8_encode(x + b, codes + b, static_cast<size_t>(e - b), lo, inv);
  });
  return {};
}

status encode_blockwise8(const float* x, int64_t n, int64_t block, uint8_t* out) {
  int64_t blocks = (n + block - 1) / block;
  auto* codes = reinterpret_cast<int8_t*>(out + 4 * blocks);
  int64_t per_item = std::max<int64_t>(1, work_chunk / block);
  bool ok = all_ranges(blocks, per_item, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t begin = b * block;
      auto len = static_cast<size_t>(std::min(n, begin + block) - begin);
      float m = detail::absmax_or_negative(x + begin, len);
      if (m < 0.0f)
        return false;
      store_f32(out + 4 * b, m);
      detail::blockwise8_encode_block(x + begin, codes + begin, len, m);
    }
    return true;
  });
  if (!ok)
    return not_finite(codec_id::blockwise8);
  return {};
}

status encode_quantile8(const float* x, int64_t n, const codec_params& p, uint8_t* out) {
  if (!parallel_all_finite(x, n))
    return not_finite(codec_id::quantile8);
  float table[256] = {};
  if (n > 0) {
    std::vector<float> sample;
    auto m = std::min<int64_t>(n, p.sample_size);
    if (m == n) {
      sample.assign(x, x + n);
    } else {
      auto idx = randk_indices(n, m, p.seed);
      sample.resize(idx.size());
      for (size_t i = 0; i < idx.size(); ++i)
        sample[i] = x[idx[i]];
    }
    std::sort(sample.begin(), sample.end());
    // Level i is the mean of the sample's i-th 1/256 quantile bin: the MSE-optimal level for
    // that bin of the sample. Levels stay sorted.
    auto size = static_cast<int64_t>(sample.size());
    for (int64_t i = 0; i < 256; ++i) {
      int64_t b = i * size / 256;
      int64_t e = std::max(b + 1, (i + 1) * size / 256);
      b = std::min(b, size - 1);
      e = std::min(e, size);
      double acc = 0;
      for (int64_t j = b; j < e; ++j)
        acc += sample[j];
      table[i] = static_cast<float>(acc / static_cast<double>(e - b));
    }
    for (int i = 1; i < 256; ++i)
      table[i] = std::max(table[i], table[i - 1]);
  }
  float mid[255];
  for (int i = 0; i < 255; ++i)
    mid[i] = table[i] + (table[i + 1] - table[i]) * 0.5f;
  std::memcpy(out, table, sizeof table);
  uint8_t* codes = out + sizeof table;
  for_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
    detail::quantile8_encode(x + b, codes + b, static_cast<size_t>(e - b), mid);
  });
  return {};
}

// Indices (increasing) of the k largest |x|; among equal magnitudes the smaller index wins, so
// the result is a pure function of x and k. A seeded sample of magnitudes gives a threshold that
// a little more than k elements reach; one parallel pass collects those candidates and an exact
// selection on them keeps k. When the sample misled (fewer than k candidates), all elements are
// candidates: slower, still exact.
std::vector<int64_t> topk_indices(const float* x, int64_t n, int64_t k, uint64_t seed) {
  std::vector<int64_t> out;
  if (k >= n) {
    out.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      out[static_cast<size_t>(i)] = i;
    return out;
  }
  constexpr int64_t sample_size = int64_t{1} << 16;
  float threshold = -1.0f; // every |x| >= -1: all elements are candidates
  if (n > 4 * sample_size) {
    splitmix64_stream rng{seed ^ 0x2545f4914f6cdd1dull};
    std::vector<float> sample(static_cast<size_t>(sample_size));
    for (auto& v : sample) {
      // Multiply-shift draw in [0, n): its tiny bias only moves the threshold estimate.
      auto i = static_cast<uint64_t>((static_cast<unsigned __int128>(rng.next()) * n) >> 64);
      v = std::fabs(x[i]);
    }
    // Expected sample hits above the true threshold, plus ~4 standard deviations of slack.
    double hits = static_cast<double>(sample_size) * static_cast<double>(k) / n;
    auto rank = static_cast<int64_t>(std::ceil(hits + 4.0 * std::sqrt(hits) + 8.0));
    if (rank < sample_size) {
      std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                       std::greater<float>{});
      threshold = sample[static_cast<size_t>(rank - 1)];
    }
  }
  struct candidate {
    float mag;
    int64_t index;
  };
  auto collect = [&](float t) {
    int64_t count = (n + work_chunk - 1) / work_chunk;
    std::vector<std::vector<candidate>> parts(static_cast<size_t>(count));
    for_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
      auto& part = parts[static_cast<size_t>(b / work_chunk)];
      for (int64_t i = b; i < e; ++i) {
        float m = std::fabs(x[i]);
        if (m >= t)
          part.push_back({m, i});
      }
    });
    std::vector<candidate> all;
    size_t total = 0;
    for (const auto& p : parts)
      total += p.size();
    all.reserve(total);
    for (const auto& p : parts)
      all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  auto cand = collect(threshold);
  if (static_cast<int64_t>(cand.size()) < k)
    cand = collect(-1.0f);
  // Strict order: larger magnitude first, then smaller index.
  auto before = [](const candidate& a, const candidate& b) {
    return a.mag > b.mag || (a.mag == b.mag && a.index < b.index);
  };
  out.reserve(static_cast<size_t>(k));
  if (static_cast<int64_t>(cand.size()) == k) {
    for (const auto& c : cand)
      out.push_back(c.index);
    return out;
  }
  auto sorted = cand;
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), before);
  auto last = sorted[static_cast<size_t>(k - 1)];
  // Candidates are in index order: keeping those not after the k-th preserves that order.
  for (const auto& c : cand)
    if (!before(last, c))
      out.push_back(c.index);
  return out;
}

status encode_topk(const float* x, int64_t n, const codec_params& p, uint8_t* out) {
  if (!parallel_all_finite(x, n))
    return not_finite(codec_id::topk);
  auto k = static_cast<int64_t>(p.k);
  if (k == 0)
    return {};
  auto idx = topk_indices(x, n, k, p.seed);
  size_t ib = p.index_bits / 8;
  uint8_t* vals = out + static_cast<size_t>(k) * ib;
  for (int64_t i = 0; i < k; ++i) {
    auto j = idx[static_cast<size_t>(i)];
    if (ib == 4) {
      auto v = static_cast<int32_t>(j);
      std::memcpy(out + 4 * i, &v, 4);
    } else {
      std::memcpy(out + 8 * i, &j, 8);
    }
    store_f32(vals + 4 * i, x[j]);
  }
  return {};
}

status encode_randk(const float* x, int64_t n, const codec_params& p, uint8_t* out) {
  if (!parallel_all_finite(x, n))
    return not_finite(codec_id::randk);
  auto idx = randk_indices(n, static_cast<int64_t>(p.k), p.seed);
  for (size_t i = 0; i < idx.size(); ++i)
    store_f32(out + 4 * i, x[idx[i]]);
  return {};
}

// Decodes a checked payload into `y` (n floats).
void decode_floats(const tensor_header& h, int64_t n, const uint8_t* data, float* y) {
  const auto& p = h.params;
  switch (h.codec) {
  case codec_id::none:
    if (n > 0)
      std::memcpy(y, data, 4 * static_cast<size_t>(n));
    break;
  case codec_id::fp16:
  case codec_id::bf16:
    read_aligned<uint16_t>(data, static_cast<size_t>(n), [&](const uint16_t* in) {
      for_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
        auto len = static_cast<size_t>(e - b);
        if (h.codec == codec_id::fp16)
          detail::from_fp16(in + b, y + b, len);
        else
          detail::from_bf16(in + b, y + b, len);
      });
    });
    break;
  case codec_id::uniform8: {
    float lo = load_f32(data);
    float step = load_f32(data + 4);
    for_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
      detail::uniform8_decode(data + 8 + b, y + b, static_cast<size_t>(e - b), lo, step);
    });
    break;
  }
  case codec_id::blockwise8: {
    int64_t block = p.block_size;
    int64_t blocks = (n + block - 1) / block;
    auto* codes = reinterpret_cast<const int8_t*>(data + 4 * blocks);
    for_ranges(blocks, std::max<int64_t>(1, work_chunk / block), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t begin = b * block;
        auto len = static_cast<size_t>(std::min(n, begin + block) - begin);
        detail::blockwise8_decode_block(codes + begin, y + begin, len, load_f32(data + 4 * b));
      }
    });
    break;
  }
  case codec_id::quantile8: {
    float table[256];
    std::memcpy(table, data, sizeof table);
    for_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
      detail::quantile8_decode(data + sizeof table + b, y + b, static_cast<size_t>(e - b), table);
    });
    break;
  }
  case codec_id::topk: {
    std::fill(y, y + n, 0.0f);
    auto k = static_cast<int64_t>(p.k);
    size_t ib = p.index_bits / 8;
    const uint8_t* vals = data + static_cast<size_t>(k) * ib;
    for (int64_t i = 0; i < k; ++i) {
      int64_t idx;
      if (ib == 4) {
        int32_t v;
        std::memcpy(&v, data + 4 * i, 4);
        idx = v;
      } else {
        std::memcpy(&idx, data + 8 * i, 8);
      }
      y[idx] = load_f32(vals + 4 * i);
    }
    break;
  }
  case codec_id::randk: {
    std::fill(y, y + n, 0.0f);
    auto k = static_cast<int64_t>(p.k);
    auto idx = randk_indices(n, k, p.seed);
    auto scale = static_cast<float>(static_cast<double>(n) / static_cast<double>(k));
    for (size_t i = 0; i < idx.size(); ++i)
      y[idx[i]] = load_f32(data + 4 * i) * scale;
    break;
  }
  }
}

} // namespace

uint64_t encoded_tensor::payload_bytes() const noexcept {
  uint64_t total = 0;
  for (const auto& c : chunks)
    total += c.size();
  return total;
}

result<wire_dtype> to_wire_dtype(c10::ScalarType t) {
  switch (t) {
  case at::kFloat:
    return wire_dtype::float32;
  case at::kHalf:
    return wire_dtype::float16;
  case at::kBFloat16:
    return wire_dtype::bfloat16;
  case at::kDouble:
    return wire_dtype::float64;
  case at::kByte:
    return wire_dtype::uint8;
  case at::kChar:
    return wire_dtype::int8;
  case at::kShort:
    return wire_dtype::int16;
  case at::kInt:
    return wire_dtype::int32;
  case at::kLong:
    return wire_dtype::int64;
  case at::kBool:
    return wire_dtype::boolean;
  default:
    return fail(std::string{"unsupported dtype "} + c10::toString(t) +
                " (expected a float, integer or bool dtype)");
  }
}

c10::ScalarType to_scalar_type(wire_dtype d) noexcept {
  switch (d) {
  case wire_dtype::float32:
    return at::kFloat;
  case wire_dtype::float16:
    return at::kHalf;
  case wire_dtype::bfloat16:
    return at::kBFloat16;
  case wire_dtype::float64:
    return at::kDouble;
  case wire_dtype::uint8:
    return at::kByte;
  case wire_dtype::int8:
    return at::kChar;
  case wire_dtype::int16:
    return at::kShort;
  case wire_dtype::int32:
    return at::kInt;
  case wire_dtype::int64:
    return at::kLong;
  case wire_dtype::boolean:
    return at::kBool;
  }
  return at::kFloat;
}

result<tensor_header> make_header(const at::Tensor& t, codec_id codec, const codec_params& params) {
  if (!t.defined())
    return fail("cannot encode an undefined tensor");
  auto dt = to_wire_dtype(t.scalar_type());
  if (!dt)
    return dt.error();
  tensor_header h;
  h.dtype = *dt;
  h.shape = t.sizes().vec();
  h.codec = codec;
  auto n = checked_numel(h.shape);
  if (!n)
    return n.error();
  auto p = resolve_params(*n, codec, params);
  if (!p)
    return p.error();
  h.params = *p;
  return h;
}

status encode_into(const at::Tensor& t, const tensor_header& h, uint8_t* out, size_t size) {
  try {
    auto n = t.numel();
    if (auto st = validate(h, size); !st)
      return st;
    if (*checked_numel(h.shape) != n)
      return fail("header shape does not match the tensor");
    auto flat = as_float_contiguous(t).view({n});
    const float* x = flat.data_ptr<float>();
    switch (h.codec) {
    case codec_id::none:
      if (n > 0)
        std::memcpy(out, x, 4 * static_cast<size_t>(n));
      return {};
    case codec_id::fp16:
    case codec_id::bf16: {
      bool ok = write_aligned<uint16_t>(out, static_cast<size_t>(n), [&](uint16_t* o) {
        return all_ranges(n, work_chunk, [&](int64_t b, int64_t e) {
          auto len = static_cast<size_t>(e - b);
          return h.codec == codec_id::fp16 ? detail::to_fp16(x + b, o + b, len)
                                           : detail::to_bf16(x + b, o + b, len);
        });
      });
      if (!ok)
        return fail(std::string{to_string(h.codec)} +
                    ": input has inf or NaN, or a value beyond the format's range");
      return {};
    }
    case codec_id::uniform8:
      return encode_uniform8(x, n, out);
    case codec_id::blockwise8:
      return encode_blockwise8(x, n, h.params.block_size, out);
    case codec_id::quantile8:
      return encode_quantile8(x, n, h.params, out);
    case codec_id::topk:
      return encode_topk(x, n, h.params, out);
    case codec_id::randk:
      return encode_randk(x, n, h.params, out);
    }
    return fail("unknown codec");
  } catch (const std::exception& e) {
    return fail(std::string{"encode failed: "} + e.what());
  }
}

result<encoded_tensor> encode(const at::Tensor& t, codec_id codec, const codec_params& params) {
  auto h = make_header(t, codec, params);
  if (!h)
    return h.error();
  encoded_tensor out;
  out.header = std::move(*h);
  auto size = payload_bytes(t.numel(), codec, out.header.params);
  if (size == 0)
    return out;
  auto chunk = out.header.params.chunk_bytes;
  if (size <= chunk) {
    out.chunks.emplace_back(size);
    if (auto st = encode_into(t, out.header, out.chunks[0].data(), size); !st)
      return fail(st.what());
    return out;
  }
  std::vector<uint8_t> whole(size);
  if (auto st = encode_into(t, out.header, whole.data(), size); !st)
    return fail(st.what());
  for (uint64_t off = 0; off < size; off += chunk) {
    auto len = std::min(chunk, size - off);
    out.chunks.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(off),
                            whole.begin() + static_cast<std::ptrdiff_t>(off + len));
  }
  return out;
}

namespace {

// Converts decoded fp32 values to `st` the way decode restores integer and bool dtypes.
at::Tensor restore_dtype(at::Tensor y, c10::ScalarType st) {
  if (st == at::kFloat)
    return y;
  if (st == at::kBool)
    return y.ne(0);
  if (at::isIntegralType(st, false))
    return y.round_().to(st);
  return y.to(st);
}

// Gathers the chunks of `e` into one buffer after checking sizes against the header.
result<std::vector<uint8_t>> gather(const encoded_tensor& e) {
  uint64_t total = e.payload_bytes();
  if (auto st = validate(e.header, total); !st)
    return fail(st.what());
  std::vector<uint8_t> whole;
  whole.reserve(total);
  for (const auto& c : e.chunks)
    whole.insert(whole.end(), c.begin(), c.end());
  return whole;
}

status check_chunk_sizes(const encoded_tensor& e) {
  for (const auto& c : e.chunks)
    if (c.size() > e.header.params.chunk_bytes)
      return fail("a payload chunk of " + std::to_string(c.size()) +
                  " bytes exceeds chunk_bytes = " + std::to_string(e.header.params.chunk_bytes));
  return {};
}

} // namespace

result<at::Tensor> decode_payload(const tensor_header& h, const uint8_t* data, size_t size) {
  try {
    if (auto st = check_payload(h, data, size); !st)
      return fail(st.what());
    auto n = *checked_numel(h.shape);
    auto y = at::empty({n}, at::kFloat);
    decode_floats(h, n, data, y.data_ptr<float>());
    return restore_dtype(y.view(h.shape), to_scalar_type(h.dtype));
  } catch (const std::exception& e) {
    return fail(std::string{"decode failed: "} + e.what());
  }
}

result<at::Tensor> decode(const encoded_tensor& e) {
  if (auto st = check_chunk_sizes(e); !st)
    return fail(st.what());
  if (e.chunks.size() == 1)
    return decode_payload(e.header, e.chunks[0].data(), e.chunks[0].size());
  auto whole = gather(e);
  if (!whole)
    return whole.error();
  return decode_payload(e.header, whole->data(), whole->size());
}

status decode_into(const tensor_header& h, const uint8_t* data, size_t size, at::Tensor& out) {
  try {
    if (auto st = check_payload(h, data, size); !st)
      return st;
    auto n = *checked_numel(h.shape);
    auto st = to_scalar_type(h.dtype);
    if (!out.defined() || !out.device().is_cpu() || !out.is_contiguous() ||
        out.scalar_type() != st || out.sizes().vec() != h.shape)
      return fail(std::string{"decode_into: the output must be a contiguous CPU tensor of dtype "} +
                  c10::toString(st) + " and the header's shape");
    if (st == at::kFloat) {
      decode_floats(h, n, data, out.data_ptr<float>());
      return {};
    }
    auto y = at::empty({n}, at::kFloat);
    decode_floats(h, n, data, y.data_ptr<float>());
    out.copy_(restore_dtype(y.view(h.shape), st));
    return {};
  } catch (const std::exception& e) {
    return fail(std::string{"decode failed: "} + e.what());
  }
}

status decode_into(const encoded_tensor& e, at::Tensor& out) {
  if (auto st = check_chunk_sizes(e); !st)
    return st;
  if (e.chunks.size() == 1)
    return decode_into(e.header, e.chunks[0].data(), e.chunks[0].size(), out);
  if (e.chunks.empty())
    return decode_into(e.header, nullptr, 0, out);
  auto whole = gather(e);
  if (!whole)
    return fail(whole.error().what);
  return decode_into(e.header, whole->data(), whole->size(), out);
}

} // namespace starling::kernels
