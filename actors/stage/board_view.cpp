#include "actors/stage/board_view.hpp"

#include <string>
#include <vector>

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"

namespace starling::actors::stage {

namespace {

struct board_view_state {
  static constexpr const char* name = "board_view";
  board_view_options opts;
};

caf::behavior board_view(caf::stateful_actor<board_view_state>* self, board_view_options opts) {
  self->state.opts = std::move(opts);
  return {
      [=](put_atom, uint64_t stage, const std::string& name, const caf::actor& peer) {
        self->send(self->state.opts.board, put_atom::value, stage, name, peer);
      },
      [=](load_atom, uint64_t stage, const std::string& name, double throughput, double queue) {
        self->send(self->state.opts.board, load_atom::value, stage, name, throughput, queue);
      },
      [=](get_atom,
          uint64_t stage) -> caf::result<std::vector<std::string>, std::vector<caf::actor>> {
        auto rp = self->make_response_promise<std::vector<std::string>, std::vector<caf::actor>>();
        self->request(self->state.opts.board, caf::infinite, get_atom::value, stage)
            .then(
                [=](std::vector<std::string>& names, std::vector<caf::actor>& handles) mutable {
                  if (auto& view = self->state.opts.view)
                    for (auto& x : handles)
                      x = view(x);
                  rp.deliver(std::move(names), std::move(handles));
                },
                [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
  };
}

} // namespace

caf::actor spawn_board_view(caf::actor_system& sys, board_view_options opts) {
  return sys.spawn(board_view, std::move(opts));
}

} // namespace starling::actors::stage
