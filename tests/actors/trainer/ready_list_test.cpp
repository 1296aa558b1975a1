#include "actors/trainer/ready_list.hpp"

#include <doctest/doctest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace starling::test::actors_ready_list_test {

using namespace starling::actors::trainer;

namespace {

/// The list's (load, name) sequence.
std::vector<std::pair<double, std::string>> keys(const ready_list& r) {
  std::vector<std::pair<double, std::string>> out;
  for (auto& e : r.entries())
    out.emplace_back(e.load, *e.id);
  return out;
}

} // namespace

TEST_CASE("the ready list orders peers by load, then by name, as a set of pairs does") {
  std::vector<std::string> names{"b", "a", "c"};
  ready_list r;
  r.insert(2.0, names[0], false, 0.0);
  r.insert(1.0, names[1], false, 0.0);
  r.insert(2.0, names[2], true, 5.0);
  r.insert(1.0, names[1], true, 9.0); // already listed: no effect
  CHECK(r.size() == 3);
  CHECK(*r.front().id == "a");
  CHECK_FALSE(r.front().has_value);
  auto k = keys(r);
  REQUIRE(k.size() == 3);
  CHECK(k[0] == std::make_pair(1.0, std::string{"a"}));
  CHECK(k[1] == std::make_pair(2.0, std::string{"b"}));
  CHECK(k[2] == std::make_pair(2.0, std::string{"c"}));
  CHECK(r.entries()[2].has_value);
  CHECK(r.entries()[2].value == 5.0);
}

TEST_CASE("reloading a peer moves it up or down and keeps its value") {
  std::vector<std::string> names{"p0", "p1", "p2", "p3"};
  ready_list r;
  for (size_t i = 0; i < names.size(); ++i)
    r.insert(static_cast<double>(i), names[i], true, 10.0 + static_cast<double>(i));
  CHECK(r.reload(0.0, "p0", 2.5)); // up, past p1 and p2
  CHECK(keys(r) == std::vector<std::pair<double, std::string>>{
                       {1.0, "p1"}, {2.0, "p2"}, {2.5, "p0"}, {3.0, "p3"}});
  CHECK(r.entries()[2].value == 10.0);
  CHECK(r.reload(3.0, "p3", 1.0)); // down to a tie with p1: names break it
  CHECK(keys(r) == std::vector<std::pair<double, std::string>>{
                       {1.0, "p1"}, {1.0, "p3"}, {2.0, "p2"}, {2.5, "p0"}});
  CHECK_FALSE(r.reload(7.0, "p3", 0.0)); // not listed at that load: nothing moves
  CHECK(r.size() == 4);
  CHECK(r.set_value(2.0, "p2", false, 0.0));
  CHECK_FALSE(r.entries()[2].has_value);
  CHECK(r.erase(1.0, "p1"));
  CHECK_FALSE(r.erase(1.0, "p1"));
  CHECK_FALSE(r.contains(1.0, "p1"));
  CHECK(r.contains(1.0, "p3"));
  CHECK(*r.front().id == "p3");
}

TEST_CASE("the ready list follows a set of (load, name) pairs through random changes") {
  std::mt19937_64 rng{7};
  std::vector<std::string> names;
  for (int i = 0; i < 60; ++i)
    names.push_back("s0p" + std::to_string(i) + "g0");
  std::set<std::pair<double, std::string>> want;
  std::map<std::string, double> load; // listed peers
  ready_list r;
  for (int step = 0; step < 20000; ++step) {
    auto& n = names[rng() % names.size()];
    // Loads from a small grid, so that ties (broken by name) are frequent.
    auto l = static_cast<double>(rng() % 16) * 0.5;
    auto i = load.find(n);
    switch (rng() % 3) {
    case 0:
      if (i == load.end()) {
        want.emplace(l, n);
        load[n] = l;
        r.insert(l, n, false, 0.0);
      }
      break;
    case 1:
      if (i != load.end()) {
        CHECK(r.reload(i->second, n, l));
        want.erase({i->second, n});
        want.emplace(l, n);
        i->second = l;
      }
      break;
    default:
      if (i != load.end()) {
        CHECK(r.erase(i->second, n));
        want.erase({i->second, n});
        load.erase(i);
      }
      break;
    }
    REQUIRE(keys(r) == std::vector<std::pair<double, std::string>>(want.begin(), want.end()));
  }
}

} // namespace starling::test::actors_ready_list_test
