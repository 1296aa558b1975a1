#include "actors/stage/replica_keeper.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/collab/state_download.hpp"
#include "actors/stage/checkpoint.hpp"
#include "actors/stage/state_parts.hpp"
#include "kernels/stable_hash.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"
#include "messages/metrics.hpp"

namespace starling::actors::stage {

namespace {

/// Serves one stage's replica with the stage peers' state protocol; `(put_atom, state)` from
/// the keeper replaces it.
caf::behavior replica_server(caf::event_based_actor*, messages::stage_state initial) {
  auto held = std::make_shared<messages::stage_state>(std::move(initial));
  auto digest = std::make_shared<std::string>(state_digest(*held));
  return {
    [=](get_atom, state_atom) { return *held; },
    [=](get_atom, state_atom, uint64_t part,
        uint64_t parts) -> caf::result<messages::stage_state_part> {
      auto cut = cut_state_part(*held, *digest, part, parts);
      if (!cut.ok())
        return caf::make_error(caf::sec::invalid_argument, cut.error().what);
      return std::move(*cut);
    },
    [=](put_atom, const messages::stage_state& s) {
      *held = s;
      *digest = state_digest(s);
    },
  };
}

struct keeper_data {
  replica_keeper_options opts;
  /// Per stage: the replica held (its step) and its server.
  std::map<uint64_t, uint64_t> steps;
  std::map<uint64_t, caf::actor> servers;
  /// Stages with a pull in flight.
  std::set<uint64_t> pulling;
  uint64_t written = 0;
  uint64_t bytes = 0;
};

using keeper_ptr = std::shared_ptr<keeper_data>;

checkpoint_key key_of(const keeper_data& d, uint64_t stage) {
  return {stage, d.opts.ranges[stage].first, d.opts.ranges[stage].second};
}

/// Serves `s` as stage `stage`'s replica (spawning and announcing its server the first time).
void serve(caf::event_based_actor* self, const keeper_ptr& d, uint64_t stage,
           const messages::stage_state& s) {
  d->steps[stage] = s.steps;
  if (auto i = d->servers.find(stage); i != d->servers.end()) {
    self->send(i->second, put_atom::value, s);
    return;
  }
  auto server = self->spawn<caf::linked>(replica_server, s);
  d->servers[stage] = server;
  auto name = replica_server_name(stage);
  if (d->opts.register_actor)
    d->opts.register_actor(name, server);
  self->send(d->opts.replica_board, put_atom::value, stage, name, server);
}

/// Pulls stage `stage`'s state from `peer` when it is ahead of the replica, and keeps it.
void pull(caf::event_based_actor* self, const keeper_ptr& d, uint64_t stage, caf::actor peer) {
  if (d->pulling.count(stage))
    return;
  d->pulling.insert(stage);
  auto done = [=] { d->pulling.erase(stage); };
  self->request(peer, d->opts.timeout, status_atom::value)
    .then(
      [=](const std::vector<uint64_t>& counters) {
        auto held = d->steps.find(stage);
        if (counters.empty() || (held != d->steps.end() && counters[0] <= held->second)) {
          done();
          return;
        }
        collab::download_options o;
        o.timeout = d->opts.timeout;
        o.min_steps = held == d->steps.end() ? 0 : held->second + 1;
        collab::fetch_state(
          self, collab::donor_source::of({peer}), o,
          [=](collab::downloaded_state got) {
            auto& s = got.state;
            done();
            auto h = d->steps.find(stage);
            if (h != d->steps.end() && s.steps <= h->second)
              return;
            auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         self->clock().now().time_since_epoch())
                         .count();
            auto key = key_of(*d, stage);
            auto w = write_checkpoint(d->opts.dir, key, "replica", static_cast<uint64_t>(now), s);
            if (!w) {
              caf::aout(self) << "replica of stage " << stage << " not kept: "
                              << w.error().what << "\n";
              return;
            }
            prune_checkpoints(d->opts.dir, key, "replica", 1);
            d->written++;
            d->bytes += w->bytes;
            if (d->opts.metrics)
              self->send(d->opts.metrics,
                         messages::metric_event{replica_keeper_name,
                                                "replica",
                                                {{"stage", static_cast<double>(stage)},
                                                 {"steps", static_cast<double>(s.steps)},
                                                 {"bytes", static_cast<double>(w->bytes)},
                                                 {"seconds", w->seconds}},
                                                {},
                                                -1,
                                                {}});
            serve(self, d, stage, s);
          },
          [=](const std::string&) { done(); });
      },
      [=](caf::error&) { done(); });
}

/// One look at every stage: the keepers, each stage's peers, and the pulls this keeper owes.
void look(caf::event_based_actor* self, const keeper_ptr& d) {
  auto stages = static_cast<uint64_t>(d->opts.ranges.size());
  auto me = d->opts.endpoint + "/" + replica_keeper_name;
  self->request(d->opts.replica_board, d->opts.timeout, get_atom::value, stages)
    .then(
      [=](const std::vector<std::string>& keepers, const std::vector<caf::actor>&) {
        for (uint64_t k = 0; k < stages; ++k)
          self->request(d->opts.board, d->opts.timeout, get_atom::value, k)
            .then(
              [=](const std::vector<std::string>& names, const std::vector<caf::actor>& peers) {
                if (peers.empty())
                  return; // nothing to copy: keep serving what is held
                auto chosen = replica_keepers_of(k, keepers, names, d->opts.copies);
                if (std::find(chosen.begin(), chosen.end(), me) != chosen.end())
                  pull(self, d, k, peers.front());
              },
              [](caf::error&) {});
      },
      [](caf::error&) {});
}

} // namespace

std::string replica_server_name(uint64_t stage) {
  return fmt::format("replica-s{}", stage);
}

std::string endpoint_of(const std::string& address) {
  auto slash = address.rfind('/');
  return slash == std::string::npos ? address : address.substr(0, slash);
}

std::vector<std::string> replica_keepers_of(uint64_t stage, const std::vector<std::string>& keepers,
                                            const std::vector<std::string>& peer_addresses,
                                            size_t copies) {
  std::set<std::string> serving;
  for (auto& a : peer_addresses)
    serving.insert(endpoint_of(a));
  std::vector<std::pair<uint64_t, std::string>> ranked;
  std::set<std::string> seen;
  for (auto& k : keepers)
    if (!serving.count(endpoint_of(k)) && seen.insert(k).second)
      ranked.emplace_back(kernels::stable_hash(fmt::format("{}|{}", stage, k)), k);
  // The same ranking on every node and in every build.
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < ranked.size() && i < copies; ++i)
    out.push_back(ranked[i].second);
  return out;
}

caf::behavior replica_keeper_actor(caf::event_based_actor* self, replica_keeper_options opts) {
  auto d = std::make_shared<keeper_data>();
  d->opts = std::move(opts);
  auto stages = static_cast<uint64_t>(d->opts.ranges.size());
  auto handle = caf::actor_cast<caf::actor>(self);
  if (d->opts.register_actor)
    d->opts.register_actor(replica_keeper_name, handle);
  self->send(d->opts.replica_board, put_atom::value, stages, std::string{replica_keeper_name},
             handle);
  // A restarted node serves the replicas its folder holds.
  for (uint64_t k = 0; k < stages; ++k) {
    auto found = newest_checkpoint({d->opts.dir}, key_of(*d, k));
    for (auto& why : found.rejected)
      caf::aout(self) << "replica rejected: " << why << "\n";
    if (found.found)
      serve(self, d, k, found.found->state);
  }
  self->send(self, tick_atom::value);
  return {
    [=](tick_atom) {
      self->delayed_send(self, d->opts.period, tick_atom::value);
      look(self, d);
    },
    [=](status_atom) {
      return std::vector<uint64_t>{d->written, d->bytes, static_cast<uint64_t>(d->steps.size())};
    },
  };
}

caf::actor spawn_replica_keeper(caf::actor_system& sys, replica_keeper_options opts) {
  return sys.spawn(replica_keeper_actor, std::move(opts));
}

} // namespace starling::actors::stage
