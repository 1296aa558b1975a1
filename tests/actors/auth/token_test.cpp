#include <doctest/doctest.h>

#include <string>

#include "actors/auth/token.hpp"

namespace starling::test::actors_token_test {

using namespace starling::actors::auth;

namespace {

constexpr int64_t sec = 1'000'000'000;
constexpr int64_t t0 = int64_t{1'800'000'000} * sec; // a fixed "now" in 2027

struct fixture {
  key_pair authority = key_pair::from_test_seed(100);
  key_pair node = key_pair::from_test_seed(1);
  trust_anchor trust{authority.public_key(), "exp-a"};

  token make(std::vector<std::string> roles = {"trainer"}) const {
    token t;
    t.id = std::string(16, '\x11');
    t.peer_key = node.public_key();
    t.roles = std::move(roles);
    t.experiment = "exp-a";
    t.issued_at_ns = t0;
    t.expires_at_ns = t0 + 6 * 3600 * sec;
    return t;
  }
  std::string issue(const token& t) const {
    auto s = encode_token(t, authority);
    REQUIRE_MESSAGE(s.ok(), s.error().what);
    return *s;
  }
};

reason why(const checked<token>& c) {
  REQUIRE_FALSE(c.ok());
  return c.error().why;
}

} // namespace

TEST_CASE("a token issued by the run's authority verifies and carries its fields") {
  fixture f;
  auto bytes = f.issue(f.make({"trainer", "stage"}));
  auto t = verify_token(bytes, f.trust, t0 + sec);
  REQUIRE_MESSAGE(t.ok(), t.error().line());
  CHECK(t->peer_key == f.node.public_key());
  CHECK(t->grants("trainer"));
  CHECK(t->grants("stage"));
  CHECK_FALSE(t->grants("averager"));
  CHECK(t->authority_key == f.authority.public_key());
  CHECK(t->describe().find("roles trainer,stage") != std::string::npos);
  CHECK(verify_token(f.issue(f.make({"any"})), f.trust, t0)->grants("averager"));
}

TEST_CASE("expired, not yet valid and foreign-experiment tokens are refused by reason") {
  fixture f;
  auto bytes = f.issue(f.make());
  CHECK(why(verify_token(bytes, f.trust, t0 + 6 * 3600 * sec)) == reason::expired);
  // Issued 10 minutes in the future: beyond the 5-minute skew.
  CHECK(why(verify_token(bytes, f.trust, t0 - 600 * sec)) == reason::not_yet_valid);
  CHECK(verify_token(bytes, f.trust, t0 - 60 * sec).ok());
  auto other = f.trust;
  other.experiment = "exp-b";
  auto r = verify_token(bytes, other, t0);
  CHECK(why(r) == reason::foreign_experiment);
  CHECK(r.error().line().find("'exp-a'") != std::string::npos);
}

TEST_CASE("a token of another authority, or one forged, is refused") {
  fixture f;
  auto bytes = f.issue(f.make());
  auto foreign = f.trust;
  foreign.authority_key = key_pair::from_test_seed(101).public_key();
  CHECK(why(verify_token(bytes, foreign, t0)) == reason::wrong_authority);

  // A body naming the run's authority, signed by someone else.
  auto s = unseal(bytes, max_token_bytes, "token");
  REQUIRE(s.ok());
  auto forged = seal(token_domain, s->body, key_pair::from_test_seed(666));
  CHECK(why(verify_token(forged, f.trust, t0)) == reason::forged);
  // A signature flipped in one bit.
  auto flipped = *s;
  flipped.signature[5] ^= 1;
  CHECK(why(verify_token(pack_sealed(flipped), f.trust, t0)) == reason::forged);
  // The signature of a `trainer` token moved onto an `any` body.
  auto any = unseal(f.issue(f.make({"any"})), max_token_bytes, "token");
  REQUIRE(any.ok());
  CHECK(why(verify_token(pack_sealed(sealed{any->body, s->signature}), f.trust, t0))
        == reason::forged);
  // A deny list's signature is not a token's: domains differ.
  auto as_deny = seal(deny_domain, s->body, f.authority);
  CHECK(why(verify_token(as_deny, f.trust, t0)) == reason::forged);
  // An open run takes no tokens.
  CHECK(why(verify_token(bytes, trust_anchor{}, t0)) == reason::wrong_authority);
}

TEST_CASE("revoked tokens and banned keys are refused while their entries hold") {
  fixture f;
  auto bytes = f.issue(f.make());
  deny_list deny;
  deny.experiment = "exp-a";
  deny.entries.push_back({deny_entry::kind_t::token, std::string(16, '\x11'), "leaked", t0, 0});
  auto r = verify_token(bytes, f.trust, t0, &deny);
  CHECK(why(r) == reason::revoked);
  CHECK(r.error().line().find("leaked") != std::string::npos);
  deny.entries.clear();
  deny.entries.push_back(
    {deny_entry::kind_t::peer, f.node.public_key(), "cheated", t0, t0 + 3600 * sec});
  CHECK(why(verify_token(bytes, f.trust, t0, &deny)) == reason::banned);
  CHECK(verify_token(bytes, f.trust, t0 + 3600 * sec, &deny).ok()); // the ban ran out
}

TEST_CASE("tokens with fields out of range are neither issued nor accepted") {
  fixture f;
  auto bad = [&](auto change) {
    auto t = f.make();
    change(t);
    CHECK_FALSE(encode_token(t, f.authority).ok());
  };
  bad([](token& t) { t.id = "short"; });
  bad([](token& t) { t.peer_key = "short"; });
  bad([](token& t) { t.roles = {}; });
  bad([](token& t) { t.roles = {"Trainer"}; });
  bad([](token& t) { t.roles = {"any", "stage"}; });
  bad([](token& t) { t.roles = {"stage", "stage"}; });
  bad([](token& t) { t.roles = std::vector<std::string>(17, "x"); });
  bad([](token& t) { t.experiment = ""; });
  bad([](token& t) { t.experiment = "has space"; });
  bad([](token& t) { t.expires_at_ns = t.issued_at_ns; });
  CHECK(why(verify_token("garbage!", f.trust, t0)) == reason::malformed);
  CHECK(why(verify_token(std::string(8192, '\0'), f.trust, t0)) == reason::malformed);
  CHECK(why(verify_token("", f.trust, t0)) == reason::malformed);
  CHECK(decode_token(f.issue(f.make())).ok());
}

TEST_CASE("role lists parse known names, 'any' alone, and name the known roles on a typo") {
  CHECK(*parse_roles("trainer,stage") == std::vector<std::string>{"trainer", "stage"});
  CHECK(*parse_roles("any") == std::vector<std::string>{"any"});
  auto typo = parse_roles("trainr");
  REQUIRE_FALSE(typo.ok());
  CHECK(typo.error().what.find("known: trainer") != std::string::npos);
  CHECK_FALSE(parse_roles("any,stage").ok());
  CHECK_FALSE(parse_roles("stage,,trainer").ok());
  CHECK_FALSE(parse_roles("").ok());
  CHECK_FALSE(parse_roles("stage,stage").ok());
}

TEST_CASE("a token file holds the token in one base64url line and tolerates what follows") {
  fixture f;
  auto bytes = f.issue(f.make());
  auto text = format_token_file(bytes);
  CHECK(text.rfind("starling-token-v1 ", 0) == 0);
  CHECK(text.find('\n') == text.size() - 1);
  auto back = parse_token_file(text + "-----BEGIN CERTIFICATE-----\n...", "f");
  REQUIRE(back.ok());
  CHECK(*back == bytes);
  CHECK_FALSE(parse_token_file("starling-token-v1 !!!\n", "f").ok());
  CHECK_FALSE(parse_token_file("starling-token-v2 AAAA\n", "f").ok());
  CHECK_FALSE(parse_token_file(text.substr(0, text.size() - 1), "f").ok());
}

} // namespace starling::test::actors_token_test
