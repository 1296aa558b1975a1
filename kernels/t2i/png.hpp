// Grayscale PNG files (Debian's libpng, its simplified png_image API) and the demo's sample grid:
// a row per caption, its samples side by side.
#pragma once

#include "kernels/result.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace starling::kernels {

/// An 8-bit grayscale image.
struct gray_image {
  /// Width in pixels.
  std::size_t width = 0;
  /// Height in pixels.
  std::size_t height = 0;
  /// height × width values, row-major.
  std::vector<uint8_t> pixels;
};

/// Largest side `read_png_gray` accepts, so a hostile header cannot ask for gigabytes.
inline constexpr std::size_t png_max_side = 16384;

/// Writes `img` as an 8-bit grayscale PNG; fails on a size mismatch or a libpng error (named).
status write_png_gray(const std::string& path, const gray_image& img);

/// Reads a PNG as 8-bit grayscale (libpng converts color and other depths); fails with libpng's
/// reason on a missing or malformed file and on a side above `png_max_side`.
result<gray_image> read_png_gray(const std::string& path);

/// The grid of `rows` rows of images (each rows[r] holds whole images of side_rows × side_cols
/// pixels in [0, 1], row-major; a short row is left black), `pad` black pixels between and around
/// the images; columns = the longest row's image count. Pixel value = round(255 · clamp(v, 0, 1)).
/// Fails when a row's size is not a whole number of images or the grid would be empty.
result<gray_image> image_grid(const std::vector<std::vector<float>>& rows, std::size_t side_rows,
                              std::size_t side_cols, std::size_t pad = 2);

} // namespace starling::kernels
