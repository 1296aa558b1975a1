// The metrics relay: a trainer's microbatch reports and its stop become metric events of the
// trainer's name for the node's sink.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/trainer/metrics_relay.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/registry.hpp"

namespace starling::test::actors_metrics_relay_test {

using starling::messages::metric_event;

TEST_CASE("the metrics relay turns a trainer's reports into microbatch and done events") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.inline-output", true);
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  auto out = std::make_shared<std::vector<metric_event>>();
  auto sink = sys.spawn([out](caf::event_based_actor*) -> caf::behavior {
    return {[out](metric_event& e) { out->push_back(std::move(e)); }};
  });
  auto relay = actors::trainer::spawn_metrics_relay(sys, {"trainer.3", sink});
  caf::anon_send(relay, report_atom::value, std::string{"t"}, 2.5, int64_t{16}, int64_t{1}, 0.25,
                 uint64_t{7});
  caf::anon_send(relay, stop_atom::value, std::string{"t"});
  while (sched.run() > 0) {
  }
  REQUIRE(out->size() == 2);
  auto& m = (*out)[0];
  CHECK(m.source == "trainer.3"); // the relay's name, not the one in the report
  CHECK(m.kind == "microbatch");
  CHECK(m.values.at("loss") == 2.5);
  CHECK(m.values.at("samples") == 16);
  CHECK(m.values.at("retries") == 1);
  CHECK(m.values.at("latency_s") == 0.25);
  CHECK(m.values.at("batch") == 7);
  CHECK((*out)[1].source == "trainer.3");
  CHECK((*out)[1].kind == "done");
  CHECK((*out)[1].values.empty());
  for (auto& a : {relay, sink})
    caf::anon_send_exit(a, caf::exit_reason::kill);
  while (sched.run() > 0) {
  }
}

} // namespace starling::test::actors_metrics_relay_test
