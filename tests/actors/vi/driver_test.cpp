// The vi driver: it resolves its workers, runs the server segment by segment as its policy says
// (the report cumulative, as one run), and reports each segment, the end, or why it failed.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/vi/driver.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/registry.hpp"
#include "messages/vi.hpp"
#include "tests/support/test_system.hpp"

namespace starling::test::actors_vi_driver_test {

using namespace starling::actors::vi;
using starling::messages::metric_event;
using starling::messages::vi_report;

namespace {

/// A deterministic actor system (CAF-NOTES, "Deterministic tests with doctest").
using starling::test::test_system;

/// A driver over a small bilinear problem's workers, its metrics kept in `out`; the resolver
/// knows the workers as `@0/worker.<i>`, except `missing`.
struct driven {
  std::vector<caf::actor> actors;
  caf::actor driver;
};

driven spawn_driven(test_system& ts, std::shared_ptr<std::vector<metric_event>> out,
                    segment_policy next, const std::string& missing = {}) {
  auto& sys = *ts.sys;
  bilinear_options bo;
  bo.dim_per_player = 10;
  bo.workers = 2;
  bo.seed = 5;
  auto p = std::make_shared<const bilinear_problem>(*bilinear_problem::make(bo));
  server_options so;
  so.method.method = method_kind::extragradient;
  so.method.gamma = 0.05;
  driven d;
  std::map<std::string, caf::actor> known;
  driver_options o;
  for (size_t i = 0; i < p->workers(); ++i) {
    auto name = "@0/worker." + std::to_string(i);
    auto w = spawn_worker(sys, p, i, so.method);
    d.actors.push_back(w);
    if (name != missing)
      known[name] = w;
    o.workers.push_back(name);
  }
  o.resolver = sys.spawn([known](caf::event_based_actor*) -> caf::behavior {
    return {[known](resolve_atom, const std::string& a) -> caf::result<caf::actor> {
      if (auto i = known.find(a); i != known.end())
        return i->second;
      return caf::make_error(caf::sec::invalid_argument, a);
    }};
  });
  o.sink = sys.spawn([out](caf::event_based_actor*) -> caf::behavior {
    return {[out](metric_event& e) { out->push_back(std::move(e)); }};
  });
  o.name = "server.0";
  o.dim = p->dim();
  o.server = so;
  o.next = std::move(next);
  d.actors.push_back(o.resolver);
  d.actors.push_back(o.sink);
  d.driver = spawn_driver(sys, std::move(o));
  d.actors.push_back(d.driver);
  return d;
}

void stop(test_system& ts, driven& d) {
  for (auto& a : d.actors)
    caf::anon_send_exit(a, caf::exit_reason::kill);
  ts.run_all();
}

} // namespace

TEST_CASE("the vi driver runs the segments its policy asks for and reports each") {
  test_system ts;
  auto out = std::make_shared<std::vector<metric_event>>();
  // 5 iterations, then 3 more, then the end; each segment's metric gets a mark.
  auto asked = std::make_shared<std::vector<uint64_t>>();
  auto d = spawn_driven(ts, out, [asked](const vi_report* r, metric_event& m) -> uint64_t {
    asked->push_back(r ? r->iterations : 0);
    if (!r)
      return 5;
    m.values["mark"] = static_cast<double>(asked->size());
    return r->iterations < 8 ? 3 : 0;
  });
  ts.run_all();
  CHECK(*asked == std::vector<uint64_t>{0, 5, 8});
  REQUIRE(out->size() == 3);
  CHECK((*out)[0].kind == "segment");
  CHECK((*out)[0].source == "server.0");
  CHECK((*out)[0].values.at("iterations") == 5);
  CHECK((*out)[0].values.at("live_workers") == 2);
  CHECK((*out)[0].values.at("mark") == 2);
  CHECK((*out)[1].kind == "segment");
  CHECK((*out)[1].values.at("iterations") == 8); // cumulative, as one run
  CHECK((*out)[1].values.at("bits_up") > (*out)[0].values.at("bits_up"));
  CHECK((*out)[2].kind == "done");
  stop(ts, d);
}

TEST_CASE("the vi driver reports a worker it cannot resolve as the run's failure") {
  test_system ts;
  auto out = std::make_shared<std::vector<metric_event>>();
  auto d = spawn_driven(
      ts, out, [](const vi_report*, metric_event&) -> uint64_t { return 5; }, "@0/worker.1");
  ts.run_all();
  REQUIRE(out->size() == 1);
  CHECK((*out)[0].kind == "failed");
  CHECK((*out)[0].labels.at("reason").rfind("worker @0/worker.1: ", 0) == 0);
  stop(ts, d);
}

} // namespace starling::test::actors_vi_driver_test
