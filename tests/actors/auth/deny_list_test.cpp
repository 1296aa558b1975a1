#include <doctest/doctest.h>

#include "actors/auth/deny_list.hpp"

namespace starling::test::actors_deny_list_test {

using namespace starling::actors::auth;

namespace {

constexpr int64_t sec = 1'000'000'000;

deny_list sample() {
  deny_list d;
  d.experiment = "exp-a";
  d.serial = 7;
  d.issued_at_ns = 5 * sec;
  d.entries.push_back({deny_entry::kind_t::token, std::string(16, 'a'), "leaked", 1, 0});
  d.entries.push_back({deny_entry::kind_t::peer, std::string(32, 'b'), "cheated", 2, 100 * sec});
  return d;
}

} // namespace

TEST_CASE("a signed deny list round-trips and answers revocation and ban queries") {
  auto authority = key_pair::from_test_seed(100);
  auto bytes = encode_deny_list(sample(), authority);
  REQUIRE(bytes.ok());
  auto list = verify_deny_list(*bytes, trust_anchor{authority.public_key(), "exp-a"});
  REQUIRE_MESSAGE(list.ok(), list.error().line());
  CHECK(list->serial == 7);
  CHECK(list->entries.size() == 2);
  CHECK(list->revoked(std::string(16, 'a'), 0) != nullptr);
  CHECK(list->revoked(std::string(16, 'c'), 0) == nullptr);
  CHECK(list->banned(std::string(32, 'b'), 99 * sec)->reason == "cheated");
  CHECK(list->banned(std::string(32, 'b'), 100 * sec) == nullptr);
  CHECK(list->banned(std::string(16, 'a'), 0) == nullptr); // a token id is not a peer key
}

TEST_CASE("a deny list of another authority, forged, or of another run is refused") {
  auto authority = key_pair::from_test_seed(100);
  auto bytes = *encode_deny_list(sample(), authority);
  CHECK(verify_deny_list(bytes, trust_anchor{key_pair::from_test_seed(1).public_key(), "exp-a"})
          .error()
          .why
        == reason::wrong_authority);
  CHECK(verify_deny_list(bytes, trust_anchor{authority.public_key(), "exp-b"}).error().why
        == reason::foreign_experiment);
  auto s = *unseal(bytes, max_deny_list_bytes, "d");
  s.signature[0] ^= 1;
  CHECK(verify_deny_list(pack_sealed(s), trust_anchor{authority.public_key(), "exp-a"}).error().why
        == reason::forged);
  CHECK(verify_deny_list(bytes, trust_anchor{}).error().why == reason::wrong_authority);
}

TEST_CASE("deny entries out of range are neither signed nor accepted") {
  auto authority = key_pair::from_test_seed(100);
  auto bad = sample();
  bad.entries[0].id = "short";
  CHECK_FALSE(encode_deny_list(bad, authority).ok());
  bad = sample();
  bad.entries[1].reason = "two\nlines";
  CHECK_FALSE(encode_deny_list(bad, authority).ok());
  bad = sample();
  bad.entries[1].reason = std::string(257, 'x');
  CHECK_FALSE(encode_deny_list(bad, authority).ok());
  CHECK(decode_deny_list("nonsense").error().why == reason::malformed);
}

} // namespace starling::test::actors_deny_list_test
