#include "kernels/optim/quant8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the state's bytes are little-endian");

namespace starling::kernels {

namespace {

/// Decades of the logarithmic code (the smallest positive entry is 10^-decades).
constexpr double log_decades = 8.0;

std::array<float, 256> make_dynamic_signed() {
  std::vector<float> v{0.0f, 1.0f, -1.0f};
  // Decade k covers [10^-k, 10^-(k-1)] with 2^(7-k) values at the centres of equal steps.
  for (int k = 1; k <= 6; ++k) {
    int count = 1 << (7 - k);
    double low = std::pow(10.0, -k);
    for (int j = 0; j < count; ++j) {
      auto x = static_cast<float>(low * (1.0 + 9.0 * (j + 0.5) / count));
      v.push_back(x);
      v.push_back(-x);
    }
  }
  std::sort(v.begin(), v.end());
  std::array<float, 256> out{};
  std::copy(v.begin(), v.end(), out.begin());
  return out;
}

std::array<float, 256> make_log_unsigned() {
  std::array<float, 256> out{};
  out[0] = 0.0f;
  for (int i = 1; i < 256; ++i)
    out[i] = static_cast<float>(std::pow(10.0, -log_decades * (255 - i) / 254.0));
  return out;
}

const std::array<float, 256>& dynamic_table() {
  static const auto t = make_dynamic_signed();
  return t;
}

const std::array<float, 256>& log_table() {
  static const auto t = make_log_unsigned();
  return t;
}

/// Nearest-entry search over a code's magnitudes c[0] = 0 < c[1] < ... < c[k-1] = 1 in two
/// steps instead of a binary search (which, with its unpredictable branches, was most of a
/// step's time): a table indexed by a magnitude's exponent and top 7 mantissa bits gives the
/// count of boundaries below its bucket, and the few boundaries inside the bucket (every bucket
/// is narrower than 0.8%, so at most one here) are passed one by one.
struct magnitude_search {
  /// Boundaries between consecutive magnitudes: b[i] separates c[i] and c[i+1].
  std::vector<float> bounds;
  /// Per bucket (a float's bits >> 16, up to 1.0f's), the boundaries below the bucket's start.
  std::vector<uint8_t> below;

  /// `geometric`: boundaries at geometric means (nearest in log scale), except that every
  /// positive magnitude maps to c[1] or above; else arithmetic means (nearest).
  magnitude_search(const std::vector<float>& c, bool geometric) {
    for (size_t i = 0; i + 1 < c.size(); ++i)
      bounds.push_back(
          geometric ? (i == 0 ? 0.0f
                              : static_cast<float>(std::sqrt(static_cast<double>(c[i]) * c[i + 1])))
                    : 0.5f * (c[i] + c[i + 1]));
    auto buckets = (bits(1.0f) >> 16) + 1;
    below.resize(buckets);
    for (uint32_t b = 0; b < buckets; ++b) {
      float lo = from_bits(b << 16);
      below[b] =
          static_cast<uint8_t>(std::lower_bound(bounds.begin(), bounds.end(), lo) - bounds.begin());
    }
  }

  static uint32_t bits(float x) noexcept {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  }

  static float from_bits(uint32_t u) noexcept {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  }

  /// Index of the nearest magnitude to `a` in [0, 1] (ties to the smaller).
  uint8_t operator()(float a) const noexcept {
    uint32_t i = below[bits(a) >> 16];
    auto last = static_cast<uint32_t>(bounds.size());
    while (i < last && a > bounds[i])
      ++i;
    return static_cast<uint8_t>(i);
  }
};

/// The dynamic code's magnitudes: 0, its 126 positive values, 1 (the table is symmetric; the
/// sorted table's entry 127 is 0 and entry 127 + k is magnitude k, 127 - k its negative).
const magnitude_search& dynamic_search() {
  static const magnitude_search m = [] {
    const auto& t = dynamic_table();
    std::vector<float> c(t.begin() + 127, t.begin() + 255);
    return magnitude_search(c, false);
  }();
  return m;
}

const magnitude_search& log_search() {
  static const magnitude_search m = [] {
    const auto& t = log_table();
    return magnitude_search(std::vector<float>(t.begin(), t.end()), true);
  }();
  return m;
}

/// The index of 0 in the sorted dynamic table.
constexpr int dynamic_zero = 127;

void put_u32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

void put_u64(std::string& out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}

void put_floats(std::string& out, const float* p, uint64_t n) {
  if (n > 0)
    out.append(reinterpret_cast<const char*>(p), static_cast<size_t>(n) * sizeof(float));
}

void put_bytes(std::string& out, const uint8_t* p, uint64_t n) {
  if (n > 0)
    out.append(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
}

/// A bounds-checked cursor over untrusted bytes.
struct reader {
  const char* p;
  size_t left;

  bool take(void* dst, size_t n) {
    if (n > left)
      return false;
    if (n > 0)
      std::memcpy(dst, p, n);
    p += n;
    left -= n;
    return true;
  }
  template <class T>
  bool take_vector(std::vector<T>& v, uint64_t n) {
    if (n > left / sizeof(T))
      return false;
    v.resize(static_cast<size_t>(n));
    return take(v.data(), static_cast<size_t>(n) * sizeof(T));
  }
};

constexpr char magic[4] = {'S', 'T', 'L', '8'};
constexpr uint64_t max_step = uint64_t{1} << 53;
constexpr uint32_t max_tensors = uint32_t{1} << 20;

std::string at(size_t i) {
  return "lamb8 state, tensor " + std::to_string(i) + ": ";
}

bool all_finite_nonneg(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x) && x >= 0.0f; });
}

bool all_finite(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

} // namespace

const std::array<float, 256>& code8_values(code8 c) noexcept {
  return c == code8::dynamic_signed ? dynamic_table() : log_table();
}

int code8_size(code8 c) noexcept {
  return c == code8::dynamic_signed ? 255 : 256;
}

bool quantize8(code8 c, const float* x, int64_t n, uint8_t* codes, float* scales) noexcept {
  const auto& dyn = dynamic_search();
  const auto& lg = log_search();
  for (int64_t b = 0; b * quant8_block < n; ++b) {
    auto begin = b * quant8_block;
    auto end = std::min(n, begin + quant8_block);
    float absmax = 0.0f;
    for (auto i = begin; i < end; ++i) {
      if (!std::isfinite(x[i]))
        return false;
      absmax = std::max(absmax, std::fabs(x[i]));
    }
    scales[b] = absmax;
    if (absmax == 0.0f) {
      // All zeros: both codes have 0 at a fixed index.
      auto zero = c == code8::dynamic_signed ? uint8_t{dynamic_zero} : uint8_t{0};
      std::memset(codes + begin, zero, static_cast<size_t>(end - begin));
      continue;
    }
    // In double: 1 / a subnormal absmax overflows a float.
    double inv = 1.0 / absmax;
    if (c == code8::dynamic_signed) {
      for (auto i = begin; i < end; ++i) {
        auto y = static_cast<float>(x[i] * inv);
        auto k = static_cast<int>(dyn(std::min(std::fabs(y), 1.0f)));
        codes[i] = static_cast<uint8_t>(y < 0 ? dynamic_zero - k : dynamic_zero + k);
      }
    } else {
      // Negative inputs (rounding noise of a sum of squares) count as 0.
      for (auto i = begin; i < end; ++i) {
        auto y = static_cast<float>(x[i] * inv);
        codes[i] = y > 0.0f ? lg(std::min(y, 1.0f)) : uint8_t{0};
      }
    }
  }
  return true;
}

void dequantize8(code8 c, const uint8_t* codes, const float* scales, int64_t n, float* y) noexcept {
  const auto& t = code8_values(c);
  for (int64_t b = 0; b * quant8_block < n; ++b) {
    auto begin = b * quant8_block;
    auto end = std::min(n, begin + quant8_block);
    float s = scales[b];
    for (auto i = begin; i < end; ++i)
      y[i] = t[codes[i]] * s;
  }
}

std::string encode_lamb8_state(const std::vector<lamb8_tensor_ref>& tensors) {
  std::string out(magic, 4);
  put_u32(out, lamb8_format_version);
  put_u32(out, static_cast<uint32_t>(quant8_block));
  put_u32(out, static_cast<uint32_t>(tensors.size()));
  for (const auto& t : tensors) {
    put_u64(out, t.numel);
    put_u64(out, t.step);
    out.push_back(static_cast<char>(t.form));
    if (t.form == lamb8_form::full) {
      put_floats(out, t.m, t.numel);
      put_floats(out, t.v, t.numel);
    } else if (t.form == lamb8_form::quantized) {
      auto blocks = static_cast<uint64_t>(quant8_blocks(static_cast<int64_t>(t.numel)));
      put_floats(out, t.m_scales, blocks);
      put_floats(out, t.v_scales, blocks);
      put_bytes(out, t.m_codes, t.numel);
      put_bytes(out, t.v_codes, t.numel);
    }
  }
  return out;
}

result<std::vector<lamb8_tensor_state>> decode_lamb8_state(const char* data, size_t size,
                                                           const std::vector<uint64_t>* numels) {
  reader r{data, size};
  char m[4];
  uint32_t version = 0, block = 0, count = 0;
  if (!r.take(m, 4) || std::memcmp(m, magic, 4) != 0)
    return fail("not a lamb8 state (the bytes do not start with \"STL8\")");
  if (!r.take(&version, 4) || !r.take(&block, 4) || !r.take(&count, 4))
    return fail("lamb8 state: truncated header (" + std::to_string(size) + " bytes)");
  if (version != lamb8_format_version)
    return fail("lamb8 state format version " + std::to_string(version) +
                " (another starling build), this build reads version " +
                std::to_string(lamb8_format_version));
  if (block != quant8_block)
    return fail("lamb8 state in blocks of " + std::to_string(block) + ", this build uses " +
                std::to_string(quant8_block));
  if (count > max_tensors)
    return fail("lamb8 state for " + std::to_string(count) + " tensors, at most " +
                std::to_string(max_tensors));
  if (numels && numels->size() != count)
    return fail("lamb8 state for " + std::to_string(count) +
                " parameter tensors, the optimizer has " + std::to_string(numels->size()));
  std::vector<lamb8_tensor_state> out;
  out.reserve(std::min<size_t>(count, size / 17 + 1));
  for (size_t i = 0; i < count; ++i) {
    lamb8_tensor_state t;
    uint8_t form = 0;
    if (!r.take(&t.numel, 8) || !r.take(&t.step, 8) || !r.take(&form, 1))
      return fail(at(i) + "truncated");
    if (numels && (*numels)[i] != t.numel)
      return fail(at(i) + std::to_string(t.numel) + " elements, the parameter has " +
                  std::to_string((*numels)[i]));
    if (t.numel > (uint64_t{1} << 40))
      return fail(at(i) + std::to_string(t.numel) + " elements is out of range");
    if (form > static_cast<uint8_t>(lamb8_form::quantized))
      return fail(at(i) + "unknown form " + std::to_string(form));
    t.form = static_cast<lamb8_form>(form);
    if (t.form == lamb8_form::empty) {
      if (t.step != 0)
        return fail(at(i) + "step count " + std::to_string(t.step) + " without moments");
      out.push_back(std::move(t));
      continue;
    }
    if (t.step == 0 || t.step > max_step)
      return fail(at(i) + "step count " + std::to_string(t.step) + " is out of range");
    bool small = t.numel < static_cast<uint64_t>(quant8_min_numel);
    if (small != (t.form == lamb8_form::full))
      return fail(
          at(i) +
          (small ? "8-bit moments for a tensor under " : "fp32 moments for a tensor of at least ") +
          std::to_string(quant8_min_numel) + " elements");
    if (t.form == lamb8_form::full) {
      if (!r.take_vector(t.m, t.numel) || !r.take_vector(t.v, t.numel))
        return fail(at(i) + "truncated moments");
      if (!all_finite(t.m) || !all_finite_nonneg(t.v))
        return fail(at(i) + "moments are not finite or a second moment is negative");
    } else {
      auto blocks = static_cast<uint64_t>(quant8_blocks(static_cast<int64_t>(t.numel)));
      if (!r.take_vector(t.m_scales, blocks) || !r.take_vector(t.v_scales, blocks) ||
          !r.take_vector(t.m_codes, t.numel) || !r.take_vector(t.v_codes, t.numel))
        return fail(at(i) + "truncated codes or scales");
      if (!all_finite_nonneg(t.m_scales) || !all_finite_nonneg(t.v_scales))
        return fail(at(i) + "a block scale is negative or not finite");
      auto limit = code8_size(code8::dynamic_signed);
      for (auto c : t.m_codes)
        if (c >= limit)
          return fail(at(i) + "first-moment code " + std::to_string(c) +
                      " is not in the code (0.." + std::to_string(limit - 1) + ")");
    }
    out.push_back(std::move(t));
  }
  if (r.left != 0)
    return fail("lamb8 state: " + std::to_string(r.left) + " bytes after the last tensor");
  return out;
}

} // namespace starling::kernels
