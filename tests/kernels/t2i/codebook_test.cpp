#include "kernels/t2i/codebook.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace starling::test::kernels_t2i_codebook_test {

using namespace starling::kernels;
namespace fs = std::filesystem;

namespace {

patch_codebook small_codebook() {
  patch_codebook cb;
  cb.patch = 2;
  cb.codes = {0.0f, 0.25f, 0.5f, 1.0f, 1.0f, 0.75f, 0.5f, 0.0f, 0.1f, 0.2f, 0.3f, 0.4f};
  return cb;
}

std::string temp_file(const std::string& name) {
  return (fs::temp_directory_path() /
          ("starling-codebook-test-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

} // namespace

TEST_CASE("a codebook survives encoding and its digest names its contents") {
  auto cb = small_codebook();
  REQUIRE(validate(cb).ok());
  CHECK(cb.size() == 3);
  CHECK(cb.dim() == 4);
  auto bytes = encode_codebook(cb);
  CHECK(bytes.size() == 16 + 12 * 4 + 32);
  auto back = decode_codebook(bytes.data(), bytes.size());
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? "" : back.error().what));
  CHECK(back->patch == 2);
  CHECK(back->codes == cb.codes);
  auto d = codebook_digest(cb);
  CHECK(d.size() == 64);
  CHECK(d == codebook_digest(*back));
  auto other = cb;
  other.codes[5] = 0.5f;
  CHECK(codebook_digest(other) != d);
  other = cb;
  other.patch = 1; // the same values read as twelve 1×1 codes are another codebook
  CHECK(codebook_digest(other) != d);
}

TEST_CASE("a damaged codebook file is refused with its reason") {
  auto bytes = encode_codebook(small_codebook());
  auto refused = [](const std::string& b, const std::string& reason) {
    auto r = decode_codebook(b.data(), b.size());
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(r.error().what.find(reason) != std::string::npos, r.error().what);
  };
  refused(bytes.substr(0, 20), "shorter");
  refused("XTCB" + bytes.substr(4), "magic");
  auto b = bytes;
  b[4] = 2;
  refused(b, "version 2");
  b = bytes;
  b[8] = 0;
  refused(b, "patch side 0");
  b = bytes;
  b[12] = 0;
  refused(b, "code count 0");
  b = bytes;
  b[12] = 4; // four codes announced, three present
  refused(b, "header announces");
  refused(bytes + "x", "header announces");
  b = bytes;
  b[20] ^= 1; // one flipped bit in a code
  refused(b, "digest");
  // A value outside [0, 1] with a matching digest (a crafted file, not a damaged one).
  auto bad = small_codebook();
  bad.codes[0] = 2.0f;
  CHECK_FALSE(validate(bad).ok());
  auto crafted = encode_codebook(bad);
  refused(crafted, "[0, 1]");
}

TEST_CASE("a saved codebook loads back, and a wrong published digest is refused") {
  auto cb = small_codebook();
  auto path = temp_file("cb.bin");
  REQUIRE(save_codebook(path, cb).ok());
  auto back = load_codebook(path, codebook_digest(cb));
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? "" : back.error().what));
  CHECK(back->codes == cb.codes);
  auto wrong = load_codebook(path, std::string(64, '0'));
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().what.find("published") != std::string::npos);
  auto missing = load_codebook(temp_file("absent.bin"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().what.find("cannot read") != std::string::npos);
  std::remove(path.c_str());
}

} // namespace starling::test::kernels_t2i_codebook_test
