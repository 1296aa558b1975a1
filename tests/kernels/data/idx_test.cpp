#include "kernels/data/idx.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <zlib.h>

namespace starling::test::kernels_idx_test {

using namespace starling::kernels;
namespace fs = std::filesystem;

namespace {

/// A scratch folder removed at the end of the test.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    path = fs::temp_directory_path() / ("starling-idx-test-" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8)
    b.push_back(static_cast<uint8_t>(v >> s));
}

/// Header of an unsigned-byte idx file with the given sizes.
std::vector<uint8_t> header(const std::vector<uint32_t>& dims) {
  std::vector<uint8_t> b{0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (auto d : dims)
    put_u32(b, d);
  return b;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  gzclose(f);
}

/// n images of 2 × 3 pixels (pixel j of image i = 10·i + j) and labels i % 10.
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> small_set(uint32_t n) {
  auto images = header({n, 2, 3});
  auto labels = header({n});
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t j = 0; j < 6; ++j)
      images.push_back(static_cast<uint8_t>(10 * i + j));
    labels.push_back(static_cast<uint8_t>(i % 10));
  }
  return {images, labels};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("idx files load gzip'd or plain, whole or the first items") {
  scratch_dir dir;
  auto [images, labels] = small_set(5);
  write_gz(dir.file("img.gz"), images);
  write_gz(dir.file("lbl.gz"), labels);
  write_plain(dir.file("img"), images);
  write_plain(dir.file("lbl"), labels);
  for (const char* suffix : {".gz", ""}) {
    auto s = load_idx_images(dir.file(std::string("img") + suffix),
                             dir.file(std::string("lbl") + suffix));
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().what));
    CHECK(s->count == 5);
    CHECK(s->rows == 2);
    CHECK(s->cols == 3);
    CHECK(s->labels == std::vector<uint8_t>{0, 1, 2, 3, 4});
    CHECK(s->pixels[6 * 4 + 5] == doctest::Approx(45.0 / 255.0));
  }
  auto first = load_idx_images(dir.file("img.gz"), dir.file("lbl.gz"), 3);
  REQUIRE(first.ok());
  CHECK(first->count == 3);
  CHECK(first->pixels.size() == 18);
}

TEST_CASE("malformed idx files are rejected with a clear error") {
  scratch_dir dir;
  auto [images, labels] = small_set(5);

  SUBCASE("missing file") {
    auto r = read_idx(dir.file("nope.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "not found"));
  }
  SUBCASE("truncated data") {
    auto cut = images;
    cut.resize(cut.size() - 4); // the last image lacks 4 of its 6 bytes
    write_gz(dir.file("cut.gz"), cut);
    auto r = read_idx(dir.file("cut.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "truncated"));
    CHECK(contains(r.error().what, "within item 4"));
  }
  SUBCASE("truncated header") {
    std::vector<uint8_t> cut(images.begin(), images.begin() + 9);
    write_plain(dir.file("cut"), cut);
    auto r = read_idx(dir.file("cut"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "truncated"));
  }
  SUBCASE("bad magic: not starting with two zero bytes") {
    auto bad = images;
    bad[0] = 0x1f;
    write_gz(dir.file("bad.gz"), bad);
    auto r = read_idx(dir.file("bad.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "bad magic number 1f 00 08 03"));
  }
  SUBCASE("bad magic: element type other than unsigned byte") {
    auto bad = images;
    bad[2] = 0x0d; // float
    write_gz(dir.file("bad.gz"), bad);
    auto r = read_idx(dir.file("bad.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "bad magic number"));
  }
  SUBCASE("bad magic: zero dimensions") {
    auto bad = images;
    bad[3] = 0;
    write_gz(dir.file("bad.gz"), bad);
    CHECK_FALSE(read_idx(dir.file("bad.gz")).ok());
  }
  SUBCASE("a zero dimension size") {
    auto bad = header({5, 0, 3});
    write_gz(dir.file("bad.gz"), bad);
    auto r = read_idx(dir.file("bad.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "dimension 1 has size 0"));
  }
  SUBCASE("wrong count: bytes after the announced items") {
    auto longer = images;
    longer.push_back(7);
    write_gz(dir.file("long.gz"), longer);
    auto r = read_idx(dir.file("long.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "wrong count"));
  }
  SUBCASE("wrong counts: images and labels disagree") {
    auto [img4, lbl4] = small_set(4);
    write_gz(dir.file("img.gz"), images);
    write_gz(dir.file("lbl4.gz"), lbl4);
    auto r = load_idx_images(dir.file("img.gz"), dir.file("lbl4.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "wrong counts: 5 images but 4 labels"));
  }
  SUBCASE("wrong ranks and labels out of range") {
    write_gz(dir.file("img.gz"), images);
    write_gz(dir.file("lbl.gz"), labels);
    auto swapped = load_idx_images(dir.file("lbl.gz"), dir.file("img.gz"));
    REQUIRE_FALSE(swapped.ok());
    CHECK(contains(swapped.error().what, "expected 3"));
    auto bad = labels;
    bad.back() = 12;
    write_gz(dir.file("bad.gz"), bad);
    auto r = load_idx_images(dir.file("img.gz"), dir.file("bad.gz"));
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().what, "label 12 of item 4"));
  }
}

TEST_CASE("the generated stand-in is deterministic and labeled evenly") {
  auto a = make_synthetic_images(40, 8, 10, 7);
  auto b = make_synthetic_images(40, 8, 10, 7);
  auto c = make_synthetic_images(40, 8, 10, 7, 1);
  CHECK(a.pixels == b.pixels);
  CHECK(a.labels == b.labels);
  CHECK(a.pixels != c.pixels); // another noise stream, same prototypes
  CHECK(a.labels == c.labels);
  CHECK(a.count == 40);
  CHECK(a.pixels.size() == 40 * 64);
  for (auto v : a.pixels)
    CHECK((v >= 0.0f && v <= 1.0f));
}

TEST_CASE("Fashion-MNIST loads when installed (dataset-fashion-mnist)") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fashion_mnist_present(dir)) {
    MESSAGE("Fashion-MNIST not installed in " << dir << "; skipped");
    return;
  }
  auto s = load_fashion_mnist(dir, false, 100);
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().what));
  CHECK(s->count == 100);
  CHECK(s->rows == 28);
  CHECK(s->cols == 28);
  CHECK(s->labels[0] == 9); // the first test image is an ankle boot
}

} // namespace starling::test::kernels_idx_test
