#include "kernels/t2i/png.hpp"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace starling::kernels {

status write_png_gray(const std::string& path, const gray_image& img) {
  if (img.width == 0 || img.height == 0 || img.pixels.size() != img.width * img.height)
    return fail("cannot write " + path + ": an image of " + std::to_string(img.width) + "×" +
                std::to_string(img.height) + " needs that many pixels, got " +
                std::to_string(img.pixels.size()));
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(img.width);
  png.height = static_cast<png_uint_32>(img.height);
  png.format = PNG_FORMAT_GRAY;
  if (!png_image_write_to_file(&png, path.c_str(), 0, img.pixels.data(), 0, nullptr)) {
    std::string why = png.message;
    png_image_free(&png);
    return fail("cannot write " + path + ": " + why);
  }
  return {};
}

result<gray_image> read_png_gray(const std::string& path) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&png, path.c_str())) {
    std::string why = png.message;
    png_image_free(&png);
    return fail("cannot read " + path + " as PNG: " + why);
  }
  if (png.width == 0 || png.height == 0 || png.width > png_max_side || png.height > png_max_side) {
    png_image_free(&png);
    return fail(path + ": PNG of " + std::to_string(png.width) + "×" + std::to_string(png.height) +
                " pixels, sides must be in [1, " + std::to_string(png_max_side) + "]");
  }
  png.format = PNG_FORMAT_GRAY;
  gray_image img;
  img.width = png.width;
  img.height = png.height;
  img.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr)) {
    std::string why = png.message;
    png_image_free(&png);
    return fail("cannot read " + path + " as PNG: " + why);
  }
  return img;
}

result<gray_image> image_grid(const std::vector<std::vector<float>>& rows, std::size_t side_rows,
                              std::size_t side_cols, std::size_t pad) {
  std::size_t per = side_rows * side_cols, columns = 0;
  if (per == 0 || rows.empty())
    return fail("a grid needs at least one row and images of at least one pixel");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].size() % per != 0)
      return fail("grid row " + std::to_string(r) + " holds " + std::to_string(rows[r].size()) +
                  " values, not a whole number of " + std::to_string(side_rows) + "×" +
                  std::to_string(side_cols) + " images");
    columns = std::max(columns, rows[r].size() / per);
  }
  if (columns == 0)
    return fail("a grid needs at least one image");
  gray_image g;
  g.width = pad + columns * (side_cols + pad);
  g.height = pad + rows.size() * (side_rows + pad);
  if (g.width > png_max_side || g.height > png_max_side)
    return fail("grid of " + std::to_string(g.width) + "×" + std::to_string(g.height) +
                " pixels is larger than " + std::to_string(png_max_side));
  g.pixels.assign(g.width * g.height, 0);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t i = 0; i < rows[r].size() / per; ++i)
      for (std::size_t y = 0; y < side_rows; ++y)
        for (std::size_t x = 0; x < side_cols; ++x) {
          float v = rows[r][i * per + y * side_cols + x];
          v = std::isnan(v) ? 0.0f : std::clamp(v, 0.0f, 1.0f);
          auto gy = pad + r * (side_rows + pad) + y, gx = pad + i * (side_cols + pad) + x;
          g.pixels[gy * g.width + gx] = static_cast<uint8_t>(std::lround(v * 255.0f));
        }
  return g;
}

} // namespace starling::kernels
