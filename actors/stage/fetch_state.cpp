#include "actors/stage/fetch_state.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/stage/state_parts.hpp"
#include "messages/atoms.hpp"

namespace starling::actors::stage {

namespace {

using donor_list = std::shared_ptr<const std::vector<caf::actor>>;
using got_fn = std::function<void(const messages::stage_state&, size_t)>;
using none_fn = std::function<void(bool)>;

/// Asks every donor for its whole state at once; the first of at least `min_steps` steps wins
/// (with `newest`: the one with the most steps, once every donor answered or failed).
void race_whole(caf::event_based_actor* self, donor_list donors, caf::timespan timeout,
                uint64_t min_steps, bool newest, got_fn got, none_fn none) {
  auto remaining = std::make_shared<size_t>(donors->size());
  auto done = std::make_shared<bool>(false);
  auto best = std::make_shared<std::optional<messages::stage_state>>();
  auto settle = [=] {
    if (*remaining > 0 || *done)
      return;
    *done = true;
    if (best->has_value())
      got(**best, 1);
    else
      none(false);
  };
  for (auto& p : *donors)
    self->request(p, timeout, get_atom::value, state_atom::value)
      .then(
        [=](const messages::stage_state& s) {
          --*remaining;
          if (*done)
            return;
          if (newest) {
            if (s.steps >= min_steps && (!best->has_value() || s.steps > (*best)->steps))
              *best = s;
            settle();
            return;
          }
          if (s.steps >= min_steps) {
            *done = true;
            got(s, 1);
          } else if (*remaining == 0) {
            *done = true;
            none(false);
          }
        },
        [=](caf::error&) {
          --*remaining;
          if (newest) {
            settle();
            return;
          }
          if (*remaining == 0 && !*done) {
            *done = true;
            none(false);
          }
        });
}

/// Part i of n from donor i; falls back to `race_whole` at the first failure or mismatch.
void fetch_parts(caf::event_based_actor* self, donor_list donors, caf::timespan timeout,
                 uint64_t min_steps, bool newest, got_fn got, none_fn none) {
  auto n = std::min<uint64_t>(donors->size(), max_state_parts);
  auto parts = std::make_shared<std::vector<messages::stage_state_part>>();
  auto done = std::make_shared<bool>(false);
  auto fallback = [=] {
    *done = true;
    parts->clear();
    race_whole(self, donors, timeout, min_steps, newest, got, none);
  };
  for (uint64_t i = 0; i < n; ++i)
    self->request((*donors)[i], timeout, get_atom::value, state_atom::value, i, n)
      .then(
        [=](messages::stage_state_part& p) {
          if (*done)
            return;
          // A part already behind `min_steps` makes the whole state useless.
          if (p.steps < min_steps) {
            fallback();
            return;
          }
          parts->push_back(std::move(p));
          if (parts->size() < n)
            return;
          auto whole = assemble_state(*parts);
          if (!whole.ok()) {
            fallback();
            return;
          }
          *done = true;
          parts->clear();
          got(*whole, n);
        },
        [=](caf::error&) {
          if (!*done)
            fallback();
        });
}

} // namespace

void fetch_stage_state(caf::event_based_actor* self, const caf::actor& board, uint64_t stage,
                       caf::timespan timeout, uint64_t min_steps, got_fn got, none_fn none,
                       bool newest) {
  self->request(board, timeout, get_atom::value, stage)
    .then(
      [=](const std::vector<std::string>&, const std::vector<caf::actor>& peers) {
        auto donors = std::make_shared<std::vector<caf::actor>>();
        for (auto& p : peers)
          if (p.address() != self->address())
            donors->push_back(p);
        if (donors->empty())
          none(true);
        else if (donors->size() == 1)
          race_whole(self, donors, timeout, min_steps, newest, got, none);
        else
          fetch_parts(self, donors, timeout, min_steps, newest, got, none);
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
