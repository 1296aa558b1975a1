#include "runtime/experiment/role.hpp"

#include <fmt/format.h>

#include "runtime/experiment/plan.hpp"

namespace starling::runtime {

std::string role_context::address_of(const std::string& other, size_t i) const {
  auto& g = node.graph();
  auto& p = node.plan();
  for (size_t r = 0; r < g.roles.size(); ++r) {
    if (g.roles[r].name != other)
      continue;
    if (auto* x = p.find(r, i); x && x->node)
      return fmt::format("@{}/{}", *x->node, x->name);
    // A volunteer slot: whoever claimed it registered the name in the DHT.
    return fmt::format("@open/{}.{}", other, i);
  }
  return {};
}

std::vector<std::string> role_context::addresses_of(const std::string& other) const {
  auto& g = node.graph();
  auto& p = node.plan();
  std::vector<std::string> out;
  for (size_t r = 0; r < g.roles.size(); ++r)
    if (g.roles[r].name == other)
      for (auto i : p.of_role(r))
        out.push_back(address_of(other, p.instances[i].index));
  return out;
}

std::string role_context::key_prefix() const {
  return node.graph().name;
}

void role_registry::configure(caf::actor_system_config& cfg) const {
  for (auto& f : message_types_)
    f(cfg);
}

role_type& role_registry::add_type(role_type t) {
  auto name = t.name;
  auto& slot = types_[name];
  slot = std::move(t);
  return slot;
}

void role_registry::add_kind(kind_type k) {
  auto name = k.name;
  kinds_[name] = std::move(k);
}

const role_type* role_registry::find(const std::string& name) const {
  auto i = types_.find(name);
  return i == types_.end() ? nullptr : &i->second;
}

const kind_type* role_registry::find_kind(const std::string& name) const {
  auto i = kinds_.find(name);
  return i == kinds_.end() ? nullptr : &i->second;
}

std::vector<std::string> role_registry::type_names() const {
  std::vector<std::string> out;
  for (auto& kv : types_)
    out.push_back(kv.first);
  return out;
}

std::vector<std::string> role_registry::kind_names() const {
  std::vector<std::string> out;
  for (auto& kv : kinds_)
    out.push_back(kv.first);
  return out;
}

} // namespace starling::runtime
