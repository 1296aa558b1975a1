#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "actors/auth/identity.hpp"
#include "actors/dht/node_id.hpp"
#include "actors/dht/signing.hpp"
#include "tests/support/node_fixtures.hpp"

namespace starling::test::actors_identity_test {

using namespace starling::actors::auth;

namespace {

/// Scratch folders of these tests.
struct temp_dir : starling::testing::temp_dir {
  temp_dir() : starling::testing::temp_dir("starling-auth") {}
};

/// A fresh, empty folder under /tmp, removed when the test ends.
void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

} // namespace

TEST_CASE("a peer id is the 20-byte BLAKE2b of the public key, equal to the DHT id") {
  auto key = key_pair::from_test_seed(7);
  CHECK(key.public_key().size() == public_key_bytes);
  CHECK(key.peer_id().size() == peer_id_bytes);
  CHECK(key.peer_id() == starling::actors::dht::node_id::of_key(key.public_key()).to_bytes());
  // Test seeds give the same keys as the DHT's, so simulated nodes keep one identity.
  CHECK(key.public_key() == starling::actors::dht::identity::from_seed(7).public_key);
  CHECK(key.peer_id() != key_pair::from_test_seed(8).peer_id());
  CHECK(key_pair::generate().public_key() != key_pair::generate().public_key());
}

TEST_CASE("a signature verifies with its key only, and only for its message") {
  auto key = key_pair::from_test_seed(1);
  auto sig = key.sign("hello");
  CHECK(sig.size() == signature_bytes);
  CHECK(verify_signature(key.public_key(), "hello", sig));
  CHECK_FALSE(verify_signature(key.public_key(), "hellp", sig));
  CHECK_FALSE(verify_signature(key_pair::from_test_seed(2).public_key(), "hello", sig));
  CHECK_FALSE(verify_signature(key.public_key(), "hello", sig.substr(1)));
  CHECK_FALSE(verify_signature(key.public_key().substr(1), "hello", sig));
}

TEST_CASE("a secret key file round-trips and rejects every malformed variant with a reason") {
  auto key = key_pair::from_test_seed(3);
  auto text = format_secret_key(key, key_role::node);
  CHECK(text.size() == secret_key_file_bytes(key_role::node));
  auto back = parse_secret_key(text, key_role::node, "k");
  REQUIRE(back.ok());
  CHECK(back->public_key() == key.public_key());
  CHECK(back->secret_key() == key.secret_key());

  auto bad = [&](std::string t, const std::string& expect) {
    auto r = parse_secret_key(t, key_role::node, "k");
    REQUIRE_FALSE(r.ok());
    INFO(r.error().what);
    CHECK(r.error().what.find(expect) != std::string::npos);
  };
  bad(text.substr(0, text.size() - 1), "this one is");
  bad(text + "x", "this one is");
  bad("", "this one is");
  auto corrupt = text;
  corrupt[30] = corrupt[30] == '0' ? '1' : '0'; // a seed digit: the public key no longer derives
  bad(corrupt, "corrupt");
  auto nonhex = text;
  nonhex[30] = 'z';
  bad(nonhex, "not a hex digit");
  auto header = text;
  header[0] = 'S';
  bad(header, "first line");
  bad(format_secret_key(key, key_role::authority), "authority secret key file");
  bad(format_public_key(key.public_key(), key_role::node), "public key file");
}

TEST_CASE("a public key file round-trips and a secret key file is refused in its place") {
  auto key = key_pair::from_test_seed(4);
  auto text = format_public_key(key.public_key(), key_role::node);
  auto back = parse_public_key(text, key_role::node, "p");
  REQUIRE(back.ok());
  CHECK(*back == key.public_key());
  auto secret = parse_public_key(format_secret_key(key, key_role::node), key_role::node, "p");
  REQUIRE_FALSE(secret.ok());
  CHECK(secret.error().what.find("secret key never leaves") != std::string::npos);
  CHECK_FALSE(parse_public_key(text.substr(1), key_role::node, "p").ok());
  CHECK_FALSE(parse_public_key(format_public_key(key.public_key(), key_role::authority),
                               key_role::node, "p")
                .ok());
}

TEST_CASE("the first start creates a private key file and later starts load the same key") {
  temp_dir dir;
  auto path = dir.path + "/state/node.key";
  auto first = load_or_create_key(path, key_role::node);
  REQUIRE_MESSAGE(first.ok(), first.error().what);
  CHECK(first->created);
  CHECK(mode_of(path) == 0600);
  auto second = load_or_create_key(path, key_role::node);
  REQUIRE_MESSAGE(second.ok(), second.error().what);
  CHECK_FALSE(second->created);
  CHECK(second->key.public_key() == first->key.public_key());
  // No temporary file is left beside it.
  int entries = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path + "/state")) {
    (void) e;
    ++entries;
  }
  CHECK(entries == 1);
  // Creating over an existing file fails instead of replacing the identity.
  CHECK_FALSE(create_secret_key_file(path, key_pair::generate(), key_role::node).ok());
  CHECK(load_secret_key_file(path, key_role::node)->public_key() == first->key.public_key());
}

TEST_CASE("a key file readable by others, or malformed, is refused and never replaced") {
  temp_dir dir;
  auto path = dir.path + "/node.key";
  auto key = key_pair::from_test_seed(5);
  write_file(path, format_secret_key(key, key_role::node), 0644);
  auto open = load_or_create_key(path, key_role::node);
  REQUIRE_FALSE(open.ok());
  CHECK(open.error().what.find("mode 0644") != std::string::npos);
  CHECK(open.error().what.find("chmod 600") != std::string::npos);
  write_file(path, format_secret_key(key, key_role::node), 0640);
  CHECK_FALSE(load_secret_key_file(path, key_role::node).ok());
  write_file(path, format_secret_key(key, key_role::node), 0400);
  CHECK(load_secret_key_file(path, key_role::node).ok());

  write_file(path, "garbage", 0600);
  auto short_file = load_or_create_key(path, key_role::node);
  REQUIRE_FALSE(short_file.ok());
  CHECK(short_file.error().what.find("this one is 7") != std::string::npos);
  CHECK(mode_of(path) == 0600);
  CHECK(*read_small_file(path, 100) == "garbage"); // left as it was

  write_file(path, std::string(100000, 'a'), 0600);
  CHECK_FALSE(load_secret_key_file(path, key_role::node).ok());
  CHECK_FALSE(load_secret_key_file(dir.path, key_role::node).ok()); // a folder
  CHECK_FALSE(load_secret_key_file(dir.path + "/missing", key_role::node).ok());
}

TEST_CASE("a public key file is written and read back") {
  temp_dir dir;
  auto key = key_pair::from_test_seed(6);
  auto path = dir.path + "/node.pub";
  REQUIRE(write_public_key_file(path, key.public_key(), key_role::node).ok());
  auto back = load_public_key_file(path, key_role::node);
  REQUIRE(back.ok());
  CHECK(*back == key.public_key());
  CHECK_FALSE(write_public_key_file(path, "short", key_role::node).ok());
}

TEST_CASE("hex round-trips and rejects odd lengths and non-hex characters") {
  CHECK(to_hex(std::string("\x00\xff\x10", 3)) == "00ff10");
  CHECK(*from_hex("00ff10") == std::string("\x00\xff\x10", 3));
  CHECK(*from_hex("ABcd") == "\xab\xcd");
  CHECK_FALSE(from_hex("abc").ok());
  CHECK_FALSE(from_hex("zz").ok());
}

} // namespace starling::test::actors_identity_test
