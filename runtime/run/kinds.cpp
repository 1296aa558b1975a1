#include "runtime/run/kinds.hpp"

namespace starling::runtime {

role_registry builtin_registry() {
  role_registry reg;
  add_ping(reg);
  add_swarm(reg);
  add_masha(reg);
  add_dedloc(reg);
  add_btard(reg);
  return reg;
}

} // namespace starling::runtime
