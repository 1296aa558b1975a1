#include "actors/stage/stage.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/dht/client.hpp"
#include "actors/stage/fetch_state.hpp"
#include "actors/stage/load_report.hpp"
#include "actors/stage/load_view.hpp"
#include "actors/stage/state_parts.hpp"
#include "kernels/flat.hpp"
#include "kernels/models/stage_module.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "messages/averager.hpp"
#include "messages/dht.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::stage {

namespace {

using messages::stage_backward;
using messages::stage_backward_reply;
using messages::stage_forward;
using messages::stage_state;
using messages::tensor_msg;

/// Counters of collaborative stepping (reported by `(status_atom)`).
struct averaging_stats {
  uint64_t rounds = 0;
  uint64_t averaged = 0;   // complete or partial rounds
  uint64_t no_partner = 0; // stepped on its own gradient: nobody to average with
  uint64_t failed = 0;     // stepped on its own gradient: the request failed or timed out
  uint64_t skipped = 0;    // no partner and no samples of its own: no optimizer step
  uint64_t caught_up = 0;  // fell behind the stage's step and downloaded a peer's state
};

/// Counters of state downloads (the initial one and catch-ups).
struct download_stats {
  uint64_t downloads = 0;
  uint64_t donors = 0; // summed over downloads: parts came from this many peers
};

struct stage_peer {
  stage_options opts;
  caf::actor board;
  std::shared_ptr<kernels::stage_module> module;
  std::unique_ptr<torch::optim::Optimizer> optim;
  std::vector<torch::Tensor> params;
  int64_t pending_samples = 0;
  uint64_t steps = 0;
  uint64_t samples = 0;
  bool ready = false;
  std::mt19937_64 rng;
  /// Replies held back to emulate a slower device, by ticket.
  std::map<uint64_t, std::function<void()>> held;
  uint64_t next_ticket = 0;
  /// Collaborative stepping: microbatches in `pending_samples` (the accumulated gradient is a sum
  /// of microbatch means), whether an averaging round is in flight, counters.
  int64_t pending_micro = 0;
  bool averaging = false;
  /// Samples of the step being averaged (what the peer keeps publishing for that step while its
  /// round runs, so that peers still deciding see the stage's true total and join the round).
  int64_t round_samples = 0;
  /// Catching up: downloading a live peer's state after falling behind the stage's step.
  bool catching_up = false;
  averaging_stats avg;
  download_stats dl;
  /// Busy seconds (as emulated: compute / speed) and training samples, for throughput reports.
  throughput_meter meter;
};

bool collaborative(const stage_options& o) {
  return static_cast<bool>(o.averaging.averager);
}

/// Parses a progress value "step samples"; nothing for malformed (untrusted) bytes.
std::optional<std::pair<uint64_t, int64_t>> parse_progress(const std::vector<char>& v) {
  if (v.empty() || v.size() > 64)
    return std::nullopt;
  std::string text(v.begin(), v.end());
  const char* p = text.c_str();
  char* end = nullptr;
  if (!(*p >= '0' && *p <= '9'))
    return std::nullopt;
  auto step = std::strtoull(p, &end, 10);
  if (end == p || *end != ' ')
    return std::nullopt;
  p = end + 1;
  if (!(*p >= '0' && *p <= '9'))
    return std::nullopt;
  auto samples = std::strtoll(p, &end, 10);
  if (end == p || *end != '\0' || samples < 0)
    return std::nullopt;
  return std::make_pair(static_cast<uint64_t>(step), static_cast<int64_t>(samples));
}

caf::error to_error(const failure& f) {
  return caf::make_error(caf::sec::runtime_error, f.what);
}

/// Replies now (speed 1) or after the compute time stretched to compute / speed.
template <class Self>
void reply_later(Self* self, stage_peer& st, double compute_s, std::function<void()> deliver) {
  if (st.opts.speed >= 1.0) {
    deliver();
    return;
  }
  auto extra = compute_s * (1.0 / st.opts.speed - 1.0);
  auto ticket = st.next_ticket++;
  st.held.emplace(ticket, std::move(deliver));
  self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(
                             std::chrono::duration<double>(extra)),
                     tick_atom::value, ticket);
}

stage_state snapshot(stage_peer& st) {
  stage_state s;
  s.params.tensor = kernels::flatten_parameters(st.params);
  s.params.codec = kernels::codec_id::none;
  if (auto m = kernels::save_optimizer_moments(*st.optim); m.ok()) {
    s.moments.tensor = m->moments;
    s.moments.codec = kernels::codec_id::none;
    s.optimizer_steps = m->steps;
  }
  s.steps = st.steps;
  s.samples = st.samples;
  return s;
}

/// Takes a donor's (untrusted) state: parameters, optimizer state and step, all or nothing.
status load(stage_peer& st, const stage_state& s) {
  if (!s.params.ok() || !s.params.tensor.defined())
    return fail(fmt::format("the state's parameters did not arrive: {}", s.params.error));
  if (!s.moments.ok())
    return fail(fmt::format("the state's optimizer moments did not arrive: {}", s.moments.error));
  torch::NoGradGuard guard;
  auto before = kernels::flatten_parameters(st.params);
  if (auto r = kernels::unflatten_parameters(s.params.tensor, st.params); !r.ok())
    return r;
  if (s.moments.tensor.defined()) {
    auto r = kernels::load_optimizer_moments(*st.optim, {s.moments.tensor, s.optimizer_steps});
    if (!r.ok()) {
      (void)kernels::unflatten_parameters(before, st.params); // fits: it was taken from them
      return r;
    }
  }
  st.steps = s.steps;
  return {};
}

/// Averages parameters with a sibling's (gossip): peers of a stage that step independently stay
/// close without a synchronous round, and a failed partner costs nothing.
void average_with(stage_peer& st, const stage_state& other) {
  if (!other.params.ok() || !other.params.tensor.defined())
    return;
  torch::NoGradGuard guard;
  auto mine = kernels::flatten_parameters(st.params);
  if (mine.numel() != other.params.tensor.numel())
    return;
  auto avg = (mine + other.params.tensor.to(mine.dtype())) * 0.5;
  kernels::unflatten_parameters(avg, st.params);
}

caf::behavior stage_actor(caf::stateful_actor<stage_peer>* self, stage_options opts,
                          caf::actor board) {
  auto& st = self->state;
  st.opts = opts;
  st.board = board;
  st.rng.seed(opts.seed);
  auto module = kernels::make_gpt_stage(opts.model, opts.begin, opts.end);
  if (!module) {
    self->quit(to_error(module.error()));
    return {};
  }
  st.module = *module;
  st.params = st.module->ordered_parameters();
  auto optim = kernels::make_optimizer(opts.optimizer, st.params);
  if (!optim) {
    self->quit(to_error(optim.error()));
    return {};
  }
  st.optim = std::move(*optim);
  if (collaborative(opts)) {
    auto& a = opts.averaging;
    std::string why;
    if (!a.dht)
      why = "collaborative stepping needs the node's DHT actor";
    else if (a.target_batch <= 0)
      why = "target_batch must be positive";
    else if (a.progress_period <= caf::timespan{0} || a.average_timeout <= caf::timespan{0})
      why = "progress_period and average_timeout must be positive";
    else if (opts.name.empty())
      why = "collaborative stepping needs a peer name (its progress sub-key)";
    if (!why.empty()) {
      self->quit(caf::make_error(caf::sec::invalid_argument, why));
      return {};
    }
  }
  auto announce = [=] {
    self->state.ready = true;
    self->send(self->state.board, put_atom::value, self->state.opts.stage, self->state.opts.name,
               caf::actor_cast<caf::actor>(self));
  };
  // Download the stage's state from a live peer before serving (from every live peer at once; the
  // first complete state wins). A peer of the initial generation whose stage has nobody yet
  // starts from the seeded initialization; a (re)joining peer keeps trying until a donor answers.
  auto download = std::make_shared<std::function<void()>>(make_join_download(
      self, board, opts.stage,
      {opts.download_state, opts.timeout, opts.retry_every, opts.download_patience},
      [=](const stage_state& s, size_t donors) {
        if (auto r = load(self->state, s); !r.ok()) {
          aout(self) << self->state.opts.name << ": cannot take the downloaded state (" << r.what()
                     << "); asking again\n";
          return false;
        }
        self->state.dl.downloads++;
        self->state.dl.donors += donors;
        return true;
      },
      announce));
  (*download)();
  auto gossip = [=] {
    self->request(self->state.board, self->state.opts.timeout, get_atom::value,
                  self->state.opts.stage)
        .then(
            [=](const std::vector<std::string>&, const std::vector<caf::actor>& peers) {
              std::vector<caf::actor> others;
              for (auto& p : peers)
                if (p.address() != self->address())
                  others.push_back(p);
              if (others.empty())
                return;
              std::uniform_int_distribution<size_t> pick{0, others.size() - 1};
              self->request(others[pick(self->state.rng)], self->state.opts.timeout,
                            get_atom::value, state_atom::value)
                  .then([=](const stage_state& s) { average_with(self->state, s); },
                        [](caf::error&) {});
            },
            [](caf::error&) {});
  };
  // -- collaborative stepping ------------------------------------------------------------------
  // Steps on `grad` (the mean gradient of the step, averaged or own) unless `skip`, keeping the
  // gradient accumulated meanwhile (backwards served during the round) for the next step.
  auto finish_round = [=](uint64_t step, const torch::Tensor& grad, bool skip) {
    auto& s = self->state;
    if (!skip) {
      auto meanwhile = kernels::flatten_gradients(s.params);
      kernels::unflatten_gradients(grad, s.params);
      kernels::clipped_step(*s.optim, s.params, s.opts.optimizer);
      kernels::unflatten_gradients(meanwhile, s.params);
    }
    s.steps = step + 1;
    s.averaging = false;
    s.round_samples = 0;
  };
  // Takes the step's gradient out and averages it with the stage's peers at step `step`.
  auto start_round = [=] {
    auto& s = self->state;
    auto& a = s.opts.averaging;
    s.averaging = true;
    s.avg.rounds++;
    auto step = s.steps;
    auto samples = s.pending_samples;
    auto grad = kernels::flatten_gradients(s.params);
    if (s.pending_micro > 0)
      grad.div_(static_cast<double>(s.pending_micro));
    for (auto& p : s.params)
      if (p.grad().defined())
        p.grad().zero_();
    s.round_samples = samples;
    s.pending_samples = 0;
    s.pending_micro = 0;
    messages::tensor_list tl;
    tl.tensors.push_back(tensor_msg{grad, kernels::codec_id::none, {}, {}});
    self->request(a.averager, a.average_timeout, average_atom::value,
                  step_key(a.prefix, s.opts.stage, step), std::move(tl),
                  static_cast<double>(samples))
      .then(
        [=](messages::average_result& r) {
          auto& st = self->state;
          using messages::round_outcome;
          auto out = r.report.outcome;
          bool usable = r.tensors.size() == 1 && r.tensors[0].ok()
                        && r.tensors[0].tensor.defined()
                        && r.tensors[0].tensor.numel() == grad.numel();
          if (out == round_outcome::complete || out == round_outcome::partial) {
            if (usable) {
              st.avg.averaged++;
              finish_round(step, r.tensors[0].tensor.to(torch::kFloat).reshape({-1}),
                           false);
              return;
            }
            st.avg.failed++;
          } else if (out == round_outcome::no_partner) {
            st.avg.no_partner++;
          } else {
            st.avg.failed++;
          }
          if (samples == 0)
            st.avg.skipped++;
          finish_round(step, grad, samples == 0);
        },
        [=](caf::error&) {
          auto& st = self->state;
          st.avg.failed++;
          if (samples == 0)
            st.avg.skipped++;
          finish_round(step, grad, samples == 0);
        });
  };
  // Downloads the state (parameters, optimizer, step) of a stage peer at step `target` or later.
  // The gradients accumulated meanwhile stay: they count towards the next step (computed on
  // parameters one step old, the staleness of delayed averaging). No donor: retried next tick.
  auto catch_up = [=](uint64_t target) {
    auto& s = self->state;
    s.catching_up = true;
    fetch_stage_state(
      self, s.board, s.opts.stage, s.opts.timeout, target,
      [=](const stage_state& donor, size_t donors) {
        auto& st = self->state;
        st.catching_up = false;
        if (!load(st, donor).ok())
          return; // kept its own state; tried again at the next tick
        st.avg.caught_up++;
        st.dl.downloads++;
        st.dl.donors += donors;
        st.catching_up = false;
      },
      [=](bool) { self->state.catching_up = false; }); // retried at the next tick
  };
  // Publishes this peer's progress, reads the stage's, and starts a round when due.
  auto progress = [=] {
    auto& s = self->state;
    auto& a = s.opts.averaging;
    auto key = progress_key(a.prefix, s.opts.stage);
    // While a round runs, the peer still stands at its step with the samples it put into it.
    auto text = fmt::format("{} {}", s.steps, s.averaging ? s.round_samples : s.pending_samples);
    auto put = dht::make_subkey_put(key, s.opts.name, std::vector<char>(text.begin(), text.end()),
                                    dht::expires_in(self, 3 * a.progress_period));
    auto timeout = std::min(a.progress_period, a.average_timeout);
    dht::dht_store(self, a.dht, std::move(put), timeout,
                   [](const messages::dht_put_result&) {}, [](caf::error&) {});
    if (s.averaging || s.catching_up)
      return;
    auto asked_at = s.steps;
    dht::dht_get(
      self, a.dht, key, timeout,
      [=](const messages::dht_get_result& r) {
        auto& st = self->state;
        if (st.averaging || st.catching_up || st.steps != asked_at)
          return;
        int64_t total = st.pending_samples; // our own count is never stale
        uint64_t ahead = 0;
        for (auto& rec : r.records) {
          if (!rec.has_subkey || rec.subkey == st.opts.name)
            continue;
          auto pr = parse_progress(rec.value);
          if (!pr)
            continue;
          if (pr->first == st.steps)
            total += pr->second;
          else if (pr->first > st.steps)
            ahead = std::max(ahead, pr->first);
        }
        // A peer at a later step finished this step's round without us (we were late, or
        // restarted): its parameters are the stage's, so take them and keep our gradients.
        if (ahead > st.steps)
          catch_up(ahead);
        else if (total >= st.opts.averaging.target_batch)
          start_round();
      },
      [](caf::error&) {});
  };
  if (collaborative(opts))
    self->send(self, tick_atom::value);
  if (opts.report_every > caf::timespan{0})
    self->delayed_send(self, opts.report_every, load_atom::value);
  return {
    // Throughput report for rebalancing: training samples per busy second, and replies held.
    [=](load_atom) { report_load(self, static_cast<double>(self->state.held.size())); },
    [=](const stage_forward& req) -> caf::result<tensor_msg> {
      auto& s = self->state;
      if (!req.input.ok())
        return caf::make_error(caf::sec::invalid_argument, "bad input: " + req.input.error);
      auto t0 = std::chrono::steady_clock::now();
      auto out = s.module->forward(req.input.tensor, req.targets.tensor, req.seed);
      if (!out)
        return to_error(out.error());
      auto dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tensor_msg reply{*out, s.opts.codec, {}, {}};
      if (s.module->is_last())
        reply.codec = kernels::codec_id::none;
      auto rp = self->make_response_promise<tensor_msg>();
      s.meter.add(dt / s.opts.speed, 0);
      reply_later(self, s, dt, [rp, reply]() mutable { rp.deliver(reply); });
      return rp;
    },
    [=](const stage_backward& req) -> caf::result<stage_backward_reply> {
      auto& s = self->state;
      if (!req.input.ok() || !req.grad_output.ok())
        return caf::make_error(caf::sec::invalid_argument, "bad input or gradient");
      auto t0 = std::chrono::steady_clock::now();
      auto g = s.module->backward(req.input.tensor, req.grad_output.tensor, req.targets.tensor,
                                  req.seed);
      if (!g)
        return to_error(g.error());
      auto batch = req.input.tensor.size(0);
      s.pending_samples += batch;
      s.samples += static_cast<uint64_t>(batch);
      bool stepped = false;
      if (collaborative(s.opts)) {
        s.pending_micro++; // the step is taken by the progress tick (start_round)
      } else if (s.pending_samples >= s.opts.local_batch) {
        // Gradients were summed over microbatches of mean losses: scale to a mean.
        auto micro = static_cast<double>(s.pending_samples) / static_cast<double>(batch);
        for (auto& p : s.params)
          if (p.grad().defined())
            p.grad().div_(micro);
        kernels::clipped_step(*s.optim, s.params, s.opts.optimizer);
        s.optim->zero_grad();
        s.pending_samples = 0;
        s.steps++;
        stepped = true;
      }
      auto dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      stage_backward_reply reply;
      if (g->grad_input.defined())
        reply.grad_input = tensor_msg{g->grad_input, s.opts.codec, {}, {}};
      if (s.module->is_last())
        reply.loss = g->output.item<double>();
      auto rp = self->make_response_promise<stage_backward_reply>();
      s.meter.add(dt / s.opts.speed, static_cast<double>(batch));
      reply_later(self, s, dt, [rp, reply]() mutable { rp.deliver(reply); });
      if (stepped)
        gossip();
      return rp;
    },
    [=](get_atom, state_atom) -> caf::result<stage_state> {
      if (!self->state.ready)
        return caf::make_error(caf::sec::runtime_error, "stage peer is still starting");
      return snapshot(self->state);
    },
    // One part of the state, for a newcomer that downloads from several donors at once.
    [=](get_atom, state_atom, uint64_t part,
        uint64_t parts) -> caf::result<messages::stage_state_part> {
      if (!self->state.ready)
        return caf::make_error(caf::sec::runtime_error, "stage peer is still starting");
      auto whole = snapshot(self->state);
      auto cut = cut_state_part(whole, state_digest(whole), part, parts);
      if (!cut.ok())
        return caf::make_error(caf::sec::invalid_argument, cut.error().what);
      return std::move(*cut);
    },
    [=](state_atom) {
      if (!self->state.ready)
        (*download)();
    },
    // Progress tick of collaborative stepping (a bare tick; held replies carry a ticket).
    [=](tick_atom) {
      self->delayed_send(self, self->state.opts.averaging.progress_period, tick_atom::value);
      if (self->state.ready)
        progress();
    },
    /// `(status_atom) -> [steps, samples, rounds, averaged, no_partner, failed, skipped,
    /// caught_up, downloads, donors summed over downloads]`.
    [=](status_atom) -> std::vector<uint64_t> {
      auto& s = self->state;
      return {s.steps,         s.samples,     s.avg.rounds,  s.avg.averaged,
              s.avg.no_partner, s.avg.failed, s.avg.skipped, s.avg.caught_up,
              s.dl.downloads,  s.dl.donors};
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

std::string progress_key(const std::string& prefix, uint64_t stage) {
  return fmt::format("{}/stage{}/progress", prefix, stage);
}

std::string step_key(const std::string& prefix, uint64_t stage, uint64_t step) {
  return fmt::format("{}/stage{}/step{}", prefix, stage, step);
}

caf::actor spawn_stage(caf::actor_system& sys, stage_options opts, caf::actor board) {
  if (opts.modeled.enabled)
    return spawn_modeled_stage(sys, std::move(opts), std::move(board));
  return sys.spawn(stage_actor, std::move(opts), std::move(board));
}

} // namespace starling::actors::stage
