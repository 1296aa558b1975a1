// A CAF actor system on the deterministic test coordinator (virtual time, no threads), with the
// message types registered: for tests of single actors.
#pragma once

#include <memory>

#include <caf/all.hpp>

#include "messages/registry.hpp"

namespace starling::test {

struct test_system {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;

  test_system() {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.inline-output", true);
    messages::register_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
  }

  /// Runs every message that is due (no timeout fires).
  void run() {
    while (sched->run() > 0) {
    }
  }

  /// Advances virtual time by `d` and runs what became due.
  void advance(caf::timespan d) {
    sched->clock().advance_time(d);
    run();
  }

  /// Runs every message and fires every pending timeout until nothing is left.
  void run_all() {
    while (sched->run() > 0 || sched->trigger_timeout()) {
    }
  }
};

} // namespace starling::test
