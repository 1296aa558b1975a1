#include "actors/supervisor/supervisor.hpp"

#include <map>
#include <memory>

#include <caf/all.hpp>

#include "messages/atoms.hpp"

namespace starling::actors::supervisor {

namespace {

struct child {
  child_spec spec;
  int generation = 0;
  caf::actor handle;
  bool pending_restart = false;
};

struct data {
  std::vector<child> children;
  std::map<caf::actor_addr, size_t> index_of;
  caf::actor observer;
  uint64_t respawns = 0;
  bool stopping = false;
};

} // namespace

caf::behavior supervisor_actor(caf::event_based_actor* self, std::vector<child_spec> specs,
                               caf::actor observer) {
  auto d = std::make_shared<data>();
  d->observer = std::move(observer);
  auto start = [=](size_t i) {
    auto& c = d->children[i];
    c.handle = c.spec.spawn(c.generation);
    if (!c.handle)
      return;
    d->index_of[c.handle.address()] = i;
    self->monitor(c.handle);
  };
  for (auto& s : specs)
    d->children.push_back(child{std::move(s)});
  for (size_t i = 0; i < d->children.size(); ++i)
    start(i);
  self->attach_functor([d] {
    d->stopping = true;
    for (auto& c : d->children)
      if (c.handle)
        caf::anon_send_exit(c.handle, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto i = d->index_of.find(dm.source);
    if (i == d->index_of.end())
      return;
    auto idx = i->second;
    d->index_of.erase(i);
    auto& c = d->children[idx];
    c.handle = nullptr;
    if (d->stopping || c.spec.restart_delay < caf::timespan{0} || c.pending_restart)
      return;
    c.pending_restart = true;
    self->delayed_send(self, c.spec.restart_delay, tick_atom::value, static_cast<uint64_t>(idx));
  });
  return {
    [=](preempt_atom, uint64_t idx) {
      if (idx < d->children.size() && d->children[idx].handle)
        self->send_exit(d->children[idx].handle, caf::exit_reason::kill);
    },
    [=](tick_atom, uint64_t idx) {
      if (idx >= d->children.size())
        return;
      auto& c = d->children[idx];
      c.pending_restart = false;
      if (c.handle)
        return;
      c.generation++;
      start(idx);
      d->respawns++;
      if (d->observer)
        self->send(d->observer, respawn_atom::value, idx, c.spec.name, c.generation);
    },
    [=](get_atom, uint64_t idx) -> caf::result<caf::actor> {
      if (idx >= d->children.size())
        return caf::make_error(caf::sec::invalid_argument,
                               "no child " + std::to_string(idx));
      return d->children[idx].handle;
    },
    [=](status_atom) {
      uint64_t alive = 0;
      for (auto& c : d->children)
        alive += c.handle ? 1 : 0;
      return caf::make_message(alive, d->respawns);
    },
  };
}

caf::actor spawn_supervisor(caf::actor_system& sys, std::vector<child_spec> children,
                            caf::actor observer) {
  return sys.spawn(supervisor_actor, std::move(children), std::move(observer));
}

} // namespace starling::actors::supervisor
