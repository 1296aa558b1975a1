#include "actors/supervisor/supervisor.hpp"

#include <map>
#include <memory>
#include <optional>
#include <random>
#include <limits>

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"

namespace starling::actors::supervisor {

namespace {

struct child {
  child_spec spec;
  int generation = 0;
  caf::actor handle;
  bool pending_restart = false;
  /// Current stage (children with `spawn_at`).
  uint64_t stage = 0;
  /// Set while the child is being stopped to move to this stage, with the stages' throughputs
  /// the decision saw.
  std::optional<uint64_t> migrate_to;
  std::vector<double> migrate_seen;
  /// When it last arrived in its stage by a migration: it does not move again for two periods
  /// (its new stage's measurements settle first; a move back on noise costs two downloads).
  std::optional<caf::actor_clock::time_point> moved_at;
  /// A rebalancing check of this child is in flight.
  bool checking = false;
  /// Not spawned yet (waits for its `start_after`), or gone for good (left, or killed with no
  /// restart).
  bool waiting = false;
  bool gone = false;
  /// What the next death means: a kill's own restart delay (or never), set by the kill.
  std::optional<caf::timespan> forced_restart;
  bool forced_never = false;
};

struct data {
  std::vector<child> children;
  std::map<caf::actor_addr, size_t> index_of;
  caf::actor observer;
  rebalancing_options rebalancing;
  uint64_t respawns = 0;
  uint64_t migrations = 0;
  /// Administrative messages refused because they came from another node.
  uint64_t refused_admin = 0;
  bool stopping = false;
  /// Draws the weighted claims (seeded from the rebalancing options).
  std::mt19937_64 rng;
};

/// Stage reports from the board's answer; nothing when some stage's throughput is unknown.
std::optional<std::vector<stage_report>> reports_of(const std::vector<double>& throughput,
                                                    const std::vector<int64_t>& peers) {
  if (throughput.size() != peers.size() || throughput.empty())
    return std::nullopt;
  std::vector<stage_report> out;
  for (size_t k = 0; k < throughput.size(); ++k) {
    if (throughput[k] < 0)
      return std::nullopt;
    out.push_back(stage_report{throughput[k], peers[k]});
  }
  return out;
}

/// Board questions for a `place_first` child before it starts in its own stage.
constexpr uint64_t place_tries = 10;

} // namespace

caf::behavior supervisor_actor(caf::event_based_actor* self, std::vector<child_spec> specs,
                               caf::actor observer, rebalancing_options rebalancing) {
  auto d = std::make_shared<data>();
  d->observer = std::move(observer);
  d->rebalancing = std::move(rebalancing);
  d->rng.seed(d->rebalancing.seed ^ 0xc1a1f5ULL);
  auto start = [=](size_t i) {
    auto& c = d->children[i];
    c.handle = c.spec.spawn_at ? c.spec.spawn_at(c.generation, c.stage) : c.spec.spawn(c.generation);
    if (!c.handle)
      return;
    d->index_of[c.handle.address()] = i;
    self->monitor(c.handle);
  };
  // Starts the next generation of child `idx` in `stage` (reported to the observer).
  auto respawn = [=](size_t idx, uint64_t stage, std::vector<double> seen) {
    auto& c = d->children[idx];
    if (c.handle)
      return;
    if (stage != c.stage && d->observer)
      self->send(d->observer, migrate_atom::value, static_cast<uint64_t>(idx), c.spec.name,
                 c.stage, stage, std::move(seen));
    if (stage != c.stage)
      c.moved_at = self->clock().now();
    c.stage = stage;
    c.generation++;
    start(idx);
    d->respawns++;
    if (d->observer)
      self->send(d->observer, respawn_atom::value, static_cast<uint64_t>(idx), c.spec.name,
                 c.generation);
  };
  for (auto& s : specs) {
    child c{std::move(s)};
    c.stage = c.spec.stage;
    c.generation = c.spec.first_generation;
    d->children.push_back(std::move(c));
  }
  // The first spawn: a child placed by the board (`child_spec::place_first`) asks it first.
  auto first_start = [=](size_t i) {
    auto& c = d->children[i];
    if (c.spec.place_first && c.spec.spawn_at && d->rebalancing.board)
      self->send(self, load_atom::value, static_cast<uint64_t>(i), uint64_t{place_tries});
    else
      start(i);
  };
  for (size_t i = 0; i < d->children.size(); ++i) {
    auto& c = d->children[i];
    if (c.spec.leave_after >= caf::timespan{0})
      self->delayed_send(self, c.spec.leave_after, stop_atom::value, static_cast<uint64_t>(i));
    if (c.spec.start_after > caf::timespan{0}) {
      c.waiting = true;
      self->delayed_send(self, c.spec.start_after, ready_atom::value, static_cast<uint64_t>(i));
      continue;
    }
    first_start(i);
  }
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
    if (d->stopping || c.gone)
      return;
    if (c.forced_restart || c.forced_never) {
      // Killed by a fault that says when (or whether) it comes back.
      auto delay = c.forced_restart;
      auto never = c.forced_never;
      c.forced_restart.reset();
      c.forced_never = false;
      if (never) {
        c.gone = true;
        return;
      }
      c.pending_restart = true;
      self->delayed_send(self, *delay, tick_atom::value, static_cast<uint64_t>(idx));
      return;
    }
    if (c.migrate_to) {
      // Stopped to migrate: the next generation starts at once in the target stage.
      auto to = *c.migrate_to;
      c.migrate_to.reset();
      respawn(idx, to, std::move(c.migrate_seen));
      return;
    }
    if (c.spec.restart_delay < caf::timespan{0} || c.pending_restart || !c.spec.supervised)
      return;
    c.pending_restart = true;
    self->delayed_send(self, c.spec.restart_delay, tick_atom::value, static_cast<uint64_t>(idx));
  });
  auto& rb = d->rebalancing;
  if (rb.board && rb.period > caf::timespan{0}) {
    // The first check at a random phase, so that peers do not all decide at the same instant.
    std::mt19937_64 rng{rb.seed};
    std::uniform_real_distribution<double> phase{0.0, 1.0};
    auto first = std::chrono::duration_cast<caf::timespan>(rb.period * phase(rng));
    self->delayed_send(self, first, migrate_atom::value);
  }
  // Administration (DESIGN.md, "Trust and the wire"): preempting, stopping and starting children
  // is accepted only from this process (its node's fault injection, runner and signals), never
  // from another node, however admitted.
  // The refusal told to the sender (as the answer of a request, or as a message).
  auto foreign = [=](const char* what) -> std::optional<caf::error> {
    auto& sender = self->current_sender();
    if (!sender || sender->node() == self->node())
      return std::nullopt;
    ++d->refused_admin;
    return caf::make_error(caf::sec::request_receiver_down,
                           std::string{"refused (role_denied): '"} + what
                             + "' is accepted only from the supervisor's own node");
  };
  return {
    [=](preempt_atom, uint64_t idx) -> caf::result<void> {
      if (auto refused = foreign("admin.preempt"))
        return std::move(*refused);
      if (idx < d->children.size() && d->children[idx].handle)
        self->send_exit(d->children[idx].handle, caf::exit_reason::kill);
      return caf::unit;
    },
    [=](preempt_atom, uint64_t idx, caf::timespan restart, bool never) -> caf::result<void> {
      if (auto refused = foreign("admin.preempt"))
        return std::move(*refused);
      if (idx >= d->children.size() || !d->children[idx].handle || d->children[idx].migrate_to)
        return caf::unit;
      auto& c = d->children[idx];
      c.forced_restart = restart;
      c.forced_never = never;
      self->send_exit(c.handle, caf::exit_reason::kill);
      return caf::unit;
    },
    [=](stop_atom, uint64_t idx) -> caf::result<void> {
      if (auto refused = foreign("admin.stop"))
        return std::move(*refused);
      if (idx >= d->children.size())
        return caf::unit;
      auto& c = d->children[idx];
      c.gone = true;
      c.waiting = false;
      if (c.handle)
        self->send_exit(c.handle, caf::exit_reason::user_shutdown);
      return caf::unit;
    },
    [=](ready_atom, uint64_t idx) -> caf::result<void> {
      if (auto refused = foreign("admin.start"))
        return std::move(*refused);
      if (idx >= d->children.size())
        return caf::unit;
      auto& c = d->children[idx];
      if (!c.waiting || c.gone)
        return caf::unit;
      c.waiting = false;
      first_start(idx);
      return caf::unit;
    },
    // A child's first placement (`child_spec::place_first`): the stage the board picks, asked
    // again while the board cannot tell (some stage has not reported), then its own stage.
    [=](load_atom, uint64_t idx, uint64_t tries) -> caf::result<void> {
      if (auto refused = foreign("admin.start"))
        return std::move(*refused);
      if (idx >= d->children.size())
        return caf::unit;
      auto& rb = d->rebalancing;
      auto place = [=](std::optional<uint64_t> stage) {
        auto& c = d->children[idx];
        if (c.handle || c.gone || d->stopping)
          return;
        if (!stage && tries > 1) {
          self->delayed_send(self, d->rebalancing.join_hold / place_tries, load_atom::value, idx,
                             tries - 1);
          return;
        }
        if (stage)
          c.stage = *stage;
        start(idx);
        if (d->observer && c.handle)
          self->send(d->observer, put_atom::value, load_atom::value, idx, c.spec.name, c.stage,
                     stage.has_value());
      };
      self->request(rb.board, rb.timeout, put_atom::value, load_atom::value, rb.join_hold, true)
        .then(
          [=](uint64_t stage) {
            place(stage < std::numeric_limits<uint64_t>::max() ? std::optional<uint64_t>{stage}
                                                              : std::nullopt);
          },
          [=](caf::error&) { place(std::nullopt); });
      return caf::unit;
    },
    [=](tick_atom, uint64_t idx) {
      if (idx >= d->children.size())
        return;
      auto& c = d->children[idx];
      c.pending_restart = false;
      if (c.handle || c.gone)
        return;
      auto& rb = d->rebalancing;
      if (!(c.spec.spawn_at && rb.place_new_peers && rb.board)) {
        respawn(idx, c.stage, {});
        return;
      }
      // A new peer joins the stage that needs it most (its old one when the board cannot tell);
      // the board places and reserves in one step, so that peers restarting at once spread out.
      self->request(rb.board, rb.timeout, put_atom::value, load_atom::value, rb.join_hold)
        .then(
          [=](uint64_t stage) {
            auto& c = d->children[idx];
            respawn(idx, stage < std::numeric_limits<uint64_t>::max() ? stage : c.stage, {});
          },
          [=](caf::error&) { respawn(idx, d->children[idx].stage, {}); });
    },
    // Periodic rebalancing check of every live stage peer.
    [=](migrate_atom) {
      auto& rb = d->rebalancing;
      self->delayed_send(self, rb.period, migrate_atom::value);
      for (size_t idx = 0; idx < d->children.size(); ++idx) {
        auto& c = d->children[idx];
        if (!c.spec.spawn_at || !c.handle || c.migrate_to || c.checking)
          continue;
        if (c.moved_at && self->clock().now() - *c.moved_at < 2 * rb.period)
          continue;
        c.checking = true;
        auto handle = c.handle;
        self->request(rb.board, rb.timeout, get_atom::value, load_atom::value, handle)
          .then(
            [=](const std::vector<double>& throughput, const std::vector<int64_t>& peers,
                double mine) {
              auto& c = d->children[idx];
              c.checking = false;
              if (c.handle != handle || mine <= 0)
                return;
              auto r = reports_of(throughput, peers);
              if (!r || c.stage >= r->size())
                return;
              auto target = decide_migration(*r, migration_candidate{c.stage, mine},
                                             d->rebalancing.policy);
              if (!target)
                return;
              // Fast peers first: a slower one claims only with some probability this time.
              auto& own = (*r)[c.stage];
              auto average = own.peers > 0 ? own.throughput / static_cast<double>(own.peers) : 0;
              auto relative = average > 0 ? mine / average : 1.0;
              auto p = claim_probability(relative, d->rebalancing.policy);
              if (p < 1.0 && std::uniform_real_distribution<double>{0.0, 1.0}(d->rng) >= p)
                return;
              auto from = c.stage;
              auto to = *target;
              auto slots = moves_allowed(*r, from, to);
              self->request(d->rebalancing.board, d->rebalancing.timeout, migrate_atom::value,
                            from, d->rebalancing.period, slots)
                .then(
                  [=](bool granted) {
                    auto& c = d->children[idx];
                    if (!granted || c.handle != handle || c.migrate_to)
                      return;
                    c.migrate_to = to;
                    c.migrate_seen = throughput;
                    d->migrations++;
                    auto expected = throughput_in(*r, migration_candidate{from, mine}, to);
                    self->send(d->rebalancing.board, put_atom::value, load_atom::value, to,
                               expected, d->rebalancing.join_hold);
                    // The peer finishes its queue first (its requests would fail and be
                    // retried elsewhere); stopped anyway after `drain`.
                    if (d->rebalancing.drain > caf::timespan{0}) {
                      self->send(c.handle, migrate_atom::value);
                      self->delayed_send(self, d->rebalancing.drain, migrate_atom::value,
                                         static_cast<uint64_t>(idx));
                    } else {
                      self->send_exit(c.handle, caf::exit_reason::user_shutdown);
                    }
                  },
                  [](caf::error&) {});
            },
            [=](caf::error&) { d->children[idx].checking = false; });
      }
    },
    // A migrating child that did not finish draining in time is stopped.
    [=](migrate_atom, uint64_t idx) {
      if (idx < d->children.size() && d->children[idx].handle && d->children[idx].migrate_to)
        self->send_exit(d->children[idx].handle, caf::exit_reason::user_shutdown);
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
                            caf::actor observer, rebalancing_options rebalancing) {
  return sys.spawn(supervisor_actor, std::move(children), std::move(observer),
                   std::move(rebalancing));
}

} // namespace starling::actors::supervisor
