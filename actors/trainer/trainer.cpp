#include "actors/trainer/trainer.hpp"

#include <map>
#include <random>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/trainer/wiring.hpp"
#include "kernels/data/corpus.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::trainer {

namespace {

using messages::stage_backward;
using messages::stage_backward_reply;
using messages::stage_forward;
using messages::tensor_msg;

/// One microbatch in flight: what each stage got as input (for the recomputing backward).
struct microbatch {
  uint64_t id = 0;
  uint64_t seed = 0;
  std::vector<tensor_msg> inputs;
  tensor_msg targets;
  int64_t retries = 0;
  double loss = 0;
  caf::actor_clock::time_point started;
};

using mb_ptr = std::shared_ptr<microbatch>;

struct trainer_state {
  trainer_options opts;
  std::unique_ptr<wiring_policy> wiring;
  std::optional<kernels::text_sampler> sampler;
  std::shared_ptr<const kernels::corpus> data;
  std::mt19937_64 rng;
  std::vector<std::map<std::string, caf::actor>> peers;
  caf::actor_clock::time_point t0;
  int64_t started = 0;
  int64_t completed = 0;
  uint64_t next_id = 0;
  std::map<uint64_t, std::function<void()>> waiting;
  uint64_t next_ticket = 0;
  bool stopped = false;
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

void start_microbatch(self_ptr self, caf::actor sink);
void forward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage);
void backward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage, tensor_msg grad);

/// Picks a peer for a hop, or waits for one to appear; `go` gets the peer's name and handle.
void with_peer(self_ptr self, uint64_t stage, pass dir, double samples,
               std::function<void(std::string, caf::actor)> go) {
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
      go(usable[k].first, usable[k].second);
      return;
    }
    later(self, st.opts.refresh_every, [=] { with_peer(self, stage, dir, samples, go); });
    return;
  }
  for (;;) {
    auto pick = st.wiring->pick(stage, dir, samples, now_s(self));
    if (!pick)
      break;
    auto i = st.peers[stage].find(*pick);
    if (i != st.peers[stage].end()) {
      go(*pick, i->second);
      return;
    }
    st.wiring->remove_peer(stage, *pick);
  }
  // No usable peer now: try again after the next refresh.
  later(self, st.opts.refresh_every, [=] { with_peer(self, stage, dir, samples, go); });
}

void on_hop_error(self_ptr self, uint64_t stage, const std::string& peer, mb_ptr mb) {
  auto& st = self->state;
  mb->retries++;
  auto until = now_s(self) + std::chrono::duration<double>(st.opts.exclude_for).count();
  st.wiring->exclude(stage, peer, until);
}

void forward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage) {
  auto samples = static_cast<double>(self->state.opts.microbatch);
  with_peer(self, stage, pass::forward, samples, [=](std::string name, caf::actor peer) {
    auto t0 = self->clock().now();
    stage_forward req{mb->inputs[stage], mb->targets, mb->seed};
    self->request(peer, self->state.opts.hop_timeout, std::move(req))
      .then(
        [=](tensor_msg& out) {
          auto dt = std::chrono::duration<double>(self->clock().now() - t0).count();
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

void finish_microbatch(self_ptr self, caf::actor sink, mb_ptr mb) {
  auto& st = self->state;
  st.completed++;
  auto secs = std::chrono::duration<double>(self->clock().now() - mb->started).count();
  self->send(sink, report_atom::value, st.opts.name, mb->loss, st.opts.microbatch, mb->retries,
             secs);
  if (st.completed >= st.opts.microbatches) {
    if (!st.stopped) {
      st.stopped = true;
      self->send(sink, stop_atom::value, st.opts.name);
      self->quit();
    }
    return;
  }
  start_microbatch(self, sink);
}

void backward_hop(self_ptr self, caf::actor sink, mb_ptr mb, uint64_t stage, tensor_msg grad) {
  auto samples = static_cast<double>(self->state.opts.microbatch);
  with_peer(self, stage, pass::backward, samples, [=](std::string name, caf::actor peer) {
    auto t0 = self->clock().now();
    stage_backward req{mb->inputs[stage], grad, mb->targets, mb->seed};
    self->request(peer, self->state.opts.hop_timeout, std::move(req))
      .then(
        [=](stage_backward_reply& reply) {
          auto dt = std::chrono::duration<double>(self->clock().now() - t0).count();
          self->state.wiring->report_success(stage, name, pass::backward, samples, dt);
          if (!reply.grad_input.ok()) {
            on_hop_error(self, stage, name, mb);
            backward_hop(self, sink, mb, stage, grad);
            return;
          }
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
  if (st.started >= st.opts.microbatches)
    return;
  st.started++;
  auto batch = st.sampler->sample(st.rng);
  auto mb = std::make_shared<microbatch>();
  mb->id = st.next_id++;
  mb->seed = st.rng();
  mb->inputs.push_back(tensor_msg{batch.inputs, kernels::codec_id::none, {}, {}});
  mb->targets = tensor_msg{batch.targets, kernels::codec_id::none, {}, {}};
  mb->started = self->clock().now();
  forward_hop(self, sink, mb, 0);
}

void refresh(self_ptr self, caf::actor board) {
  for (uint64_t s = 0; s < self->state.opts.stages; ++s)
    self->request(board, self->state.opts.hop_timeout, get_atom::value, s)
      .then(
        [=](const std::vector<std::string>& names, const std::vector<caf::actor>& handles) {
          auto& m = self->state.peers[s];
          m.clear();
          for (size_t i = 0; i < names.size(); ++i)
            m[names[i]] = handles[i];
          self->state.wiring->refresh(s, names);
        },
        [](caf::error&) {});
}

caf::behavior trainer_actor(self_ptr self, trainer_options opts,
                            std::shared_ptr<const kernels::corpus> data, caf::actor board,
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
  auto sampler = kernels::text_sampler::make(*data, opts.shard, opts.shards, opts.microbatch,
                                             opts.seq_len);
  if (!sampler) {
    self->quit(caf::make_error(caf::sec::invalid_argument, sampler.error().what));
    return {};
  }
  st.sampler.emplace(std::move(*sampler));
  refresh(self, board);
  self->delayed_send(self, opts.refresh_every, tick_atom::value);
  // Start once the first refresh had a chance to land.
  later(self, caf::timespan{0}, [=] {
    for (int64_t i = 0; i < self->state.opts.max_inflight; ++i)
      start_microbatch(self, sink);
  });
  return {
    [=](tick_atom) {
      refresh(self, board);
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
                         std::shared_ptr<const kernels::corpus> data, caf::actor board,
                         caf::actor sink) {
  return sys.spawn(trainer_actor, std::move(opts), std::move(data), std::move(board),
                   std::move(sink));
}

} // namespace starling::actors::trainer
