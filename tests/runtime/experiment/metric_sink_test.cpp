// The node's metrics sink across processes: a metric from another node of the run is delivered
// as it was sent; one whose envelope was refused becomes this node's "refused" note with the
// reason, never an empty metric of nobody.
#include <doctest/doctest.h>

#include <condition_variable>
#include <mutex>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/averager/averager.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/wire_context.hpp"
#include "runtime/experiment/node_runtime.hpp"
#include "runtime/node/node.hpp"
#include "runtime/node/gate.hpp"
#include "tests/support/closed_run.hpp"
#include "tests/support/node_fixtures.hpp"

namespace starling::test::runtime_metric_sink_test {

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;

namespace {

/// What the metrics sink needs of a host: its node's system, name and clock. Nothing else is
/// called by `spawn_metric_sink` when it delivers locally.
class sink_host : public node_host {
public:
  sink_host(node& n, std::string name) : node_(n), name_(std::move(name)) {}
  caf::actor_system& system() override { return node_.system(); }
  run_mode mode() const override { return run_mode::cluster; }
  size_t index() const override { return 0; }
  const std::string& name() const override { return name_; }
  std::string endpoint() const override { return node_.endpoint(); }
  caf::actor resolver() override { return node_.resolver(); }
  caf::actor dht() override { return {}; }
  caf::actor metrics() override { return sink; }
  void register_actor(const std::string& name, const caf::actor& a) override {
    node_.register_actor(name, a);
  }
  void adopt(const caf::actor&) override {}
  caf::actor service(const std::string&, const std::function<caf::actor(host&)>&) override {
    return {};
  }
  caf::actor spawn_averager(const std::string&, actors::averager::averager_options) override {
    return {};
  }
  caf::actor view(const caf::actor& a) override { return a; }
  caf::actor shared_service(const std::string&, const std::function<caf::actor()>&) override {
    return {};
  }
  const experiment_graph& graph() const override { return graph_; }
  const struct plan& plan() const override { return plan_; }
  std::chrono::nanoseconds elapsed() override { return std::chrono::seconds(3); }

private:
  node& node_;
  std::string name_;
  experiment_graph graph_;
  struct plan plan_;
};

/// Records delivered to the sink, waited for without sleeping.
struct delivered {
  std::mutex mtx;
  std::condition_variable cv;
  std::vector<metric_record> records;

  void add(const metric_record& m) {
    std::lock_guard<std::mutex> g{mtx};
    records.push_back(m);
    cv.notify_all();
  }

  bool wait_for(size_t n) {
    std::unique_lock<std::mutex> g{mtx};
    return cv.wait_for(g, 10s, [&] { return records.size() >= n; });
  }
};

} // namespace

TEST_CASE("a metric whose envelope was refused becomes the receiving node's note with the reason") {
  // A closed run: c is admitted, then its token is revoked; its next envelope is refused.
  testing::closed_run run;
  auto a = run.start("a", false);
  auto same = run.start("b", false);
  auto other = run.start("c", false);
  sink_host h{*a, "node0"};
  delivered got;
  h.sink = spawn_metric_sink(
      h, [&](const metric_record& m) { got.add(m); }, "");
  a->register_actor("metrics", h.sink);
  auto address = fmt::format("127.0.0.1:{}/metrics", a->port());
  auto resolve_sink = [&](node& from) {
    caf::scoped_actor self{from.system()};
    caf::actor sink;
    self->request(from.resolver(), 5s, resolve_atom::value, address)
        .receive([&](const caf::actor& x) { sink = x; },
                 [&](caf::error& err) { FAIL("resolve failed: " << from.system().render(err)); });
    REQUIRE(sink);
    return sink;
  };
  auto send_from = [&](node& from, const caf::actor& sink, messages::metric_event e) {
    caf::scoped_actor self{from.system()};
    self->send(sink, std::move(e));
  };
  send_from(*same, resolve_sink(*same),
            messages::metric_event{"trainer.1", "microbatch", {{"loss", 2.5}}, {}, 1.25});
  REQUIRE(got.wait_for(1));
  // c resolves the sink while its token is valid, and keeps the handle.
  auto sink_of_c = resolve_sink(*other);
  std::string why;
  REQUIRE(a->gate()->install_deny_list(testing::revoke(run, testing::token_id_of(run, "c")), why));
  send_from(*other, sink_of_c,
            messages::metric_event{"intruder", "microbatch", {{"loss", 0.0}}, {}, 1.0});
  REQUIRE(got.wait_for(2));
  std::vector<metric_record> records;
  {
    std::lock_guard<std::mutex> g{got.mtx};
    records = got.records;
  }
  // The sink refers to `h` and `got`: stop it (with its node) before they go.
  a->shutdown();
  auto& ok = records[0];
  CHECK(ok.source == "trainer.1");
  CHECK(ok.kind == "microbatch");
  CHECK(ok.values.at("loss") == 2.5);
  CHECK(ok.t == 1.25);
  auto& note = records[1];
  CHECK(note.source == "node0/wire");
  CHECK(note.kind == "refused");
  CHECK(note.values.empty());
  REQUIRE(note.labels.count("reason") == 1);
  CHECK(note.labels.at("reason").find("envelope refused (unauthorized): refused (revoked)") !=
        std::string::npos);
  // Stamped with the receiving node's run time, not a time the refused sender claimed.
  CHECK(note.t == 3.0);
  CHECK(a->wire()->refused(messages::wire_reason::unauthorized) == 1);
}

} // namespace starling::test::runtime_metric_sink_test
