#include "actors/btard/membership.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace starling::test::btard_membership {

namespace btard = starling::actors::btard;

TEST_CASE("equal parts cover the vector in order, sizes differing by at most one") {
  for (uint64_t size : {7ull, 16ull, 1000ull, 101'770ull}) {
    for (size_t n : {1u, 2u, 3u, 7u}) {
      auto parts = btard::equal_parts(size, n);
      REQUIRE(parts);
      REQUIRE(parts->size() == n);
      uint64_t at = 0, lo = size, hi = 0;
      for (auto& p : *parts) {
        CHECK(p.begin == at);
        at = p.end;
        lo = std::min(lo, p.size());
        hi = std::max(hi, p.size());
      }
      CHECK(at == size);
      CHECK(hi - lo <= 1);
    }
  }
  // No overflow for vectors whose size times n exceeds 64 bits.
  auto big = btard::equal_parts(UINT64_MAX, 3);
  REQUIRE(big);
  CHECK(big->back().end == UINT64_MAX);
  CHECK_FALSE(btard::equal_parts(10, 0));
  CHECK_FALSE(btard::equal_parts(2, 3));
}

TEST_CASE("a step's group is every joined peer not banned, in key order, member i on part i") {
  btard::membership m;
  for (auto k : {"d", "b", "a", "c"})
    REQUIRE(m.join(k, 0));
  REQUIRE(m.join("e", 5)); // a newcomer from step 5
  auto g = m.group(0, 100);
  REQUIRE(g);
  CHECK(g->members == std::vector<std::string>{"a", "b", "c", "d"});
  CHECK(g->parts.size() == 4);
  CHECK(*g->index_of("c") == 2);
  CHECK(*g->part_of("c") == btard::part_range{50, 75});
  CHECK_FALSE(g->index_of("e"));
  CHECK_FALSE(g->part_of("zz"));
  auto g5 = m.group(5, 100);
  REQUIRE(g5);
  CHECK(g5->members.size() == 5);
  CHECK(*g5->part_of("c") == btard::part_range{40, 60});
  // A ban changes n, the parts and who aggregates which part; keys stay keys.
  CHECK(m.ban("b", "wrong aggregate at step 5"));
  CHECK_FALSE(m.ban("b", "again"));
  auto g6 = m.group(6, 100);
  REQUIRE(g6);
  CHECK(g6->members == std::vector<std::string>{"a", "c", "d", "e"});
  CHECK(*g6->part_of("c") == btard::part_range{25, 50});
  CHECK(m.absent("b", 6) == btard::absence::banned);
  CHECK(*m.ban_reason("b") == "wrong aggregate at step 5");
  CHECK_FALSE(m.join("b", 7));
}

TEST_CASE("a silent peer leaves for the rest of the step, cools down, and rejoins by joining") {
  btard::membership_options o;
  o.cool_down = 3;
  o.silence_window = 10;
  o.silences_to_ban = 2;
  REQUIRE(btard::validate(o));
  btard::membership m{o};
  for (auto k : {"a", "b", "c"})
    REQUIRE(m.join(k, 0));
  auto g = m.group(4, 30);
  REQUIRE(g);
  CHECK_FALSE(m.silent("b", 4));
  // The redo of step 4: the same step, without b, on new parts.
  auto redo = m.regroup(*g, {"b"}, 30);
  REQUIRE(redo);
  CHECK(redo->step == 4);
  CHECK(redo->members == std::vector<std::string>{"a", "c"});
  CHECK(*redo->part_of("c") == btard::part_range{15, 30});
  CHECK(m.absent("b", 5) == btard::absence::cooling_down);
  CHECK(m.absent("b", 8) == btard::absence::not_joined);
  // Steps 5-7 are its cool-down: joining is refused with the step it may come back.
  auto early = m.join("b", 7);
  REQUIRE_FALSE(early);
  CHECK(early.what().find("from step 8") != std::string::npos);
  REQUIRE(m.join("b", 8));
  CHECK(m.group(8, 30)->members.size() == 3);
  // A second silence within the window is a ban.
  CHECK(m.silent("b", 12));
  CHECK(m.absent("b", 20) == btard::absence::banned);
  CHECK(m.ban_reason("b")->find("silent 2 times within 10 steps") != std::string::npos);
  // Silences outside the window are forgotten.
  CHECK_FALSE(m.silent("c", 13));
  REQUIRE(m.join("c", 17));
  CHECK_FALSE(m.silent("c", 23)); // 23 - 13 = 10: the first silence is out of the window
  CHECK_FALSE(m.ban_reason("c"));
  // Silences of absent or banned keys change nothing.
  CHECK_FALSE(m.silent("zz", 23));
  CHECK_FALSE(m.silent("b", 23));
}

TEST_CASE("too few members is an error, not a smaller CenteredClip") {
  btard::membership m;
  REQUIRE(m.join("a", 0));
  CHECK_FALSE(m.group(0, 10));
  REQUIRE(m.join("b", 0));
  auto g = m.group(0, 10);
  REQUIRE(g);
  auto redo = m.regroup(*g, {"a"}, 10);
  REQUIRE_FALSE(redo);
  CHECK(redo.error().what.find("fewer than the 2") != std::string::npos);
  // More members than elements cannot be cut.
  REQUIRE(m.join("c", 0));
  CHECK_FALSE(m.group(0, 2));
}

TEST_CASE("membership options are checked") {
  btard::membership_options o;
  CHECK(btard::validate(o));
  o.silences_to_ban = 0;
  CHECK_FALSE(btard::validate(o));
  o.silences_to_ban = 5;
  o.silence_window = 4;
  CHECK_FALSE(btard::validate(o));
  o.silence_window = 5;
  o.min_members = 1;
  CHECK_FALSE(btard::validate(o));
}

TEST_CASE("the membership travels as bytes with a peer's state and keeps every rule") {
  btard::membership_options o;
  o.cool_down = 2;
  o.silences_to_ban = 2;
  o.silence_window = 10;
  btard::membership m(o);
  std::vector<std::string> k;
  for (char c : {'a', 'b', 'c', 'd', 'e'})
    k.push_back(std::string(32, c));
  for (auto& key : k)
    REQUIRE(m.join(key, 0));
  CHECK_FALSE(m.silent(k[1], 3)); // cooling down until step 6, one silence kept
  CHECK(m.ban(k[2], "wrong_gradient confirmed by recomputation"));
  auto bytes = m.encode();
  auto back = btard::membership::decode(bytes, o);
  REQUIRE_MESSAGE(back, (back ? "" : back.error().what));
  CHECK(back->encode() == bytes);
  for (uint64_t step : {3u, 4u, 5u, 6u, 7u})
    for (auto& key : k)
      CHECK(back->absent(key, step) == m.absent(key, step));
  CHECK(back->ban_reason(k[2]) == m.ban_reason(k[2]));
  auto g = back->group(4, 100);
  REQUIRE(g);
  CHECK(g->members == std::vector<std::string>{k[0], k[3], k[4]});
  // The silence kept: the next one within the window bans, as it would have before.
  REQUIRE(back->join(k[1], 6));
  CHECK(back->silent(k[1], 6));

  // Untrusted bytes: every cut, a wrong tag and trailing bytes fail with a reason.
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto r = btard::membership::decode(bytes.substr(0, cut), o);
    CHECK_FALSE(r);
  }
  CHECK_FALSE(btard::membership::decode("x" + bytes.substr(1), o));
  auto trailing = btard::membership::decode(bytes + "!", o);
  REQUIRE_FALSE(trailing);
  CHECK(trailing.error().what.find("trailing") != std::string::npos);
  // More silences kept for one peer than a ban takes: not a state the rules can produce.
  btard::membership_options strict = o;
  strict.silences_to_ban = 1;
  strict.silence_window = 1;
  CHECK(btard::membership::decode(back->encode(), o)); // k[1]: banned with its 2 silences
  CHECK_FALSE(btard::membership::decode(back->encode(), strict));
}

} // namespace starling::test::btard_membership
