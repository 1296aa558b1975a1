#include <doctest/doctest.h>

#include <map>
#include <set>

#include <fmt/format.h>

#include "runtime/experiment/graph.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/role.hpp"

namespace starling::test::runtime_plan_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;

namespace {

/// A role type with an int option, enough to build and validate graphs (never spawned here).
struct dummy_options {
  int64_t value = 0;
};

role_registry dummy_registry() {
  role_registry reg;
  reg.add<dummy_options>("dummy", "does nothing",
                         [](role_context&, const dummy_options&) { return caf::actor{}; });
  return reg;
}

experiment_builder base() {
  experiment_builder b{"t"};
  b.duration(100s).seed(7);
  return b;
}

std::map<std::string, size_t> node_of(const plan& p) {
  std::map<std::string, size_t> out;
  for (auto& x : p.instances)
    if (x.node)
      out[x.name] = *x.node;
  return out;
}

} // namespace

TEST_CASE("the plan is deterministic for a seed and its faults change with the seed") {
  auto reg = dummy_registry();
  auto b = base();
  b.role("peers", "dummy", dummy_options{}).replicas(6);
  b.preempt("peers", 10s);
  auto g = b.build(reg, run_mode::sim);
  REQUIRE(g);
  auto p1 = make_plan(*g, run_mode::sim, 3, 7);
  auto p2 = make_plan(*g, run_mode::sim, 3, 7);
  auto p3 = make_plan(*g, run_mode::sim, 3, 8);
  REQUIRE(p1);
  REQUIRE(p2);
  REQUIRE(p3);
  CHECK(describe(*g, *p1) == describe(*g, *p2));
  CHECK(node_of(*p1) == node_of(*p3)); // placement does not depend on the seed
  REQUIRE(!p1->faults.empty());
  std::vector<std::pair<int64_t, size_t>> a, c;
  for (auto& f : p1->faults)
    a.emplace_back(f.at.count(), f.instance);
  for (auto& f : p3->faults)
    c.emplace_back(f.at.count(), f.instance);
  CHECK(a != c);
  // A Poisson process with a mean gap of 10 s over 100 s: about 10 preemptions, in order.
  CHECK(p1->faults.size() >= 3);
  CHECK(p1->faults.size() <= 25);
  for (size_t i = 1; i < p1->faults.size(); ++i)
    CHECK(p1->faults[i - 1].at <= p1->faults[i].at);
  for (auto& f : p1->faults) {
    CHECK(f.what == planned_fault::action::kill_instance);
    CHECK(f.at < 100s);
    CHECK(f.restart == 5s); // the role's restart delay
  }
}

TEST_CASE("spread replicas land on distinct nodes, least loaded first, avoiding a role") {
  auto reg = dummy_registry();
  auto b = base();
  b.role("trainer", "dummy", dummy_options{}).replicas(2).pin({0});
  b.role("peers", "dummy", dummy_options{}).replicas(7).avoid({"trainer"});
  auto g = b.build(reg, run_mode::cluster);
  REQUIRE(g);
  auto p = make_plan(*g, run_mode::cluster, 4, 1);
  REQUIRE(p);
  auto at = node_of(*p);
  CHECK(at["trainer.0"] == 0);
  CHECK(at["trainer.1"] == 0);
  std::map<size_t, int> load;
  for (int i = 0; i < 7; ++i) {
    auto n = at[fmt::format("peers.{}", i)];
    CHECK(n != 0);
    load[n]++;
  }
  // Round robin over nodes 1..3: consecutive peers on distinct nodes, loads 3/2/2.
  CHECK(at["peers.0"] != at["peers.1"]);
  CHECK(at["peers.1"] != at["peers.2"]);
  for (auto& [n, c] : load)
    CHECK((c == 2 || c == 3));
  // With one node per instance (auto), the pinned trainers share node 0 and each peer has one.
  auto pa = make_plan(*g, run_mode::sim, 0, 1);
  REQUIRE(pa);
  CHECK(pa->nodes == 8);
  std::set<size_t> peer_nodes;
  for (auto& [name, n] : node_of(*pa))
    if (name.rfind("peers.", 0) == 0)
      peer_nodes.insert(n);
  CHECK(peer_nodes.size() == 7);
  CHECK(peer_nodes.count(0) == 0);
}

TEST_CASE("colocated instances follow their role, pins cycle, open slots get no node in a "
          "cluster") {
  auto reg = dummy_registry();
  auto b = base();
  b.role("echo", "dummy", dummy_options{}).replicas(4);
  b.role("pinger", "dummy", dummy_options{}).replicas(4).colocate("echo");
  b.role("pinned", "dummy", dummy_options{}).replicas(3).pin({1, 2});
  b.role("volunteer", "dummy", dummy_options{}).replicas(2).open();
  auto g = b.build(reg, run_mode::cluster);
  REQUIRE(g);
  auto p = make_plan(*g, run_mode::cluster, 4, 1);
  REQUIRE(p);
  auto at = node_of(*p);
  for (int i = 0; i < 4; ++i)
    CHECK(at[fmt::format("pinger.{}", i)] == at[fmt::format("echo.{}", i)]);
  CHECK(at["pinned.0"] == 1);
  CHECK(at["pinned.1"] == 2);
  CHECK(at["pinned.2"] == 1);
  CHECK(at.count("volunteer.0") == 0);
  CHECK(p->instances.back().name == "volunteer.1");
  CHECK(!p->instances.back().node);
  // In a simulation the volunteers get machines of their own after the numbered nodes.
  auto ps = make_plan(*g, run_mode::sim, 4, 1);
  REQUIRE(ps);
  auto ats = node_of(*ps);
  CHECK(ats["volunteer.0"] == 4);
  CHECK(ats["volunteer.1"] == 5);
  CHECK(ps->total_nodes() == 6);
}

TEST_CASE("join and leave events and timed faults are placed as configured") {
  auto reg = dummy_registry();
  auto b = base();
  b.role("peers", "dummy", dummy_options{}).replicas(2).restart_delay(3s);
  b.join("peers", 30s, 2);
  b.leave("peers", 1, 60s);
  b.kill("peers", 3, 40s, restart_after{std::chrono::nanoseconds{7s}, false});
  b.kill_node(1, 20s, restart_after{std::nullopt, true});
  b.partition({{0}, {1, 2}}, 50s, 70s);
  b.slow_link(0, 2, 100ms, 1e6, 10s, 15s);
  auto g = b.build(reg, run_mode::sim);
  REQUIRE(g);
  auto p = make_plan(*g, run_mode::sim, 3, 1);
  REQUIRE(p);
  REQUIRE(p->instances.size() == 4);
  CHECK(p->instances[2].name == "peers.2");
  CHECK(p->instances[2].start == 30s);
  CHECK(p->instances[3].start == 30s);
  CHECK(p->instances[1].leave == std::optional<std::chrono::nanoseconds>{60s});
  std::vector<std::pair<double, std::string>> seen;
  for (auto& f : p->faults)
    seen.emplace_back(std::chrono::duration<double>(f.at).count(), to_string(f.what));
  std::vector<std::pair<double, std::string>> want{
    {10, "slow_link"}, {15, "restore_link"}, {20, "kill_node"},
    {40, "kill_instance"}, {50, "partition"}, {70, "heal"}};
  CHECK(seen == want);
  CHECK(p->faults[2].never);
  CHECK(p->faults[3].restart == 7s);
  CHECK(p->instances[p->faults[3].instance].name == "peers.3");
  // The victim's node carries the kill out; the partition is the share of nodes 0, 1, 2.
  auto victim_node = *p->instances[p->faults[3].instance].node;
  auto mine = p->faults_of(victim_node);
  CHECK(std::find(mine.begin(), mine.end(), size_t{3}) != mine.end());
  for (size_t n = 0; n < 3; ++n) {
    auto fs = p->faults_of(n);
    CHECK(std::find(fs.begin(), fs.end(), size_t{4}) != fs.end());
  }
}

TEST_CASE("placements that cannot be met and faults a mode cannot carry out are errors") {
  auto reg = dummy_registry();
  {
    auto b = base();
    b.role("a", "dummy", dummy_options{}).pin({5});
    auto g = b.build(reg, run_mode::cluster);
    REQUIRE(g);
    auto p = make_plan(*g, run_mode::cluster, 2, 1);
    REQUIRE(!p);
    CHECK(p.error().what.find("node 5 does not exist") != std::string::npos);
  }
  {
    auto b = base();
    b.role("a", "dummy", dummy_options{}).colocate("b");
    b.role("b", "dummy", dummy_options{}).colocate("a");
    auto g = b.build(reg, run_mode::sim);
    REQUIRE(!g);
    CHECK(g.error().what.find("cycle") != std::string::npos);
  }
  {
    auto b = base();
    b.role("a", "dummy", dummy_options{});
    b.slow_link(0, 1, 10ms, 0, 1s);
    CHECK(b.build(reg, run_mode::sim));
    auto local = b.build(reg, run_mode::local);
    REQUIRE(!local);
    CHECK(local.error().what.find("not supported in local mode") != std::string::npos);
    CHECK(!b.build(reg, run_mode::cluster));
  }
  {
    auto b = base();
    b.role("a", "dummy", dummy_options{});
    b.partition({{0}, {1}}, 1s);
    CHECK(b.build(reg, run_mode::sim));
    CHECK(b.build(reg, run_mode::cluster));
    CHECK(!b.build(reg, run_mode::local));
  }
  {
    auto b = base();
    b.role("a", "dummy", dummy_options{});
    b.kill("nobody", std::nullopt, 1s);
    auto g = b.build(reg, run_mode::sim);
    REQUIRE(!g);
    CHECK(g.error().what.find("no role named 'nobody'") != std::string::npos);
  }
  {
    auto b = base();
    b.role("a", "no.such.type", dummy_options{});
    auto g = b.build(reg, run_mode::sim);
    REQUIRE(!g);
    CHECK(g.error().what.find("unknown role type") != std::string::npos);
  }
  {
    auto b = base();
    b.role("a", "dummy", 42); // options of the wrong type
    auto g = b.build(reg, run_mode::sim);
    REQUIRE(!g);
    CHECK(g.error().what.find("expected the options of role type 'dummy'") != std::string::npos);
  }
}

} // namespace starling::test::runtime_plan_test
