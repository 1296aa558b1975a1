#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <sys/stat.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/certificates.hpp"
#include "tests/support/node_fixtures.hpp"

namespace starling::test::actors_authority_test {

using namespace starling::actors::auth;

namespace {

/// Scratch folders of these tests.
struct temp_dir : starling::testing::temp_dir {
  temp_dir() : starling::testing::temp_dir("starling-auth") {}
};

constexpr int64_t sec = 1'000'000'000;
constexpr int64_t t0 = int64_t{1'800'000'000} * sec;

} // namespace

TEST_CASE("an authority folder is created once, reloads, and issues verifiable tokens") {
  temp_dir dir;
  auto a = init_authority({dir.path + "/auth", "exp-1", t0});
  REQUIRE_MESSAGE(a.ok(), a.error().what);
  struct stat st {};
  REQUIRE(::stat((dir.path + "/auth/authority.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK_FALSE(init_authority({dir.path + "/auth", "exp-1", t0}).ok()); // never replaced

  auto b = load_authority(dir.path + "/auth");
  REQUIRE_MESSAGE(b.ok(), b.error().what);
  CHECK(b->key.public_key() == a->key.public_key());
  CHECK(b->experiment == "exp-1");

  auto node = key_pair::from_test_seed(1);
  auto issued = issue_token(*b, {node.public_key(), {"trainer"}, t0, 6 * 3600 * sec, {}});
  REQUIRE_MESSAGE(issued.ok(), issued.error().what);
  auto bytes = parse_token_file(issued->file_text, "token");
  REQUIRE(bytes.ok());
  auto t = verify_token(*bytes, b->trust(), t0 + sec);
  REQUIRE_MESSAGE(t.ok(), t.error().line());
  CHECK(t->grants("trainer"));
  // The token file carries the node's certificate and the CA's.
  auto certs = pem_certificates(issued->file_text);
  REQUIRE(certs.size() == 2);
  CHECK(*verify_certificate(certs[1], certs[0], t0 + sec) == node.public_key());
  CHECK(std::filesystem::file_size(dir.path + "/auth/issued.log") > 0);
}

TEST_CASE("the default experiment derives from the key, and a bad one is refused") {
  temp_dir dir;
  auto a = init_authority({dir.path + "/a", "", t0});
  REQUIRE(a.ok());
  CHECK(a->experiment.rfind("run-", 0) == 0);
  CHECK(a->experiment.size() == 16);
  CHECK_FALSE(init_authority({dir.path + "/b", "bad name", t0}).ok());
}

TEST_CASE("denying a token re-signs the deny list with the next serial and revokes it") {
  temp_dir dir;
  auto a = *init_authority({dir.path, "exp-1", t0});
  auto node = key_pair::from_test_seed(1);
  auto issued = *issue_token(a, {node.public_key(), {"any"}, t0, 3600 * sec, {}});
  auto signed_list = deny(a, {deny_entry::kind_t::token, issued.content.id, "lost laptop"},
                          t0 + sec);
  REQUIRE_MESSAGE(signed_list.ok(), signed_list.error().what);
  auto list = verify_deny_list(*signed_list, a.trust());
  REQUIRE(list.ok());
  CHECK(list->serial == 2);
  CHECK(verify_token(issued.signed_token, a.trust(), t0 + 2 * sec, &*list).error().why
        == reason::revoked);
}

TEST_CASE("a mixed-up or missing authority folder is refused with the file it concerns") {
  temp_dir dir;
  auto a = *init_authority({dir.path + "/a", "exp-1", t0});
  auto b = *init_authority({dir.path + "/b", "exp-1", t0});
  std::filesystem::copy_file(dir.path + "/b/ca.crt", dir.path + "/a/ca.crt",
                             std::filesystem::copy_options::overwrite_existing);
  auto mixed = load_authority(dir.path + "/a");
  REQUIRE_FALSE(mixed.ok());
  CHECK(mixed.error().what.find("ca.crt") != std::string::npos);
  CHECK_FALSE(load_authority(dir.path + "/nothing").ok());
}

} // namespace starling::test::actors_authority_test
