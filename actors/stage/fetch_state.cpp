#include "actors/stage/fetch_state.hpp"

#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "messages/atoms.hpp"

namespace starling::actors::stage {

void fetch_stage_state(caf::event_based_actor* self, const caf::actor& board, uint64_t stage,
                       caf::timespan timeout, uint64_t min_steps,
                       std::function<void(const messages::stage_state&)> got,
                       std::function<void(bool stage_empty)> none) {
  self->request(board, timeout, get_atom::value, stage)
    .then(
      [=](const std::vector<std::string>&, const std::vector<caf::actor>& peers) {
        auto donors = std::make_shared<std::vector<caf::actor>>();
        for (auto& p : peers)
          if (p.address() != self->address())
            donors->push_back(p);
        if (donors->empty()) {
          none(true);
          return;
        }
        auto remaining = std::make_shared<size_t>(donors->size());
        auto done = std::make_shared<bool>(false);
        for (auto& p : *donors)
          self->request(p, timeout, get_atom::value, state_atom::value)
            .then(
              [=](const messages::stage_state& s) {
                --*remaining;
                if (*done)
                  return;
                if (s.steps >= min_steps) {
                  *done = true;
                  got(s);
                } else if (*remaining == 0) {
                  *done = true;
                  none(false);
                }
              },
              [=](caf::error&) {
                if (--*remaining == 0 && !*done) {
                  *done = true;
                  none(false);
                }
              });
      },
      [=](caf::error&) { none(true); });
}

} // namespace starling::actors::stage
