#include "actors/collab/state_download.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/stage/state_parts.hpp"
#include "messages/atoms.hpp"

namespace starling::actors::collab {

donor_source donor_source::of(std::vector<caf::actor> donors) {
  donor_source s;
  s.count = donors.size();
  auto held = std::make_shared<const std::vector<caf::actor>>(std::move(donors));
  s.resolve = [held](size_t i, std::function<void(caf::actor)> ok,
                     std::function<void(std::string)>) { ok((*held)[i]); };
  return s;
}

namespace {

using got_fn = std::function<void(downloaded_state)>;
using none_fn = std::function<void(const std::string&)>;

/// One download in flight (shared by its handlers).
struct download {
  caf::event_based_actor* self = nullptr;
  donor_source donors;
  download_options opts;
  got_fn got;
  none_fn none;
  /// `got` or `none` ran (or the parts were given up, for their late answers).
  bool done = false;
  /// The last reason a donor gave nothing usable.
  std::string why = "no donor answered";

  bool cancelled() const { return opts.cancelled && opts.cancelled(); }

  std::string refused(const messages::stage_state& s) const {
    return opts.refuse ? opts.refuse(s) : std::string{};
  }

  void finish(messages::stage_state s, size_t n) {
    done = true;
    if (!cancelled())
      got(downloaded_state{std::move(s), n});
  }

  void fail() {
    done = true;
    if (!cancelled())
      none(why);
  }

  void forget(size_t i) {
    if (donors.forget)
      donors.forget(i);
  }
};

using download_ptr = std::shared_ptr<download>;

/// Asks donor `i` for its whole state (as a verified single part with `whole_as_part`): `ok`
/// with it, or `failed` with why not.
void ask_whole(const download_ptr& d, size_t i, std::function<void(messages::stage_state&)> ok,
               std::function<void(std::string)> failed) {
  auto self = d->self;
  d->donors.resolve(
    i,
    [=](caf::actor a) {
      auto on_error = [=](caf::error& e) {
        d->forget(i);
        failed(fmt::format("donor {}: {}", i, caf::to_string(e)));
      };
      if (d->opts.whole_as_part) {
        self->request(a, d->opts.timeout, get_atom::value, state_atom::value, uint64_t{0},
                      uint64_t{1})
          .then(
            [=](messages::stage_state_part& p) {
              auto whole = stage::assemble_state({std::move(p)});
              if (!whole) {
                failed(fmt::format("donor {}: {}", i, whole.error().what));
                return;
              }
              ok(*whole);
            },
            on_error);
        return;
      }
      self->request(a, d->opts.timeout, get_atom::value, state_atom::value)
        .then([=](messages::stage_state& s) { ok(s); }, on_error);
    },
    [=](std::string why) { failed(fmt::format("donor {}: {}", i, why)); });
}

std::string behind(size_t i, uint64_t steps, uint64_t min_steps) {
  return fmt::format("donor {} is at step {}, {} needed", i, steps, min_steps);
}

/// Whole states from donors `next`, `next + 1`, ... one at a time.
void whole_in_turn(const download_ptr& d, size_t next) {
  if (d->cancelled())
    return;
  if (next >= d->donors.count) {
    d->fail();
    return;
  }
  ask_whole(
    d, next,
    [=](messages::stage_state& s) {
      if (s.steps < d->opts.min_steps) {
        d->why = behind(next, s.steps, d->opts.min_steps);
        whole_in_turn(d, next + 1);
        return;
      }
      if (auto no = d->refused(s); !no.empty()) {
        d->why = fmt::format("donor {}: {}", next, no);
        whole_in_turn(d, next + 1);
        return;
      }
      d->finish(std::move(s), 1);
    },
    [=](std::string why) {
      d->why = std::move(why);
      whole_in_turn(d, next + 1);
    });
}

/// Whole states from every donor at once (see `whole_policy::race` and `newest`).
void whole_race(const download_ptr& d) {
  auto remaining = std::make_shared<size_t>(d->donors.count);
  auto best = std::make_shared<std::optional<messages::stage_state>>();
  auto settle = [=] {
    if (*remaining > 0 || d->done)
      return;
    if (best->has_value())
      d->finish(std::move(**best), 1);
    else
      d->fail();
  };
  for (size_t i = 0; i < d->donors.count; ++i)
    ask_whole(
      d, i,
      [=](messages::stage_state& s) {
        --*remaining;
        if (d->done)
          return;
        auto no = s.steps < d->opts.min_steps ? behind(i, s.steps, d->opts.min_steps)
                                               : d->refused(s);
        if (!no.empty())
          d->why = s.steps < d->opts.min_steps ? no : fmt::format("donor {}: {}", i, no);
        if (d->opts.newest) {
          if (no.empty() && (!best->has_value() || s.steps > (*best)->steps))
            *best = std::move(s);
          settle();
          return;
        }
        if (no.empty())
          d->finish(std::move(s), 1);
        else if (*remaining == 0)
          d->fail();
      },
      [=](std::string why) {
        --*remaining;
        d->why = std::move(why);
        if (d->opts.newest) {
          settle();
          return;
        }
        if (*remaining == 0 && !d->done)
          d->fail();
      });
}

void whole(const download_ptr& d) {
  if (d->cancelled())
    return;
  if (d->opts.whole == whole_policy::in_turn)
    whole_in_turn(d, 0);
  else
    whole_race(d);
}

/// Part i of n from donor i, at once; whole states when that does not give one state.
void in_parts(const download_ptr& d, size_t n) {
  auto self = d->self;
  auto parts = std::make_shared<std::vector<std::optional<messages::stage_state_part>>>(n);
  auto left = std::make_shared<size_t>(n);
  auto failed = std::make_shared<bool>(false);
  auto over = std::make_shared<bool>(false); // the parts were given up or assembled
  auto give_up = [=] {
    *over = true;
    parts->clear();
    whole(d);
  };
  auto one_done = [=](bool ok) {
    if (*over)
      return;
    if (!ok) {
      *failed = true;
      if (d->opts.parts_fail_fast) {
        give_up();
        return;
      }
    }
    if (--*left > 0)
      return;
    if (!*failed) {
      std::vector<messages::stage_state_part> got;
      got.reserve(n);
      for (auto& p : *parts)
        got.push_back(std::move(*p));
      auto assembled = stage::assemble_state(got);
      std::string no;
      if (assembled && assembled->steps >= d->opts.min_steps)
        no = d->refused(*assembled);
      if (assembled && assembled->steps >= d->opts.min_steps && no.empty()) {
        *over = true;
        parts->clear();
        d->finish(std::move(*assembled), n);
        return;
      }
      d->why = !assembled ? "the parts do not make one state: " + assembled.error().what
               : !no.empty() ? "the parts' state: " + no
                             : behind(0, assembled->steps, d->opts.min_steps);
    }
    give_up();
  };
  for (size_t i = 0; i < n; ++i)
    d->donors.resolve(
      i,
      [=](caf::actor a) {
        self->request(a, d->opts.timeout, get_atom::value, state_atom::value,
                      static_cast<uint64_t>(i), static_cast<uint64_t>(n))
          .then(
            [=](messages::stage_state_part& p) {
              if (*over)
                return;
              if (p.steps < d->opts.min_steps) {
                d->why = behind(i, p.steps, d->opts.min_steps);
                one_done(false);
                return;
              }
              (*parts)[i] = std::move(p);
              one_done(true);
            },
            [=](caf::error& e) {
              d->forget(i);
              d->why = fmt::format("donor {}: {}", i, caf::to_string(e));
              one_done(false);
            });
      },
      [=](std::string why) {
        d->why = fmt::format("donor {}: {}", i, why);
        one_done(false);
      });
}

} // namespace

void fetch_state(caf::event_based_actor* self, donor_source donors, download_options opts,
                    std::function<void(downloaded_state)> got,
                    std::function<void(const std::string& why)> none) {
  auto d = std::make_shared<download>();
  d->self = self;
  d->donors = std::move(donors);
  d->opts = std::move(opts);
  d->got = std::move(got);
  d->none = std::move(none);
  if (d->cancelled())
    return;
  if (d->donors.count == 0) {
    d->why = "no donor";
    d->fail();
    return;
  }
  auto n = d->opts.parts ? std::min<size_t>(d->donors.count, stage::max_state_parts) : 1;
  if (n <= 1)
    whole(d);
  else
    in_parts(d, n);
}

} // namespace starling::actors::collab
