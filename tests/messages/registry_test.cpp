#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "messages/registry.hpp"

namespace starling::test::messages_registry_test {

namespace {

/// A config with starling's types registered (no scheduler needed for serialization).
struct registry_config : caf::actor_system_config {
  registry_config() {
    starling::messages::register_types(*this);
    set("scheduler.policy", caf::atom("testing"));
  }
};

} // namespace

TEST_CASE("every registered message type round-trips through CAF's binary serializer") {
  registry_config cfg;
  caf::actor_system sys{cfg};
  int checked = 0;
  for (auto& kv : cfg.value_factories_by_name) {
    if (kv.first.rfind("starling.", 0) != 0)
      continue;
    INFO(kv.first);
    auto original = kv.second();
    REQUIRE(original);
    std::vector<char> first;
    caf::binary_serializer sink{sys, first};
    CHECK_FALSE(original->save(sink));
    auto copy = kv.second();
    caf::binary_deserializer source{sys, first};
    CHECK_FALSE(copy->load(source));
    std::vector<char> second;
    caf::binary_serializer sink2{sys, second};
    CHECK_FALSE(copy->save(sink2));
    CHECK(first == second);
    // The wire name is what a remote node looks the type up by: it must name a registered type
    // (CAF names vectors of registered types itself, e.g. `std::vector<starling.dht_peer>`).
    const auto& wire = sys.types().portable_name(copy->type());
    CHECK((wire == kv.first || cfg.value_factories_by_name.count(wire) > 0
           || wire.rfind("std::vector<starling.", 0) == 0));
    ++checked;
  }
  CHECK(checked >= 2);
}

} // namespace starling::test::messages_registry_test
