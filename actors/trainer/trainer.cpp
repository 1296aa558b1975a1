#include "actors/trainer/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/collab/ledger_record.hpp"
#include "actors/trainer/wiring.hpp"
#include "kernels/data/batch_progress.hpp"
#include "kernels/data/data_source.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::trainer {

namespace {

using messages::stage_backward;
using messages::stage_backward_reply;
using messages::stage_forward;
using messages::tensor_msg;

/// One microbatch in flight: what each stage got as input (for the recomputing backward).
struct microbatch {
  /// Unique among the run's trainers (see `microbatch_id`): what stages key its gradients by.
  uint64_t id = 0;
  /// Its batch of the shard's stream.
  uint64_t batch = 0;
  uint64_t seed = 0;
  std::vector<tensor_msg> inputs;
  tensor_msg targets;
  int64_t retries = 0;
  /// Backward attempts so far, per stage (the next one's number).
  std::vector<uint32_t> attempts;
  double loss = 0;
  caf::actor_clock::time_point started;
};

using mb_ptr = std::shared_ptr<microbatch>;

struct trainer_state {
  trainer_options opts;
  std::unique_ptr<wiring_policy> wiring;
  std::optional<kernels::sample_loader> loader;
  std::shared_ptr<const kernels::data_source> data;
  /// Which batches are done (this life's and, restored from the store, the previous lives').
  kernels::batch_progress progress;
  /// Batches below it were started in this life (or were done before it).
  uint64_t cursor = 0;
  int64_t inflight = 0;
  std::mt19937_64 rng;
  std::vector<std::map<std::string, caf::actor>> peers;
  caf::actor_clock::time_point t0;
  std::map<uint64_t, std::function<void()>> waiting;
  uint64_t next_ticket = 0;
  bool stopped = false;
  /// Microbatches have started (the first refresh had its chance to land).
  bool running = false;
  /// Admission at the entry (`entry_backlog_s`): one first forward probes at a time, so that
  /// each sees the queues the ones before it joined; the others wait here in order.
  bool entry_probing = false;
  std::deque<std::function<void()>> entry_waiting;
};

using self_ptr = caf::stateful_actor<trainer_state>*;

double now_s(self_ptr self) {
  return std::chrono::duration<double>(self->clock().now() - self->state.t0).count();
}

/// Runs `f` after `d` (used when a stage has no live peer yet).
void later(self_ptr self, caf::timespan d, std::function<void()> f) {
  auto t = self->state.next_ticket++;
  self->state.waiting.emplace(t, std::move(f));
  self->delayed_send(self, d, tick_atom::value, t);
}

/// A microbatch id unique among trainers: the top 24 bits the trainer's tag (`opts.tag`, distinct
/// among the run's trainers, or its name's `collab::trainer_tag`: the ledger credits the trainer
/// by it), the low 40 bits its batch number. Stages keep a gradient per (id, attempt) until it
/// is confirmed.
uint64_t microbatch_id(const trainer_options& opts, uint64_t batch) {
  constexpr uint64_t low = (uint64_t{1} << 40) - 1;
  auto tag = opts.tag >= 0 ? static_cast<uint64_t>(opts.tag) & ((uint64_t{1} << 24) - 1)
                           : collab::trainer_tag(opts.name);
  return (tag << 40) | (batch & low);
}

void start_microbatch(self_ptr self, caf::actor sink);
void top_up(self_ptr self, caf::actor sink);
void forward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage);
void backward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage, tensor_msg grad);

/// Answers of one hop's probes: each candidate's queued seconds (infinite when unanswered).
struct probe_round {
  std::vector<std::string> names;
  std::vector<double> backlog;
  size_t answered = 0;
};

void with_peer(self_ptr self, uint64_t stage, pass dir, double samples,
               std::function<void(std::string, caf::actor, double)> go);

/// Power of two choices: two candidates from the wiring, both reserved (charged) while their
/// probes travel so that concurrent hops spread out; the one that would finish the hop first
/// (queued seconds plus this hop's expected seconds) keeps its charge, the other is refunded.
/// With `hold` > 0 the hop instead waits at the trainer (and probes again after the excess,
/// 1-10 s) while the better candidate has more than `hold` seconds queued.
void probe_and_go(self_ptr self, uint64_t stage, pass dir, double samples,
                  std::function<void(std::string, caf::actor, double)> go, double hold = 0,
                  std::function<void()> decided = {}) {
  auto& st = self->state;
  auto done = [decided] {
    if (decided)
      decided();
  };
  std::vector<std::string> names;
  for (;;) {
    names = st.wiring->sample(stage, now_s(self), 2);
    auto missing = std::find_if(names.begin(), names.end(), [&](const std::string& n) {
      return st.peers[stage].count(n) == 0;
    });
    if (missing == names.end())
      break;
    st.wiring->remove_peer(stage, *missing);
  }
  if (names.empty()) {
    done();
    later(self, st.opts.refresh_every, [=] { with_peer(self, stage, dir, samples, go); });
    return;
  }
  for (auto& n : names)
    st.wiring->charge(stage, n, dir, samples);
  if (names.size() == 1) {
    done();
    go(names[0], st.peers[stage].at(names[0]), 0.0);
    return;
  }
  auto round = std::make_shared<probe_round>();
  round->names = names;
  round->backlog.assign(names.size(), std::numeric_limits<double>::infinity());
  auto decide = [=] {
    auto& st = self->state;
    size_t best = 0;
    double best_t = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < round->names.size(); ++i) {
      auto rate = st.wiring->throughput(stage, round->names[i], dir);
      auto t = round->backlog[i] + (rate && *rate > 0 ? samples / *rate : 0.0);
      if (t < best_t) {
        best_t = t;
        best = i;
      }
    }
    for (size_t i = 0; i < round->names.size(); ++i)
      if (i != best)
        st.wiring->refund(stage, round->names[i], dir, samples);
    auto& chosen = round->names[best];
    auto h = st.peers[stage].find(chosen);
    done();
    if (h == st.peers[stage].end()) {
      st.wiring->refund(stage, chosen, dir, samples);
      with_peer(self, stage, dir, samples, go); // it left while we probed
      return;
    }
    auto ahead = round->backlog[best];
    if (hold > 0 && std::isfinite(ahead) && ahead > hold) {
      // Admission (at the pipeline's entry, or of a later forward): the microbatch waits here,
      // not in that queue.
      st.wiring->refund(stage, chosen, dir, samples);
      auto wait = std::clamp(ahead - hold, 1.0, 10.0);
      later(self, std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(wait)),
            [=] { with_peer(self, stage, dir, samples, go); });
      return;
    }
    go(chosen, h->second, std::isfinite(ahead) ? ahead : 0.0);
  };
  for (size_t i = 0; i < names.size(); ++i) {
    auto answered = [=](double backlog) {
      if (backlog >= 0)
        round->backlog[i] = backlog;
      if (++round->answered == round->names.size())
        decide();
    };
    self->request(st.peers[stage].at(names[i]), st.opts.probe_timeout, probe_atom::value)
      .then([=](double backlog) { answered(backlog); },
            [=](caf::error&) { answered(-1.0); });
  }
}

/// Picks a peer for a hop, or waits for one to appear; `go` gets the peer's name and handle.
void with_peer(self_ptr self, uint64_t stage, pass dir, double samples,
               std::function<void(std::string, caf::actor, double)> go) {
  auto& st = self->state;
  if (st.opts.routing != routing_kind::stochastic) {
    // Baselines: a uniformly random live peer, or the fixed pipeline's peer.
    auto now = now_s(self);
    std::vector<std::pair<std::string, caf::actor>> usable;
    for (auto& [name, handle] : st.peers[stage]) {
      if (st.wiring->excluded(stage, name, now))
        continue;
      if (st.opts.routing == routing_kind::fixed
          && (stage >= st.opts.fixed_route.size()
              || name.compare(0, st.opts.fixed_route[stage].size(), st.opts.fixed_route[stage])
                   != 0))
        continue;
      usable.emplace_back(name, handle);
    }
    if (!usable.empty()) {
      auto k = usable.size() == 1
                 ? size_t{0}
                 : std::uniform_int_distribution<size_t>{0, usable.size() - 1}(st.rng);
      go(usable[k].first, usable[k].second, 0.0);
      return;
    }
    later(self, st.opts.refresh_every, [=] { with_peer(self, stage, dir, samples, go); });
    return;
  }
  if (st.opts.probe && stage == 0 && dir == pass::forward && st.opts.entry_backlog_s > 0) {
    if (st.entry_probing) {
      st.entry_waiting.emplace_back([=] { with_peer(self, stage, dir, samples, go); });
      return;
    }
    st.entry_probing = true;
    probe_and_go(self, stage, dir, samples, std::move(go), st.opts.entry_backlog_s, [self] {
      auto& st = self->state;
      st.entry_probing = false;
      if (!st.entry_waiting.empty()) {
        auto next = std::move(st.entry_waiting.front());
        st.entry_waiting.pop_front();
        later(self, caf::timespan{0}, std::move(next));
      }
    });
    return;
  }
  if (st.opts.probe) {
    auto hold = dir == pass::forward && stage > 0 ? st.opts.forward_backlog_s : 0.0;
    probe_and_go(self, stage, dir, samples, std::move(go), hold);
    return;
  }
  for (;;) {
    auto pick = st.wiring->pick(stage, dir, samples, now_s(self));
    if (!pick)
      break;
    auto i = st.peers[stage].find(*pick);
    if (i != st.peers[stage].end()) {
      go(*pick, i->second, 0.0);
      return;
    }
    st.wiring->remove_peer(stage, *pick);
  }
  // No usable peer now: try again after the next refresh.
  later(self, st.opts.refresh_every, [=] { with_peer(self, stage, dir, samples, go); });
}

/// A hop's deadline: the configured timeout past the work the peer said was queued ahead (a
/// long queue is not a failure; timing it out would send the work twice while the peer still
/// computes the first copy, and queues would grow further: congestion collapse).
caf::timespan hop_timeout(self_ptr self, double ahead) {
  return self->state.opts.hop_timeout
         + std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(ahead));
}

/// The peer's own compute time for a hop that took `elapsed` behind `ahead` seconds of queued
/// work: the wiring estimates a peer's speed, not its queue (the probes see the queue).
double service_seconds(caf::timespan elapsed, double ahead) {
  auto dt = std::chrono::duration<double>(elapsed).count();
  return std::max(dt - ahead, 0.1 * dt);
}

void on_hop_error(self_ptr self, uint64_t stage, const std::string& peer, mb_ptr mb) {
  auto& st = self->state;
  mb->retries++;
  auto until = now_s(self) + std::chrono::duration<double>(st.opts.exclude_for).count();
  st.wiring->exclude(stage, peer, until);
}

void forward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage) {
  auto samples = static_cast<double>(self->state.opts.microbatch);
  with_peer(self, stage, pass::forward, samples,
            [=](std::string name, caf::actor peer, double ahead) {
    auto t0 = self->clock().now();
    stage_forward req{mb->inputs[stage], mb->targets, mb->seed};
    self->request(peer, hop_timeout(self, ahead), std::move(req))
      .then(
        [=](tensor_msg& out) {
          auto dt = service_seconds(self->clock().now() - t0, ahead);
          self->state.wiring->report_success(stage, name, pass::forward, samples, dt);
          if (!out.ok()) {
            on_hop_error(self, stage, name, mb);
            forward_hop(self, sink, mb, stage);
            return;
          }
          if (stage + 1 < self->state.opts.stages) {
            out.codec = self->state.opts.codec;
            mb->inputs.push_back(std::move(out));
            forward_hop(self, sink, mb, stage + 1);
          } else {
            mb->loss = out.tensor.item<double>();
            backward_hop(self, sink, mb, stage, tensor_msg{});
          }
        },
        [=](caf::error&) {
          on_hop_error(self, stage, name, mb);
          forward_hop(self, sink, mb, stage);
        });
  });
}

/// Sends `(stop_atom, name)` once and quits.
void stop(self_ptr self, caf::actor sink) {
  auto& st = self->state;
  if (st.stopped)
    return;
  st.stopped = true;
  self->send(sink, stop_atom::value, st.opts.name);
  self->quit();
}

void finish_microbatch(self_ptr self, caf::actor sink, mb_ptr mb) {
  auto& st = self->state;
  st.inflight--;
  // A batch is started once per life and never after the store said it was done: no repeats.
  if (auto fresh = st.progress.mark_done(mb->batch); !fresh || !*fresh)
    return;
  auto secs = std::chrono::duration<double>(self->clock().now() - mb->started).count();
  self->send(sink, report_atom::value, st.opts.name, mb->loss, st.opts.microbatch, mb->retries,
             secs, mb->batch);
  if (st.opts.progress)
    self->send(st.opts.progress, put_atom::value, st.opts.name, st.progress.total(), mb->batch);
  if (st.progress.complete()) {
    stop(self, sink);
    return;
  }
  top_up(self, sink);
}

void backward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage, tensor_msg grad) {
  auto samples = static_cast<double>(self->state.opts.microbatch);
  with_peer(self, stage, pass::backward, samples,
            [=](std::string name, caf::actor peer, double ahead) {
    auto t0 = self->clock().now();
    auto attempt = mb->attempts[stage]++;
    stage_backward req{mb->inputs[stage], grad, mb->targets, mb->seed, {}, mb->id, attempt};
    self->request(peer, hop_timeout(self, ahead), std::move(req))
      .then(
        [=](stage_backward_reply& reply) {
          auto dt = service_seconds(self->clock().now() - t0, ahead);
          self->state.wiring->report_success(stage, name, pass::backward, samples, dt);
          if (!reply.grad_input.ok()) {
            on_hop_error(self, stage, name, mb);
            backward_hop(self, sink, mb, stage, grad);
            return;
          }
          // This attempt's gradient is the one that counts: the peer applies it now. An attempt
          // that timed out is never confirmed (its peer drops it), so a retried backward enters
          // the stage's optimizer once.
          self->send(peer, messages::commit_atom::value, mb->id, attempt);
          if (stage == 0) {
            finish_microbatch(self, sink, mb);
            return;
          }
          reply.grad_input.codec = self->state.opts.codec;
          backward_hop(self, sink, mb, stage - 1, std::move(reply.grad_input));
        },
        [=](caf::error&) {
          on_hop_error(self, stage, name, mb);
          backward_hop(self, sink, mb, stage, grad);
        });
  });
}

void start_microbatch(self_ptr self, caf::actor sink) {
  auto& st = self->state;
  auto b = st.progress.next_undone(st.cursor);
  if (b >= st.progress.total())
    return;
  st.cursor = b + 1;
  auto ids = st.loader->batch_at_step(b, static_cast<uint64_t>(st.opts.microbatch));
  auto batch = ids ? st.data->batch(*ids) : result<kernels::sample_batch>{ids.error()};
  if (!batch) {
    st.stopped = true;
    self->quit(caf::make_error(caf::sec::runtime_error,
                               fmt::format("{}: batch {}: {}", st.opts.name, b,
                                           batch.error().what)));
    return;
  }
  st.inflight++;
  auto mb = std::make_shared<microbatch>();
  mb->id = microbatch_id(st.opts, b);
  mb->batch = b;
  mb->attempts.assign(st.opts.stages, 0);
  mb->seed = st.rng();
  mb->inputs.push_back(tensor_msg{batch->inputs, kernels::codec_id::none, {}, {}});
  mb->targets = tensor_msg{batch->targets, kernels::codec_id::none, {}, {}};
  mb->started = self->clock().now();
  forward_hop(self, sink, mb, 0);
}

/// The window now: fixed, or following the live peers this trainer sees.
int64_t window(self_ptr self) {
  auto& o = self->state.opts;
  return inflight_target(self->state.wiring->peer_count(), o.trainers, o.inflight_per_peer,
                         o.inflight_cap, o.max_inflight);
}

/// Starts microbatches until the window is full (a shrinking window drains as they complete).
void top_up(self_ptr self, caf::actor sink) {
  auto& st = self->state;
  auto target = window(self);
  while (!st.stopped && st.inflight < target
         && st.progress.next_undone(st.cursor) < st.progress.total())
    start_microbatch(self, sink);
}

void refresh(self_ptr self, caf::actor board, caf::actor sink) {
  for (uint64_t s = 0; s < self->state.opts.stages; ++s)
    self->request(board, self->state.opts.hop_timeout, get_atom::value, s)
      .then(
        [=](const std::vector<std::string>& names, const std::vector<caf::actor>& handles) {
          auto& m = self->state.peers[s];
          m.clear();
          for (size_t i = 0; i < names.size(); ++i)
            m[names[i]] = handles[i];
          self->state.wiring->refresh(s, names);
          if (self->state.running)
            top_up(self, sink);
        },
        [](caf::error&) {});
}

/// Starts training once the saved progress (if any) is in: microbatches start after the first
/// peer-list refresh had its chance to land.
void begin(self_ptr self, caf::actor sink) {
  later(self, caf::timespan{0}, [=] {
    self->state.running = true;
    if (self->state.progress.complete())
      stop(self, sink);
    else
      top_up(self, sink);
  });
}

caf::behavior trainer_actor(self_ptr self, trainer_options opts,
                            std::shared_ptr<const kernels::data_source> data, caf::actor board,
                            caf::actor sink) {
  auto& st = self->state;
  st.opts = opts;
  st.data = data;
  st.rng.seed(opts.seed);
  wiring_options wo;
  wo.seed = opts.seed * 2654435761ULL + 1; // trainers break ties between new peers differently
  st.wiring = std::make_unique<wiring_policy>(opts.stages, wo);
  st.peers.resize(opts.stages);
  st.t0 = self->clock().now();
  auto fail = [self](std::string why) {
    self->quit(caf::make_error(caf::sec::invalid_argument, std::move(why)));
    return caf::behavior{};
  };
  if (!data)
    return fail(opts.name + ": no data source");
  if (opts.microbatch < 1 || opts.microbatches < 0)
    return fail(fmt::format("{}: microbatch must be at least 1 and microbatches at least 0 (got "
                            "{} and {})",
                            opts.name, opts.microbatch, opts.microbatches));
  auto loader = kernels::sample_loader::make(data->size(), opts.data);
  if (!loader)
    return fail(fmt::format("{}: {} ({})", opts.name, loader.error().what, data->describe()));
  st.loader.emplace(std::move(*loader));
  st.progress = kernels::batch_progress{static_cast<uint64_t>(opts.microbatches)};
  refresh(self, board, sink);
  self->delayed_send(self, opts.refresh_every, tick_atom::value);
  if (!opts.progress) {
    begin(self, sink);
  } else {
    // A restarted trainer takes up where its previous life left off.
    self->request(opts.progress, opts.hop_timeout, get_atom::value, opts.name)
      .then(
        [=](const std::string& saved) {
          if (!saved.empty()) {
            auto p = kernels::batch_progress::parse(saved);
            if (!p) {
              self->quit(caf::make_error(caf::sec::invalid_argument,
                                         fmt::format("{}: saved progress: {}",
                                                     self->state.opts.name, p.error().what)));
              return;
            }
            self->state.progress = p->resized(self->state.progress.total());
          }
          begin(self, sink);
        },
        [=](caf::error&) { begin(self, sink); });
  }
  return {
    [=](tick_atom) {
      refresh(self, board, sink);
      self->delayed_send(self, self->state.opts.refresh_every, tick_atom::value);
    },
    [=](tick_atom, uint64_t ticket) {
      auto i = self->state.waiting.find(ticket);
      if (i == self->state.waiting.end())
        return;
      auto f = std::move(i->second);
      self->state.waiting.erase(i);
      f();
    },
  };
}

} // namespace

caf::actor spawn_trainer(caf::actor_system& sys, trainer_options opts,
                         std::shared_ptr<const kernels::data_source> data, caf::actor board,
                         caf::actor sink) {
  return sys.spawn(trainer_actor, std::move(opts), std::move(data), std::move(board),
                   std::move(sink));
}

} // namespace starling::actors::trainer
