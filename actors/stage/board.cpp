#include "actors/stage/board.hpp"

#include <map>

#include <caf/all.hpp>

#include "messages/atoms.hpp"

namespace starling::actors::stage {

namespace {

struct board_state {
  std::vector<std::map<std::string, caf::actor>> stages;
};

caf::behavior board(caf::stateful_actor<board_state>* self, size_t stages) {
  self->state.stages.resize(stages);
  self->set_down_handler([=](const caf::down_msg& dm) {
    for (auto& s : self->state.stages)
      for (auto i = s.begin(); i != s.end();)
        i = i->second.address() == dm.source ? s.erase(i) : std::next(i);
  });
  return {
    [=](put_atom, uint64_t stage, const std::string& name,
        const caf::actor& peer) -> caf::result<void> {
      if (stage >= self->state.stages.size())
        return caf::make_error(caf::sec::invalid_argument, "no stage " + std::to_string(stage));
      self->monitor(peer);
      self->state.stages[stage][name] = peer;
      return caf::unit;
    },
    [=](get_atom, uint64_t stage)
      -> caf::result<std::vector<std::string>, std::vector<caf::actor>> {
      if (stage >= self->state.stages.size())
        return caf::make_error(caf::sec::invalid_argument, "no stage " + std::to_string(stage));
      std::vector<std::string> names;
      std::vector<caf::actor> handles;
      for (auto& kv : self->state.stages[stage]) {
        names.push_back(kv.first);
        handles.push_back(kv.second);
      }
      return {std::move(names), std::move(handles)};
    },
    [=](list_atom) {
      std::vector<uint64_t> counts;
      for (auto& s : self->state.stages)
        counts.push_back(s.size());
      return counts;
    },
  };
}

} // namespace

caf::actor spawn_board(caf::actor_system& sys, size_t stages) {
  return sys.spawn(board, stages);
}

} // namespace starling::actors::stage
