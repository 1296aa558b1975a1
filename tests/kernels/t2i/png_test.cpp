#include "kernels/t2i/png.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace starling::test::kernels_t2i_png_test {

using namespace starling::kernels;
namespace fs = std::filesystem;

namespace {

std::string temp_file(const std::string& name) {
  return (fs::temp_directory_path() /
          ("starling-png-test-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

} // namespace

TEST_CASE("a grid written as PNG reads back with its size and pixels") {
  // Two rows of 3×2 images: the first row two images, the second one (its second slot black).
  std::vector<float> a = {0.0f, 0.5f, 1.0f, 0.25f, 0.75f, 2.0f};
  std::vector<float> b = {1.0f, 1.0f, 1.0f, 0.0f, 0.0f, 0.0f};
  std::vector<float> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  std::vector<std::vector<float>> rows = {ab, b};
  auto grid = image_grid(rows, 2, 3, 1);
  REQUIRE_MESSAGE(grid.ok(), (grid.ok() ? "" : grid.error().what));
  CHECK(grid->width == 1 + 2 * (3 + 1));
  CHECK(grid->height == 1 + 2 * (2 + 1));
  auto path = temp_file("grid.png");
  REQUIRE(write_png_gray(path, *grid).ok());
  auto back = read_png_gray(path);
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? "" : back.error().what));
  CHECK(back->width == grid->width);
  CHECK(back->height == grid->height);
  CHECK(back->pixels == grid->pixels);
  auto at = [&](std::size_t x, std::size_t y) { return back->pixels[y * back->width + x]; };
  CHECK(at(0, 0) == 0);   // padding
  CHECK(at(1, 1) == 0);   // a[0]
  CHECK(at(2, 1) == 128); // a[1] = 0.5
  CHECK(at(3, 1) == 255); // a[2]
  CHECK(at(1, 2) == 64);  // a[3] = 0.25
  CHECK(at(3, 2) == 255); // 2.0 clamped
  CHECK(at(5, 1) == 255); // b[0], second image of the first row
  CHECK(at(5, 2) == 0);   // b[3]
  CHECK(at(1, 4) == 255); // b[0], first image of the second row
  CHECK(at(5, 4) == 0);   // the second row has no second image
  std::remove(path.c_str());
}

TEST_CASE("bad grids and bad PNG files are refused with a reason") {
  CHECK_FALSE(image_grid({}, 28, 28).ok());
  CHECK_FALSE(image_grid({{0.5f, 0.5f}}, 28, 28).ok());
  CHECK_FALSE(image_grid({{}}, 2, 2).ok());
  gray_image wrong{4, 4, std::vector<uint8_t>(15)};
  CHECK_FALSE(write_png_gray(temp_file("wrong.png"), wrong).ok());
  auto missing = read_png_gray(temp_file("absent.png"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().what.find("cannot read") != std::string::npos);
  auto junk = temp_file("junk.png");
  std::ofstream(junk) << "not a png at all, just text";
  auto r = read_png_gray(junk);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().what.find("cannot read") != std::string::npos);
  // A PNG cut in the middle of its pixel data.
  gray_image ok{64, 64, std::vector<uint8_t>(64 * 64)};
  for (std::size_t i = 0; i < ok.pixels.size(); ++i)
    ok.pixels[i] = static_cast<uint8_t>(i * 7919 % 251);
  auto full = temp_file("full.png");
  REQUIRE(write_png_gray(full, ok).ok());
  auto size = fs::file_size(full);
  fs::resize_file(full, size / 2);
  CHECK_FALSE(read_png_gray(full).ok());
  std::remove(junk.c_str());
  std::remove(full.c_str());
}

} // namespace starling::test::kernels_t2i_png_test
