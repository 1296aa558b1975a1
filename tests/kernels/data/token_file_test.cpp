#include "kernels/data/token_file.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace starling::test::kernels_token_file_test {

using namespace starling::kernels;
namespace fs = std::filesystem;

namespace {

/// A scratch folder removed at the end of the test.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    path = fs::temp_directory_path() / ("starling-token-file-test-" + std::to_string(::getpid()));
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

token_file_options options(const std::string& path, token_dtype dtype, uint64_t vocab) {
  token_file_options o;
  o.path = path;
  o.dtype = dtype;
  o.vocab_size = vocab;
  return o;
}

} // namespace

TEST_CASE("uint16 and uint32 token files round trip, little-endian") {
  scratch_dir dir;
  const std::vector<uint32_t> small{0, 1, 255, 256, 50256, 65535};
  REQUIRE(write_token_file(dir.file("a.bin"), small, token_dtype::uint16).ok());
  CHECK(fs::file_size(dir.file("a.bin")) == 12);
  auto f = token_file::open(options(dir.file("a.bin"), token_dtype::uint16, 65536));
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? "" : f.error().what));
  CHECK(f->size() == 6);
  std::vector<int64_t> got(6);
  REQUIRE(f->read(0, 6, got.data()).ok());
  CHECK(got == std::vector<int64_t>{0, 1, 255, 256, 50256, 65535});

  // The byte order on disk, independent of the host: 256 is 00 01.
  std::ifstream in(dir.file("a.bin"), std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(raw.substr(6, 2) == std::string("\x00\x01", 2));

  const std::vector<uint32_t> big{0, 70000, 100276, 0xfffffffeu};
  REQUIRE(write_token_file(dir.file("b.bin"), big, token_dtype::uint32).ok());
  auto g = token_file::open(options(dir.file("b.bin"), token_dtype::uint32, 0xffffffffu));
  REQUIRE(g.ok());
  CHECK(g->size() == 4);
  CHECK(g->at(2) == 100276);
  CHECK(g->at(3) == 0xfffffffeu);
  std::vector<int64_t> two(2);
  REQUIRE(g->read(1, 2, two.data()).ok());
  CHECK(two == std::vector<int64_t>{70000, 100276});
  CHECK_FALSE(g->read(3, 2, two.data()).ok()); // past the end

  CHECK_FALSE(write_token_file(dir.file("c.bin"), big, token_dtype::uint16).ok());
}

TEST_CASE("an out-of-vocabulary token is one clear error naming the file, offset and id") {
  scratch_dir dir;
  REQUIRE(write_token_file(dir.file("t.bin"), {5, 9, 300, 7}, token_dtype::uint16).ok());
  auto f = token_file::open(options(dir.file("t.bin"), token_dtype::uint16, 256));
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().what == "token file " + dir.file("t.bin") +
                              ": token 2 (byte offset 4) is 300, expected an id below the "
                              "vocabulary size 256");

  // Without the scan at open, the read that meets it fails the same way; others succeed.
  auto o = options(dir.file("t.bin"), token_dtype::uint16, 256);
  o.validate_at_open = false;
  auto lazy = token_file::open(o);
  REQUIRE(lazy.ok());
  std::vector<int64_t> out(4);
  CHECK(lazy->read(0, 2, out.data()).ok());
  auto st = lazy->read(1, 3, out.data());
  REQUIRE_FALSE(st.ok());
  CHECK(st.what() == f.error().what);
}

TEST_CASE("a truncated, empty or missing token file is one clear error each") {
  scratch_dir dir;
  SUBCASE("truncated: an odd byte count for uint16") {
    write_bytes(dir.file("odd.bin"), std::string("\x01\x00\x02", 3));
    auto f = token_file::open(options(dir.file("odd.bin"), token_dtype::uint16, 256));
    REQUIRE_FALSE(f.ok());
    CHECK(contains(f.error().what, dir.file("odd.bin")));
    CHECK(contains(f.error().what, "3 bytes is not a multiple of the token width 2 (uint16)"));
  }
  SUBCASE("truncated: 6 bytes for uint32") {
    write_bytes(dir.file("six.bin"), std::string(6, '\0'));
    auto f = token_file::open(options(dir.file("six.bin"), token_dtype::uint32, 256));
    REQUIRE_FALSE(f.ok());
    CHECK(contains(f.error().what, "6 bytes is not a multiple of the token width 4 (uint32)"));
  }
  SUBCASE("empty") {
    write_bytes(dir.file("empty.bin"), "");
    auto f = token_file::open(options(dir.file("empty.bin"), token_dtype::uint16, 256));
    REQUIRE_FALSE(f.ok());
    CHECK(f.error().what ==
          "token file " + dir.file("empty.bin") + ": empty (0 bytes), expected uint16 tokens");
  }
  SUBCASE("missing") {
    auto f = token_file::open(options(dir.file("nope.bin"), token_dtype::uint16, 256));
    REQUIRE_FALSE(f.ok());
    CHECK(f.error().what == "token file " + dir.file("nope.bin") + ": not found");
  }
  SUBCASE("a folder") {
    auto f = token_file::open(options(dir.path.string(), token_dtype::uint16, 256));
    REQUIRE_FALSE(f.ok());
    CHECK(contains(f.error().what, "not a regular file"));
  }
  SUBCASE("no vocabulary size, no path") {
    REQUIRE(write_token_file(dir.file("ok.bin"), {1, 2}, token_dtype::uint16).ok());
    auto f = token_file::open(options(dir.file("ok.bin"), token_dtype::uint16, 0));
    REQUIRE_FALSE(f.ok());
    CHECK(contains(f.error().what, "vocab_size is 0"));
    CHECK_FALSE(token_file::open(options("", token_dtype::uint16, 256)).ok());
  }
}

TEST_CASE("token dtypes parse by name") {
  CHECK(*parse_token_dtype("uint16") == token_dtype::uint16);
  CHECK(*parse_token_dtype("uint32") == token_dtype::uint32);
  auto bad = parse_token_dtype("int32");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().what == "token dtype `int32`, expected uint16 or uint32");
  CHECK(token_width(token_dtype::uint32) == 4);
}

TEST_CASE("a moved token file keeps its mapping") {
  scratch_dir dir;
  REQUIRE(write_token_file(dir.file("m.bin"), {3, 4, 5}, token_dtype::uint16).ok());
  auto f = token_file::open(options(dir.file("m.bin"), token_dtype::uint16, 10));
  REQUIRE(f.ok());
  token_file moved = std::move(*f);
  CHECK(moved.at(2) == 5);
  CHECK(f->size() == 0);
}

} // namespace starling::test::kernels_token_file_test
