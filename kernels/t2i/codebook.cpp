#include "kernels/t2i/codebook.hpp"

#include <sodium.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace starling::kernels {

// Names prefixed `codebook_`: in a unity build this file shares a translation unit with other
// decoders that have their own `magic` and `put_u32`.
namespace {

constexpr char codebook_magic[4] = {'S', 'T', 'C', 'B'};
constexpr uint32_t codebook_format_version = 1;
constexpr std::size_t codebook_header_bytes = 16;
constexpr std::size_t codebook_digest_bytes = 32;
constexpr char codebook_domain_tag[] = "starling patch codebook v1";

void codebook_put_u32(std::string& out, uint32_t v) {
  for (int b = 0; b < 4; ++b)
    out.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
}

uint32_t codebook_get_u32(const char* p) {
  uint32_t v = 0;
  for (int b = 0; b < 4; ++b)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[b])) << (8 * b);
  return v;
}

/// The codes as little-endian float32 bytes (the same on every host).
std::string codebook_code_bytes(const std::vector<float>& codes) {
  std::string out;
  out.reserve(codes.size() * 4);
  for (float f : codes) {
    uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    codebook_put_u32(out, bits);
  }
  return out;
}

/// BLAKE2b-256 of the tag, the header fields and the code bytes.
void codebook_digest_of(uint32_t patch, uint32_t count, const std::string& codes,
               unsigned char (&out)[codebook_digest_bytes]) {
  if (sodium_init() < 0)
    std::abort();
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, codebook_digest_bytes);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(codebook_domain_tag),
                            sizeof(codebook_domain_tag) - 1);
  std::string h;
  codebook_put_u32(h, patch);
  codebook_put_u32(h, count);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(h.data()), h.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(codes.data()),
                            codes.size());
  crypto_generichash_final(&st, out, codebook_digest_bytes);
}

std::string hex(const unsigned char* bytes, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(digits[bytes[i] >> 4]);
    out.push_back(digits[bytes[i] & 15]);
  }
  return out;
}

} // namespace

status validate(const patch_codebook& cb) {
  if (cb.patch < 1 || cb.patch > codebook_max_patch)
    return fail("codebook patch side must be in [1, " + std::to_string(codebook_max_patch) +
                "], got " + std::to_string(cb.patch));
  if (cb.codes.empty() || cb.codes.size() % cb.dim() != 0)
    return fail("codebook holds " + std::to_string(cb.codes.size()) +
                " values, expected a positive multiple of " + std::to_string(cb.dim()));
  if (cb.size() > codebook_max_codes)
    return fail("codebook has " + std::to_string(cb.size()) + " codes, at most " +
                std::to_string(codebook_max_codes) + " allowed");
  for (std::size_t i = 0; i < cb.codes.size(); ++i) {
    float v = cb.codes[i];
    if (!(v >= 0.0f && v <= 1.0f)) // also false for NaN
      return fail("codebook value " + std::to_string(i) + " is " + std::to_string(v) +
                  ", expected a pixel in [0, 1]");
  }
  return {};
}

std::string codebook_digest(const patch_codebook& cb) {
  unsigned char d[codebook_digest_bytes];
  codebook_digest_of(cb.patch, static_cast<uint32_t>(cb.size()), codebook_code_bytes(cb.codes), d);
  return hex(d, codebook_digest_bytes);
}

std::string encode_codebook(const patch_codebook& cb) {
  std::string out(codebook_magic, sizeof(codebook_magic));
  codebook_put_u32(out, codebook_format_version);
  codebook_put_u32(out, cb.patch);
  codebook_put_u32(out, static_cast<uint32_t>(cb.size()));
  auto codes = codebook_code_bytes(cb.codes);
  out += codes;
  unsigned char d[codebook_digest_bytes];
  codebook_digest_of(cb.patch, static_cast<uint32_t>(cb.size()), codes, d);
  out.append(reinterpret_cast<const char*>(d), codebook_digest_bytes);
  return out;
}

result<patch_codebook> decode_codebook(const char* bytes, std::size_t size) {
  if (size < codebook_header_bytes + codebook_digest_bytes)
    return fail("codebook file has " + std::to_string(size) + " bytes, shorter than its " +
                std::to_string(codebook_header_bytes + codebook_digest_bytes) + "-byte header and digest");
  if (std::memcmp(bytes, codebook_magic, sizeof(codebook_magic)) != 0)
    return fail("not a codebook file (expected codebook_magic \"STCB\")");
  uint32_t version = codebook_get_u32(bytes + 4);
  if (version != codebook_format_version)
    return fail("codebook format version " + std::to_string(version) + ", this build reads " +
                std::to_string(codebook_format_version));
  patch_codebook cb;
  cb.patch = codebook_get_u32(bytes + 8);
  uint32_t count = codebook_get_u32(bytes + 12);
  if (cb.patch < 1 || cb.patch > codebook_max_patch)
    return fail("codebook patch side " + std::to_string(cb.patch) + " is outside [1, " +
                std::to_string(codebook_max_patch) + "]");
  if (count < 1 || count > codebook_max_codes)
    return fail("codebook code count " + std::to_string(count) + " is outside [1, " +
                std::to_string(codebook_max_codes) + "]");
  // Both factors are bounded above, so the product cannot overflow.
  std::size_t values = std::size_t{count} * cb.dim();
  std::size_t expected = codebook_header_bytes + 4 * values + codebook_digest_bytes;
  if (size != expected)
    return fail("codebook file has " + std::to_string(size) + " bytes, its header announces " +
                std::to_string(expected));
  std::string codes(bytes + codebook_header_bytes, 4 * values);
  unsigned char d[codebook_digest_bytes];
  codebook_digest_of(cb.patch, count, codes, d);
  if (sodium_memcmp(d, bytes + codebook_header_bytes + 4 * values, codebook_digest_bytes) != 0)
    return fail("codebook digest does not match its contents (corrupted file)");
  cb.codes.resize(values);
  for (std::size_t i = 0; i < values; ++i) {
    uint32_t bits = codebook_get_u32(codes.data() + 4 * i);
    std::memcpy(&cb.codes[i], &bits, 4);
  }
  if (auto st = validate(cb); !st)
    return fail(st.what());
  return cb;
}

status save_codebook(const std::string& path, const patch_codebook& cb) {
  if (auto st = validate(cb); !st)
    return st;
  auto bytes = encode_codebook(cb);
  auto tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return fail("cannot write codebook file " + tmp);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out)
      return fail("cannot write codebook file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return fail("cannot rename " + tmp + " to " + path);
  return {};
}

result<patch_codebook> load_codebook(const std::string& path, const std::string& expected_digest) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail("cannot read codebook file " + path);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  auto cb = decode_codebook(bytes.data(), bytes.size());
  if (!cb)
    return fail(path + ": " + cb.error().what);
  if (!expected_digest.empty()) {
    auto d = codebook_digest(*cb);
    if (d != expected_digest)
      return fail(path + ": codebook digest " + d + " differs from the published " +
                  expected_digest);
  }
  return cb;
}

} // namespace starling::kernels
