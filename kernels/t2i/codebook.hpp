// The patch codebook of the text-to-image demo: K codes of patch×patch grayscale pixels, its
// digest (what joiners compare with the one the run publishes) and its file format. Torch-free,
// so the decoder joins the fuzzed layer (tests/fuzz).
#pragma once

#include "kernels/result.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace starling::kernels {

/// K codes, each a patch×patch block of pixels in [0, 1] (row-major), the centroids of a k-means
/// over image patches; a patch's token is the index of its nearest code.
struct patch_codebook {
  /// Side of a patch in pixels.
  uint32_t patch = 4;
  /// size() × dim() values, code after code.
  std::vector<float> codes;

  /// Pixels per code (patch²).
  std::size_t dim() const noexcept { return std::size_t{patch} * patch; }
  /// Number of codes K.
  std::size_t size() const noexcept { return dim() == 0 ? 0 : codes.size() / dim(); }
};

/// Largest patch side a codebook may have.
inline constexpr uint32_t codebook_max_patch = 28;
/// Largest number of codes a codebook may have (a token must fit the GPT's vocabulary).
inline constexpr std::size_t codebook_max_codes = 65536;

/// Checks a codebook: patch in [1, 28], 1..65536 codes, a whole number of codes, every value
/// finite and in [0, 1].
status validate(const patch_codebook& cb);

/// BLAKE2b-256 (libsodium) of a domain tag, the patch side, K and the codes as little-endian
/// float32, as 64 lowercase hex digits: equal codebooks, equal digests, on every platform.
std::string codebook_digest(const patch_codebook& cb);

/// The file bytes: "STCB", version u32, patch u32, K u32 (little-endian), the codes as
/// little-endian float32, then the 32-byte digest of everything before it.
std::string encode_codebook(const patch_codebook& cb);

/// Reads `encode_codebook`'s bytes; fails with a reason on a wrong magic or version, sizes out of
/// range, a length that is not exactly the header's, values outside [0, 1], or a digest mismatch.
result<patch_codebook> decode_codebook(const char* bytes, std::size_t size);

/// Writes `encode_codebook(cb)` to `path` (through a temporary file renamed into place).
status save_codebook(const std::string& path, const patch_codebook& cb);

/// Reads and decodes the file at `path`; when `expected_digest` is not empty, also fails unless
/// the codebook's digest equals it (a joiner checking the run's published digest).
result<patch_codebook> load_codebook(const std::string& path,
                                     const std::string& expected_digest = {});

} // namespace starling::kernels
