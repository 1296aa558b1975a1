// A stage peer with modeled compute (simulation mode): the same protocol as the real stage peer
// (stage.cpp) without the model. Each request occupies the peer for work / speed virtual seconds
// behind the requests before it; replies carry placeholder tensors.
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/stage/fetch_state.hpp"
#include "actors/stage/load_report.hpp"
#include "actors/stage/load_view.hpp"
#include "actors/stage/state_parts.hpp"
#include "actors/stage/stage.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::stage {

namespace {

using messages::stage_backward;
using messages::stage_backward_reply;
using messages::stage_forward;
using messages::stage_state;
using messages::tensor_msg;

/// The loss the last stage answers (ln 256: a uniform byte model).
constexpr double placeholder_loss = 5.545177444479562;

struct modeled_peer {
  stage_options opts;
  caf::actor board;
  std::mt19937_64 rng;
  bool ready = false;
  bool last = false;
  /// When the device is free again (requests queue behind each other).
  caf::actor_clock::time_point busy_until;
  /// Requests accepted and not yet answered.
  int64_t queued = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  int64_t pending_samples = 0;
  /// Busy seconds and training samples served, for the throughput reports.
  throughput_meter meter;
  /// Replies waiting for their compute to finish, by ticket.
  std::map<uint64_t, std::function<void()>> held;
  uint64_t next_ticket = 0;
  /// How to fail each held reply when the peer dies (a preempted machine's connections break,
  /// so its callers learn at once instead of at their timeout).
  std::shared_ptr<std::map<uint64_t, std::function<void(const caf::error&)>>> on_death =
    std::make_shared<std::map<uint64_t, std::function<void(const caf::error&)>>>();
};

using self_ptr = caf::stateful_actor<modeled_peer>*;

caf::timespan to_span(double seconds) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(seconds));
}

/// Runs `f` after `delay` (a held reply); `fail` answers the caller if the peer dies first.
void hold(self_ptr self, caf::timespan delay, std::function<void()> f,
          std::function<void(const caf::error&)> fail) {
  auto& st = self->state;
  auto ticket = st.next_ticket++;
  auto deaths = st.on_death;
  deaths->emplace(ticket, std::move(fail));
  st.held.emplace(ticket, [deaths, ticket, f = std::move(f)] {
    deaths->erase(ticket);
    f();
  });
  self->delayed_send(self, delay, tick_atom::value, ticket);
}

/// Queues `work` seconds of compute (speed 1, before noise); `deliver` runs when it is done.
void compute(self_ptr self, double work, std::function<void()> deliver,
             std::function<void(const caf::error&)> fail) {
  auto& st = self->state;
  auto& m = st.opts.modeled;
  double factor = 1.0;
  if (m.noise > 0) {
    std::normal_distribution<double> z{0.0, 1.0};
    factor = std::exp(m.noise * z(st.rng) - 0.5 * m.noise * m.noise); // mean 1
  }
  auto seconds = work * factor / st.opts.speed;
  auto now = self->clock().now();
  auto start = std::max(now, st.busy_until);
  st.busy_until = start + to_span(seconds);
  st.queued++;
  // Throughput = training-sample equivalents of the work done per busy second, counted when a
  // request completes (a forward of b samples is b / (1 + backward_factor) of a training sample).
  auto bf = m.backward_factor;
  auto equivalents = work / (m.forward_s * (1.0 + bf));
  hold(
    self, st.busy_until - now,
    [self, seconds, equivalents, deliver = std::move(deliver)] {
      auto& s = self->state;
      s.queued--;
      s.meter.add(seconds, equivalents);
      deliver();
    },
    std::move(fail));
}

/// Answers `value` after `delay` of virtual time (the modeled cost of sending it), at once when
/// the delay is not positive.
template <class T>
caf::result<T> reply_after(self_ptr self, caf::timespan delay, T value) {
  if (delay <= caf::timespan{0})
    return value;
  auto rp = self->make_response_promise<T>();
  hold(
    self, delay, [rp, v = std::move(value)]() mutable { rp.deliver(std::move(v)); },
    [rp](const caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

caf::error still_starting() {
  return caf::make_error(caf::sec::runtime_error, "stage peer is still starting");
}

int64_t batch_of(const tensor_msg& t) {
  return t.tensor.defined() && t.tensor.dim() > 0 ? std::max<int64_t>(1, t.tensor.size(0)) : 1;
}

tensor_msg placeholder(int64_t batch, int64_t payload) {
  return tensor_msg{torch::zeros({batch, std::max<int64_t>(1, payload)}),
                    kernels::codec_id::none, {}, {}};
}

caf::behavior modeled_stage(self_ptr self, stage_options opts, caf::actor board) {
  auto& st = self->state;
  st.opts = opts;
  st.board = board;
  st.rng.seed(opts.seed);
  st.last = opts.end >= opts.model.layers;
  st.busy_until = self->clock().now();
  if (!(opts.speed > 0) || !(opts.modeled.forward_s > 0) || !(opts.modeled.backward_factor > 0)
      || opts.modeled.noise < 0) {
    self->quit(caf::make_error(caf::sec::invalid_argument,
                               "modeled compute needs positive speed, forward_s and "
                               "backward_factor and a non-negative noise"));
    return {};
  }
  auto announce = [=] {
    self->state.ready = true;
    self->send(self->state.board, put_atom::value, self->state.opts.stage, self->state.opts.name,
               caf::actor_cast<caf::actor>(self));
  };
  // State download as in the real peer; a (re)joining peer retries until a donor answers or the
  // stage stays empty for `download_patience`.
  auto download = std::make_shared<std::function<void()>>(make_join_download(
    self, board, opts.stage,
    {opts.download_state, opts.timeout, opts.retry_every, opts.download_patience},
    [=](const stage_state& s, size_t) {
      self->state.steps = s.steps;
      return true;
    },
    announce));
  if (opts.download_state)
    (*download)();
  else
    announce(); // the initial generation starts from the (modeled) seeded initialization
  // Held replies fail when the peer dies (its callers retry elsewhere at once).
  auto deaths = st.on_death;
  self->attach_functor([deaths] {
    auto err = caf::make_error(caf::sec::request_receiver_down, "stage peer died");
    auto pending = std::move(*deaths);
    deaths->clear();
    for (auto& kv : pending)
      kv.second(err);
  });
  if (opts.report_every > caf::timespan{0})
    self->delayed_send(self, opts.report_every, load_atom::value);
  return {
    [=](const stage_forward& req) -> caf::result<tensor_msg> {
      auto& s = self->state;
      if (!req.input.ok())
        return caf::make_error(caf::sec::invalid_argument, "bad input: " + req.input.error);
      auto batch = batch_of(req.input);
      auto rp = self->make_response_promise<tensor_msg>();
      auto last = s.last;
      auto payload = s.opts.modeled.payload;
      compute(self, s.opts.modeled.forward_s * static_cast<double>(batch),
              [rp, batch, last, payload]() mutable {
                if (last)
                  rp.deliver(tensor_msg{torch::full({}, placeholder_loss),
                                        kernels::codec_id::none, {}, {}});
                else
                  rp.deliver(placeholder(batch, payload));
              },
              [rp](const caf::error& e) mutable { rp.deliver(e); });
      return rp;
    },
    [=](const stage_backward& req) -> caf::result<stage_backward_reply> {
      auto& s = self->state;
      if (!req.input.ok() || !req.grad_output.ok())
        return caf::make_error(caf::sec::invalid_argument, "bad input or gradient");
      auto batch = batch_of(req.input);
      auto rp = self->make_response_promise<stage_backward_reply>();
      auto first = s.opts.begin == 0;
      auto last = s.last;
      auto payload = s.opts.modeled.payload;
      compute(self,
              s.opts.modeled.forward_s * s.opts.modeled.backward_factor
                * static_cast<double>(batch),
              [self, rp, batch, first, last, payload]() mutable {
                auto& s = self->state;
                s.samples += static_cast<uint64_t>(batch);
                s.pending_samples += batch;
                if (s.pending_samples >= s.opts.local_batch) {
                  s.pending_samples = 0;
                  s.steps++;
                }
                stage_backward_reply reply;
                if (!first)
                  reply.grad_input = placeholder(batch, payload);
                if (last)
                  reply.loss = placeholder_loss;
                rp.deliver(std::move(reply));
              },
              [rp](const caf::error& e) mutable { rp.deliver(e); });
      return rp;
    },
    [=](get_atom, state_atom) -> caf::result<stage_state> {
      auto& s = self->state;
      if (!s.ready)
        return still_starting();
      stage_state out;
      out.steps = s.steps;
      out.samples = s.samples;
      return reply_after(self, s.opts.modeled.state_transfer, std::move(out));
    },
    // One part of the (modeled, empty) state: its transfer takes its share of the whole's time.
    [=](get_atom, state_atom, uint64_t part,
        uint64_t parts) -> caf::result<messages::stage_state_part> {
      auto& s = self->state;
      if (!s.ready)
        return still_starting();
      stage_state whole;
      whole.steps = s.steps;
      whole.samples = s.samples;
      auto cut = cut_state_part(whole, state_digest(whole), part, parts);
      if (!cut.ok())
        return caf::make_error(caf::sec::invalid_argument, cut.error().what);
      return reply_after(self, s.opts.modeled.state_transfer / static_cast<int64_t>(parts),
                         std::move(*cut));
    },
    [=](state_atom) {
      if (!self->state.ready)
        (*download)();
    },
    /// Throughput report: training samples per busy second over the last period.
    [=](load_atom) { report_load(self, static_cast<double>(self->state.queued)); },
    /// A trainer's probe: seconds of compute queued ahead of a request arriving now.
    [=](probe_atom) -> double {
      auto ahead = self->state.busy_until - self->clock().now();
      return std::max(0.0, std::chrono::duration<double>(ahead).count());
    },
    /// `(status_atom) -> [steps, samples, queued]`.
    [=](status_atom) -> std::vector<uint64_t> {
      auto& s = self->state;
      return {s.steps, s.samples, static_cast<uint64_t>(s.queued)};
    },
    [=](tick_atom, uint64_t ticket) {
      auto i = self->state.held.find(ticket);
      if (i == self->state.held.end())
        return;
      auto deliver = std::move(i->second);
      self->state.held.erase(i);
      deliver();
    },
  };
}

} // namespace

caf::actor spawn_modeled_stage(caf::actor_system& sys, stage_options opts, caf::actor board) {
  return sys.spawn(modeled_stage, std::move(opts), std::move(board));
}

} // namespace starling::actors::stage
