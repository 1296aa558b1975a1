#include "actors/stage/fetch_state.hpp"

#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/collab/state_download.hpp"
#include "messages/atoms.hpp"

namespace starling::actors::stage {

void fetch_stage_state(caf::event_based_actor* self, const caf::actor& board, uint64_t stage,
                       caf::timespan timeout, uint64_t min_steps,
                       std::function<void(const messages::stage_state&, size_t)> got,
                       std::function<void(bool)> none, bool newest) {
  self->request(board, timeout, get_atom::value, stage)
    .then(
      [=](const std::vector<std::string>&, const std::vector<caf::actor>& peers) {
        std::vector<caf::actor> donors;
        for (auto& p : peers)
          if (p.address() != self->address())
            donors.push_back(p);
        if (donors.empty()) {
          none(true);
          return;
        }
        collab::download_options o;
        o.timeout = timeout;
        o.min_steps = min_steps;
        o.newest = newest;
        collab::fetch_state(
          self, collab::donor_source::of(std::move(donors)), o,
          [got](collab::downloaded_state d) { got(d.state, d.donors); },
          [none](const std::string&) { none(false); });
      },
      [=](caf::error&) { none(true); });
}

std::function<void()> make_join_download(
    caf::event_based_actor* self, caf::actor board, uint64_t stage, join_options opts,
    std::function<bool(const messages::stage_state&, size_t)> take, std::function<void()> start,
    std::function<bool()> restore, caf::actor replicas,
    std::function<bool(const messages::stage_state&, size_t)> take_replica) {
  auto first_try = self->clock().now();
  return [=] {
    auto retry_or_give_up = [=](bool stage_empty) {
      auto waited = self->clock().now() - first_try;
      if (opts.download_state && !(stage_empty && waited >= opts.patience))
        self->delayed_send(self, opts.retry_every, state_atom::value);
      else
        start();
    };
    auto retry_or_start = [=](bool stage_empty) {
      // Nobody to download from: the stage's state lives on only in checkpoints, on this node's
      // disk or replicated on other nodes.
      if (stage_empty && restore && restore()) {
        start();
        return;
      }
      if (stage_empty && replicas && take_replica) {
        fetch_stage_state(
            self, replicas, stage, opts.timeout, 0,
            [=](const messages::stage_state& s, size_t holders) {
              if (take_replica(s, holders))
                start();
              else
                retry_or_give_up(true);
            },
            [=](bool) { retry_or_give_up(true); }, true);
        return;
      }
      retry_or_give_up(stage_empty);
    };
    fetch_stage_state(
        self, board, stage, opts.timeout, 0,
        [=](const messages::stage_state& s, size_t donors) {
          if (take(s, donors))
            start();
          else
            retry_or_start(false);
        },
        retry_or_start); // an empty stage, or every donor failed
  };
}

} // namespace starling::actors::stage
