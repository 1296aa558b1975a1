#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/execution_unit.hpp>

#include "messages/enveloped.hpp"
#include "messages/wire_context.hpp"

namespace starling::messages {

wire_context* wire_context_of(caf::execution_unit* unit) {
  if (!unit)
    return nullptr;
  auto* holder = dynamic_cast<const wire_context_holder*>(&unit->system().config());
  return holder ? holder->wire.get() : nullptr;
}

} // namespace starling::messages
