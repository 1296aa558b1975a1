#include "actors/stage/stage.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <type_traits>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/dht/client.hpp"
#include "actors/stage/checkpoint.hpp"
#include "actors/stage/device_queue.hpp"
#include "actors/stage/fetch_state.hpp"
#include "actors/stage/load_view.hpp"
#include "actors/stage/state_parts.hpp"
#include "actors/stage/torch_backend.hpp"
#include "kernels/flat.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "messages/dht.hpp"
#include "messages/metrics.hpp"
#include "messages/rebalance_atoms.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::stage {

namespace {

// The device queue takes CAF's clock readings.
static_assert(std::is_same<caf::actor_clock::time_point, device_queue::time_point>::value,
              "device_queue::time_point must be CAF's actor_clock::time_point");

using messages::stage_backward;
using messages::stage_backward_reply;
using messages::stage_forward;
using messages::stage_state;
using messages::tensor_msg;
using time_point = caf::actor_clock::time_point;

/// Counters of collaborative stepping (reported by `(status_atom)`).
struct averaging_stats {
  uint64_t rounds = 0;
  uint64_t averaged = 0;   // complete or partial rounds
  uint64_t no_partner = 0; // stepped on its own gradient: nobody to average with
  uint64_t failed = 0;     // stepped on its own gradient: the request failed or timed out
  uint64_t skipped = 0;    // no partner and no samples of its own: no optimizer step
  uint64_t caught_up = 0;  // fell behind the stage's step and downloaded a peer's state
};

/// Counters of checkpoints (reported by `(status_atom, checkpoint_atom)`).
struct checkpoint_stats {
  uint64_t written = 0;
  uint64_t bytes = 0;
  uint64_t restored = 0;
  uint64_t restored_steps = 0;
  uint64_t rejected = 0;
  uint64_t failed = 0;
  /// Samples of the pending gradient taken up at resumption (0: none).
  uint64_t pending_samples = 0;
  std::string restored_digest;
};

/// Counters of exactly-once gradients (reported by `(status_atom, commit_atom)`).
struct commit_stats {
  uint64_t applied = 0;   // confirmed gradients that entered the optimizer's accumulation
  uint64_t lost = 0;      // computed gradients never confirmed (dropped: lost work)
  uint64_t duplicate = 0; // confirmations of a gradient no longer pending (ignored)
};

/// A backward's gradient waiting for its trainer's confirmation.
struct uncommitted_grad {
  /// The microbatch's gradient of the stage's parameters, flat (undefined: none).
  torch::Tensor grad;
  int64_t batch = 0;
  /// Dropped (as lost work) when not confirmed by then.
  time_point deadline;
};

/// Counters of state downloads (the initial one and catch-ups).
struct download_stats {
  uint64_t downloads = 0;
  uint64_t donors = 0; // summed over downloads: parts came from this many peers
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

caf::error still_starting() {
  return caf::make_error(caf::sec::runtime_error, "stage peer is still starting");
}

caf::error leaving() {
  return caf::make_error(caf::sec::runtime_error, "stage peer is leaving its stage");
}

int64_t batch_of(const at::Tensor& t) {
  return t.defined() && t.dim() > 0 ? std::max<int64_t>(1, t.size(0)) : 1;
}

/// splitmix64: the placeholder parameters' seed from the stage's blocks, equal on every peer of
/// a stage (as a real model's seeded initialization).
uint64_t mix(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The backend `opts` asks for.
result<std::unique_ptr<backend>> make_backend(const stage_options& opts) {
  if (opts.backend == compute_backend::cost_model) {
    auto models = opts.models ? opts.models : kernels::model_registry::builtins();
    auto depth = models->depth(opts.model);
    if (!depth)
      return depth.error();
    auto init = mix(static_cast<uint64_t>(opts.begin) * 1000003ull
                    + static_cast<uint64_t>(opts.end));
    return make_cost_model(opts.cost_model, *depth, opts.begin, opts.end, opts.seed, init);
  }
  torch_backend_options t;
  t.model = opts.model;
  t.models = opts.models;
  t.begin = opts.begin;
  t.end = opts.end;
  t.timer = opts.timer;
  return make_torch_backend(std::move(t));
}

/// Writes checkpoints on its own thread: `(checkpoint_atom, dir, stage, begin, end, peer,
/// time_ns, state) -> (ok, error, bytes, seconds)`.
caf::behavior checkpoint_writer(caf::event_based_actor*) {
  return {
    [](checkpoint_atom, const std::string& dir, uint64_t stage, int64_t begin, int64_t end,
       const std::string& peer, uint64_t ns, const stage_state& s) {
      auto w = write_checkpoint(dir, {stage, begin, end}, peer, ns, s);
      if (!w)
        return caf::make_message(false, w.error().what, uint64_t{0}, 0.0);
      return caf::make_message(true, std::string{}, w->bytes, w->seconds);
    },
  };
}

/// A stage peer: the protocol around one backend and its device queue.
class stage_peer {
public:
  explicit stage_peer(caf::event_based_actor* self) : self_(self) {
    // nop
  }

  /// Checks the options, builds the backend and the optimizer; an error ends the actor.
  caf::error init(stage_options opts, caf::actor board);

  /// Starts the state download (and the ticks) and returns the protocol.
  caf::behavior make_behavior();

private:
  // -- serving ----------------------------------------------------------------------------------

  caf::result<tensor_msg> forward(const stage_forward& req);
  caf::result<stage_backward_reply> backward(const stage_backward& req);

  /// Queues the computed request on the device: the reply leaves when its compute is done (at
  /// once when that is now), or fails at once when the peer dies first.
  template <class T>
  caf::result<T> respond(time_point arrived, const compute_result& r, T value);

  /// Runs `deliver` after `delay`; `fail` answers the caller if the peer dies first.
  void hold(caf::timespan delay, std::function<void()> deliver,
            std::function<void(const caf::error&)> fail);

  // -- state ------------------------------------------------------------------------------------

  stage_state snapshot() const;
  status load(const stage_state& s);
  void announce();
  /// Marks the state changed (a checkpoint is due at the next timer).
  void changed() { ++version_; }

  // -- checkpoints ------------------------------------------------------------------------------

  bool checkpointing() const;
  /// Stops on purpose: the last checkpoint and the accumulated gradient are written, then the
  /// peer quits with `user_shutdown`.
  void leave();
  /// A draining peer leaves once its queue is served and every gradient it computed was
  /// confirmed or expired.
  void leave_when_drained();
  /// Writes a checkpoint when the state changed since the last one: in the background when the
  /// options say so (unless `now`), else at once.
  void save_checkpoint(bool now = false);
  /// Resumes from the newest checkpoint of the stage that verifies; false when there is none.
  bool restore_checkpoint();
  /// Resumes from a replica downloaded from `holders` other nodes; false when it does not fit.
  bool restore_replica(const stage_state& s, size_t holders);
  /// The bookkeeping of a resumption from stored state at `steps` (`from` says where, after
  /// "no live peer of stage k"): counters, the log line, the `restore` report, and the slot's
  /// pending gradient.
  void resumed(uint64_t steps, const std::string& digest, const std::string& from, bool replica);
  /// Saves the gradient accumulated towards the next step for the peer's slot (stopped on
  /// purpose), and takes up the slot's saved one when the peer starts at its step.
  void save_pending();
  void take_pending();
  /// The folders the peer reads checkpoints from (its own first).
  std::vector<std::string> checkpoint_dirs() const;
  void report(const std::string& kind, std::map<std::string, double> values);
  void report_load();

  // -- exactly-once gradients ---------------------------------------------------------------------

  /// Applies the gradient of (id, attempt) when it is pending; drops the microbatch's other
  /// attempts held here.
  void commit(uint64_t id, uint32_t attempt);
  /// Adds a confirmed microbatch's gradient and samples, and steps when due (local stepping).
  void apply(const uncommitted_grad& g);
  /// Drops gradients whose confirmation is overdue.
  void expire_uncommitted();

  // -- local stepping ---------------------------------------------------------------------------

  /// Averages parameters with a random sibling's (gossip): peers of a stage that step
  /// independently stay close without a synchronous round, and a failed partner costs nothing.
  void gossip();
  void average_with(const stage_state& other);

  // -- collaborative stepping -------------------------------------------------------------------

  void progress();
  void start_round();
  void finish_round(uint64_t step, const torch::Tensor& grad, bool skip);
  void catch_up(uint64_t target);

  caf::event_based_actor* self_;
  stage_options opts_;
  caf::actor board_;
  std::unique_ptr<backend> dev_;
  std::unique_ptr<torch::optim::Optimizer> optim_;
  std::vector<torch::Tensor> params_;
  /// The device: requests in arrival order, each behind the ones before it.
  device_queue queue_;
  /// Replies waiting for their compute to finish, by ticket.
  std::map<uint64_t, std::function<void()>> held_;
  uint64_t next_ticket_ = 0;
  /// How to fail each held reply when the peer dies (a preempted machine's connections break,
  /// so its callers learn at once instead of at their timeout).
  std::shared_ptr<std::map<uint64_t, std::function<void(const caf::error&)>>> on_death_ =
    std::make_shared<std::map<uint64_t, std::function<void(const caf::error&)>>>();
  /// The download before serving, called again for each retry (`make_join_download`).
  std::function<void()> download_;
  int64_t pending_samples_ = 0;
  uint64_t steps_ = 0;
  uint64_t samples_ = 0;
  bool ready_ = false;
  std::mt19937_64 rng_;
  /// Collaborative stepping: microbatches in `pending_samples_` (the accumulated gradient is a
  /// sum of microbatch means), whether an averaging round is in flight.
  int64_t pending_micro_ = 0;
  bool averaging_ = false;
  /// Samples of the step being averaged (what the peer keeps publishing for that step while its
  /// round runs, so that peers still deciding see the stage's true total and join the round).
  int64_t round_samples_ = 0;
  /// Catching up: downloading a live peer's state after falling behind the stage's step.
  bool catching_up_ = false;
  averaging_stats avg_;
  download_stats dl_;
  /// State changes so far, and the count at the last checkpoint written or restored.
  uint64_t version_ = 0;
  uint64_t saved_version_ = 0;
  /// The background checkpoint writer (spawned at the first background write), and whether a
  /// write is in flight.
  caf::actor writer_;
  bool writing_ = false;
  /// Leaving its stage (`(migrate_atom)`): serving what it holds, refusing new work.
  bool draining_ = false;
  checkpoint_stats ckpt_;
  /// Gradients computed but not yet confirmed, by (microbatch id, attempt).
  std::map<std::pair<uint64_t, uint32_t>, uncommitted_grad> uncommitted_;
  /// Whether the expiry timer runs.
  bool expiring_ = false;
  commit_stats commits_;
  /// How often each microbatch's gradient was applied here (the most recent ids only).
  std::map<uint64_t, uint64_t> applied_;
  /// Device seconds and training samples served, for throughput reports.
  throughput_meter meter_;
};

caf::error stage_peer::init(stage_options opts, caf::actor board) {
  opts_ = std::move(opts);
  board_ = std::move(board);
  rng_.seed(opts_.seed);
  if (!(opts_.speed > 0) || !std::isfinite(opts_.speed))
    return caf::make_error(caf::sec::invalid_argument,
                           fmt::format("a stage peer's speed must be positive, got {}",
                                       opts_.speed));
  auto dev = make_backend(opts_);
  if (!dev)
    return to_error(dev.error());
  dev_ = std::move(*dev);
  params_ = dev_->parameters();
  auto optim = kernels::make_optimizer(opts_.optimizer, params_);
  if (!optim)
    return to_error(optim.error());
  optim_ = std::move(*optim);
  if (collaborative(opts_)) {
    auto& a = opts_.averaging;
    std::string why;
    if (!a.dht)
      why = "collaborative stepping needs the node's DHT actor";
    else if (a.target_batch <= 0)
      why = "target_batch must be positive";
    else if (a.progress_period <= caf::timespan{0} || a.average_timeout <= caf::timespan{0})
      why = "progress_period and average_timeout must be positive";
    else if (opts_.name.empty())
      why = "collaborative stepping needs a peer name (its progress sub-key)";
    if (!why.empty())
      return caf::make_error(caf::sec::invalid_argument, why);
  }
  // Download the stage's state from a live peer before serving (from every live peer at once;
  // the first complete state wins). A peer of the initial generation whose stage has nobody yet
  // starts from the seeded initialization; a (re)joining peer keeps trying until a donor answers.
  download_ = make_join_download(
    self_, board_, opts_.stage,
    {opts_.download_state, opts_.timeout, opts_.retry_every, opts_.download_patience},
    [this](const stage_state& s, size_t donors) {
      if (auto r = load(s); !r.ok()) {
        aout(self_) << opts_.name << ": cannot take the downloaded state (" << r.what()
                    << "); asking again\n";
        return false;
      }
      dl_.downloads++;
      dl_.donors += donors;
      take_pending();
      return true;
    },
    [this] { announce(); },
    [this] { return restore_checkpoint(); }, opts_.checkpoint.replicas,
    [this](const stage_state& s, size_t holders) { return restore_replica(s, holders); });
  // Stopped on purpose: see `leave`.
  self_->set_exit_handler([this](const caf::exit_msg& m) {
    if (m.reason == caf::exit_reason::user_shutdown)
      leave();
    else
      self_->quit(m.reason);
  });
  // Held replies fail when the peer dies (its callers retry elsewhere at once).
  auto deaths = on_death_;
  self_->attach_functor([deaths] {
    auto err = caf::make_error(caf::sec::request_receiver_down, "stage peer died");
    auto pending = std::move(*deaths);
    deaths->clear();
    for (auto& kv : pending)
      kv.second(err);
  });
  return caf::none;
}

caf::behavior stage_peer::make_behavior() {
  download_();
  if (collaborative(opts_))
    self_->send(self_, tick_atom::value);
  if (opts_.report_every > caf::timespan{0})
    self_->delayed_send(self_, opts_.report_every, load_atom::value);
  if (checkpointing())
    self_->delayed_send(self_, opts_.checkpoint.every, checkpoint_atom::value);
  return {
    [this](const stage_forward& req) { return forward(req); },
    [this](const stage_backward& req) { return backward(req); },
    [this](get_atom, state_atom) -> caf::result<stage_state> {
      if (!ready_)
        return still_starting();
      return snapshot();
    },
    // One part of the state, for a newcomer that downloads from several donors at once.
    [this](get_atom, state_atom, uint64_t part,
           uint64_t parts) -> caf::result<messages::stage_state_part> {
      if (!ready_)
        return still_starting();
      auto whole = snapshot();
      auto cut = cut_state_part(whole, state_digest(whole), part, parts);
      if (!cut.ok())
        return caf::make_error(caf::sec::invalid_argument, cut.error().what);
      return std::move(*cut);
    },
    // A retry of the download before serving.
    [this](state_atom) {
      if (!ready_)
        download_();
    },
    // A trainer's probe: seconds of device time queued ahead of a request arriving now.
    // A draining peer takes no new work: its queue looks endless.
    [this](probe_atom) {
      return draining_ ? 1e9 : queue_.backlog(self_->clock().now());
    },
    // Throughput report for rebalancing.
    [this](load_atom) { report_load(); },
    // Progress tick of collaborative stepping (a bare tick; held replies carry a ticket).
    [this](tick_atom) {
      self_->delayed_send(self_, opts_.averaging.progress_period, tick_atom::value);
      if (ready_)
        progress();
    },
    [this](tick_atom, uint64_t ticket) {
      auto i = held_.find(ticket);
      if (i == held_.end())
        return;
      auto deliver = std::move(i->second);
      held_.erase(i);
      deliver();
      leave_when_drained();
    },
    [this](checkpoint_atom) {
      self_->delayed_send(self_, opts_.checkpoint.every, checkpoint_atom::value);
      if (ready_)
        save_checkpoint();
    },
    [this](status_atom, checkpoint_atom) -> caf::result<std::vector<uint64_t>, std::string> {
      std::vector<uint64_t> counters{ckpt_.written,         ckpt_.bytes,    ckpt_.restored,
                                     ckpt_.restored_steps,  ckpt_.rejected, ckpt_.failed,
                                     ckpt_.pending_samples};
      return {std::move(counters), ckpt_.restored_digest};
    },
    [this](messages::commit_atom, uint64_t id, uint32_t attempt) {
      commit(id, attempt);
      leave_when_drained();
    },
    [this](messages::commit_atom) {
      expire_uncommitted();
      leave_when_drained();
    },
    // Leaving the stage (a migration): the queue is served and confirmed, new work refused.
    [this](migrate_atom) {
      draining_ = true;
      leave_when_drained();
    },
    [this](status_atom, messages::commit_atom) -> std::vector<uint64_t> {
      return {commits_.applied, commits_.lost, commits_.duplicate,
              static_cast<uint64_t>(uncommitted_.size())};
    },
    [this](get_atom, messages::commit_atom) -> std::vector<uint64_t> {
      std::vector<uint64_t> out;
      for (auto& [id, times] : applied_) {
        out.push_back(id);
        out.push_back(times);
      }
      return out;
    },
    [this](status_atom) -> std::vector<uint64_t> {
      return {steps_,         samples_,     avg_.rounds,   avg_.averaged,
              avg_.no_partner, avg_.failed, avg_.skipped,  avg_.caught_up,
              dl_.downloads,  dl_.donors,   static_cast<uint64_t>(queue_.queued())};
    },
  };
}

// -- serving ------------------------------------------------------------------------------------

caf::result<tensor_msg> stage_peer::forward(const stage_forward& req) {
  if (draining_)
    return leaving();
  if (!req.input.ok())
    return caf::make_error(caf::sec::invalid_argument, "bad input: " + req.input.error);
  auto arrived = self_->clock().now();
  auto r = dev_->forward(req.input.tensor, req.targets.tensor, req.seed);
  if (!r)
    return to_error(r.error());
  // The loss travels exactly; activations with the peer's codec.
  tensor_msg reply{r->output, dev_->is_last() ? kernels::codec_id::none : opts_.codec, {}, {}};
  return respond(arrived, *r, std::move(reply));
}

caf::result<stage_backward_reply> stage_peer::backward(const stage_backward& req) {
  if (draining_)
    return leaving();
  if (!req.input.ok() || !req.grad_output.ok())
    return caf::make_error(caf::sec::invalid_argument, "bad input or gradient");
  auto arrived = self_->clock().now();
  // The microbatch's gradient is computed apart from the accumulated (confirmed) ones and held
  // until the trainer confirms this attempt: a retried backward enters the optimizer once.
  auto confirmed = kernels::flatten_gradients(params_);
  for (auto& p : params_)
    if (p.grad().defined())
      p.grad().zero_();
  auto r = dev_->backward(req.input.tensor, req.grad_output.tensor, req.targets.tensor, req.seed);
  uncommitted_grad held;
  held.grad = kernels::flatten_gradients(params_);
  (void)kernels::unflatten_gradients(confirmed, params_); // fits: taken from them
  if (!r)
    return to_error(r.error());
  auto batch = batch_of(req.input.tensor);
  samples_ += static_cast<uint64_t>(batch);
  held.batch = batch;
  stage_backward_reply reply;
  if (r->output.defined())
    reply.grad_input = tensor_msg{r->output, opts_.codec, {}, {}};
  if (dev_->is_last())
    reply.loss = r->loss;
  auto out = respond(arrived, *r, std::move(reply));
  // Overdue once the reply left (behind the queue) and a commit timeout passed.
  auto now = self_->clock().now();
  held.deadline = now
                  + std::chrono::duration_cast<caf::timespan>(
                    std::chrono::duration<double>(queue_.backlog(now)))
                  + opts_.commit_timeout;
  // A second delivery of the same attempt replaces the first: it is one gradient either way.
  uncommitted_[{req.microbatch_id, req.attempt}] = std::move(held);
  if (!expiring_) {
    expiring_ = true;
    self_->delayed_send(self_, opts_.commit_timeout, messages::commit_atom::value);
  }
  return out;
}

// -- exactly-once gradients -----------------------------------------------------------------------

void stage_peer::commit(uint64_t id, uint32_t attempt) {
  auto i = uncommitted_.find({id, attempt});
  if (i == uncommitted_.end()) {
    commits_.duplicate++; // expired already, or confirmed twice
    return;
  }
  auto g = std::move(i->second);
  uncommitted_.erase(i);
  // The trainer used this attempt: any other attempt of the microbatch held here never counts.
  for (auto j = uncommitted_.lower_bound({id, 0}); j != uncommitted_.end() && j->first.first == id;) {
    commits_.lost++;
    j = uncommitted_.erase(j);
  }
  apply(g);
  commits_.applied++;
  applied_[id]++;
  if (applied_.size() > 65536)
    applied_.erase(applied_.begin());
}

void stage_peer::apply(const uncommitted_grad& g) {
  if (g.grad.defined() && g.grad.numel() > 0) {
    torch::NoGradGuard guard;
    auto sum = kernels::flatten_gradients(params_);
    sum.add_(g.grad);
    (void)kernels::unflatten_gradients(sum, params_); // fits: taken from them
  }
  pending_samples_ += g.batch;
  if (collaborative(opts_)) {
    pending_micro_++; // the step is taken by the progress tick (start_round)
    return;
  }
  if (pending_samples_ < opts_.local_batch)
    return;
  // Gradients were summed over microbatches of mean losses: scale to a mean.
  auto micro = static_cast<double>(pending_samples_) / static_cast<double>(g.batch);
  for (auto& p : params_)
    if (p.grad().defined())
      p.grad().div_(micro);
  kernels::clipped_step(*optim_, params_, opts_.optimizer);
  optim_->zero_grad();
  pending_samples_ = 0;
  steps_++;
  changed();
  gossip();
}

void stage_peer::expire_uncommitted() {
  auto now = self_->clock().now();
  for (auto i = uncommitted_.begin(); i != uncommitted_.end();) {
    if (i->second.deadline <= now) {
      commits_.lost++;
      i = uncommitted_.erase(i);
    } else {
      ++i;
    }
  }
  expiring_ = !uncommitted_.empty();
  if (expiring_)
    self_->delayed_send(self_, opts_.commit_timeout, messages::commit_atom::value);
}

template <class T>
caf::result<T> stage_peer::respond(time_point arrived, const compute_result& r, T value) {
  auto now = self_->clock().now();
  auto device_s = r.device_s / opts_.speed;
  auto done = queue_.admit(arrived, now, device_s, r.ran_s);
  auto samples = r.samples;
  if (done <= now) {
    queue_.complete();
    meter_.add(device_s, samples);
    return value;
  }
  auto rp = self_->make_response_promise<T>();
  hold(
    done - now,
    [this, rp, device_s, samples, v = std::move(value)]() mutable {
      queue_.complete();
      meter_.add(device_s, samples);
      rp.deliver(std::move(v));
    },
    [rp](const caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

void stage_peer::hold(caf::timespan delay, std::function<void()> deliver,
                      std::function<void(const caf::error&)> fail) {
  auto ticket = next_ticket_++;
  auto deaths = on_death_;
  deaths->emplace(ticket, std::move(fail));
  held_.emplace(ticket, [deaths, ticket, f = std::move(deliver)] {
    deaths->erase(ticket);
    f();
  });
  self_->delayed_send(self_, delay, tick_atom::value, ticket);
}

// -- state --------------------------------------------------------------------------------------

stage_state stage_peer::snapshot() const {
  stage_state s;
  s.params.tensor = kernels::flatten_parameters(params_);
  s.params.codec = kernels::codec_id::none;
  if (auto m = kernels::save_optimizer_moments(*optim_); m.ok()) {
    s.moments.tensor = m->moments;
    s.moments.codec = kernels::codec_id::none;
    s.optimizer_steps = m->steps;
  }
  s.steps = steps_;
  s.samples = samples_;
  s.modeled.size = dev_->modeled_state_bytes();
  return s;
}

/// Takes a donor's (untrusted) state: parameters, optimizer state and step, all or nothing.
status stage_peer::load(const stage_state& s) {
  if (!s.params.ok() || !s.params.tensor.defined())
    return fail(fmt::format("the state's parameters did not arrive: {}", s.params.error));
  if (!s.moments.ok())
    return fail(fmt::format("the state's optimizer moments did not arrive: {}", s.moments.error));
  torch::NoGradGuard guard;
  auto before = kernels::flatten_parameters(params_);
  if (auto r = kernels::unflatten_parameters(s.params.tensor, params_); !r.ok())
    return r;
  if (s.moments.tensor.defined()) {
    auto r = kernels::load_optimizer_moments(*optim_, {s.moments.tensor, s.optimizer_steps});
    if (!r.ok()) {
      (void)kernels::unflatten_parameters(before, params_); // fits: it was taken from them
      return r;
    }
  }
  steps_ = s.steps;
  changed();
  return {};
}

// -- checkpoints --------------------------------------------------------------------------------

bool stage_peer::checkpointing() const {
  return !opts_.checkpoint.dir.empty() && opts_.checkpoint.every > caf::timespan{0};
}

void stage_peer::report(const std::string& kind, std::map<std::string, double> values) {
  if (opts_.metrics)
    self_->send(opts_.metrics,
                messages::metric_event{opts_.name,
                                       kind,
                                       std::move(values),
                                       {{"stage", std::to_string(opts_.stage)}},
                                       -1,
                                       {}});
}

void stage_peer::leave() {
  // A peer stopped on purpose (the run's end or a signal, leaving, migrating) writes its state
  // first, so that a resumed run or a later peer continues from it; a preempted one (killed)
  // cannot.
  if (ready_ && checkpointing()) {
    save_checkpoint(true); // now: the peer is going
    save_pending();
  }
  self_->quit(caf::exit_reason::user_shutdown);
}

void stage_peer::leave_when_drained() {
  if (draining_ && held_.empty() && uncommitted_.empty())
    leave();
}

void stage_peer::save_checkpoint(bool now) {
  if (version_ == saved_version_ || (writing_ && !now))
    return;
  auto t0 = std::chrono::steady_clock::now();
  auto version = version_;
  auto at = self_->clock().now().time_since_epoch();
  auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(at).count());
  auto s = snapshot(); // copies: the writer may work on it while the peer trains on
  auto steps = s.steps;
  auto done = [this, version, steps, t0](const std::string& error, uint64_t bytes, double seconds,
                                         double in_actor_s) {
    if (!error.empty()) {
      // Tried again at the next timer; the peer serves on.
      ckpt_.failed++;
      aout(self_) << opts_.name << ": " << error << "\n";
      return;
    }
    saved_version_ = std::max(saved_version_, version);
    ckpt_.written++;
    ckpt_.bytes += bytes;
    prune_checkpoints(opts_.checkpoint.dir, {opts_.stage, opts_.begin, opts_.end}, opts_.name,
                      opts_.checkpoint.keep);
    report("checkpoint", {{"bytes", static_cast<double>(bytes)},
                          {"seconds", seconds},
                          {"actor_seconds", in_actor_s},
                          {"steps", static_cast<double>(steps)}});
  };
  if (now || !opts_.checkpoint.background) {
    auto w = write_checkpoint(opts_.checkpoint.dir, {opts_.stage, opts_.begin, opts_.end},
                              opts_.name, ns, s);
    auto in_actor = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!w)
      done(w.error().what, 0, 0, in_actor);
    else
      done({}, w->bytes, w->seconds, in_actor);
    return;
  }
  // In the background: encoding, hashing, writing and syncing run on the writer's own thread;
  // the peer's actor only takes the snapshot.
  if (!writer_)
    writer_ = self_->spawn<caf::detached + caf::linked>(checkpoint_writer);
  writing_ = true;
  auto in_actor = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  self_
    ->request(writer_, caf::infinite, checkpoint_atom::value, opts_.checkpoint.dir, opts_.stage,
              opts_.begin, opts_.end, opts_.name, ns, std::move(s))
    .then(
      [this, done, in_actor](bool ok, const std::string& error, uint64_t bytes, double seconds) {
        writing_ = false;
        done(ok ? std::string{} : error, bytes, seconds, in_actor);
      },
      [this, done, in_actor](caf::error& e) {
        writing_ = false;
        done("checkpoint writer: " + caf::to_string(e), 0, 0, in_actor);
      });
}

std::vector<std::string> stage_peer::checkpoint_dirs() const {
  std::vector<std::string> dirs;
  if (!opts_.checkpoint.dir.empty())
    dirs.push_back(opts_.checkpoint.dir);
  dirs.insert(dirs.end(), opts_.checkpoint.search.begin(), opts_.checkpoint.search.end());
  return dirs;
}

void stage_peer::save_pending() {
  // A round in flight took its gradient out (lost with the peer); what was accumulated
  // meanwhile was computed on the same parameters and counts towards the next step.
  if (opts_.checkpoint.slot.empty() || pending_samples_ <= 0)
    return;
  pending_gradient g;
  g.step = steps_;
  g.samples = static_cast<uint64_t>(pending_samples_);
  g.microbatches = static_cast<uint64_t>(pending_micro_);
  g.sum = kernels::flatten_gradients(params_);
  auto now = self_->clock().now().time_since_epoch();
  auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
  auto w = write_pending_gradient(opts_.checkpoint.dir, {opts_.stage, opts_.begin, opts_.end},
                                  opts_.checkpoint.slot, ns, g);
  if (!w)
    aout(self_) << opts_.name << ": the accumulated gradient is lost: " << w.error().what << "\n";
}

void stage_peer::take_pending() {
  if (opts_.checkpoint.slot.empty())
    return;
  auto dirs = checkpoint_dirs();
  if (dirs.empty())
    return;
  auto t = take_pending_gradient(dirs, {opts_.stage, opts_.begin, opts_.end},
                                 opts_.checkpoint.slot, steps_);
  for (auto& note : t.notes)
    aout(self_) << opts_.name << ": pending gradient " << note << "\n";
  if (!t.gradient)
    return;
  auto& g = *t.gradient;
  torch::NoGradGuard guard;
  auto sum = kernels::flatten_gradients(params_);
  if (sum.numel() != g.sum.numel()) {
    aout(self_) << opts_.name << ": pending gradient of " << g.sum.numel()
                << " values does not fit the stage's " << sum.numel() << "; dropped\n";
    return;
  }
  sum.add_(g.sum);
  (void)kernels::unflatten_gradients(sum, params_);
  pending_samples_ += static_cast<int64_t>(g.samples);
  pending_micro_ += static_cast<int64_t>(g.microbatches);
  ckpt_.pending_samples += g.samples;
  report("pending_restored", {{"samples", static_cast<double>(g.samples)}});
}

bool stage_peer::restore_checkpoint() {
  if (opts_.checkpoint.dir.empty() && opts_.checkpoint.search.empty())
    return false;
  auto dirs = checkpoint_dirs();
  checkpoint_key key{opts_.stage, opts_.begin, opts_.end};
  auto found = newest_checkpoint(dirs, key, [this](const checkpoint_loaded& c) {
    return load(c.state); // all or nothing: a state of another shape leaves the peer as it was
  });
  for (auto& why : found.rejected) {
    ckpt_.rejected++;
    aout(self_) << opts_.name << ": checkpoint rejected: " << why << "\n";
    report("checkpoint_rejected", {});
  }
  if (!found.found)
    return false;
  auto& c = *found.found;
  saved_version_ = version_; // the state on disk already
  resumed(c.state.steps, c.digest, "; resumed from checkpoint " + c.file.path, false);
  return true;
}

bool stage_peer::restore_replica(const stage_state& s, size_t holders) {
  if (auto r = load(s); !r.ok()) {
    aout(self_) << opts_.name << ": replica rejected: " << r.what() << "\n";
    report("checkpoint_rejected", {});
    ckpt_.rejected++;
    return false;
  }
  resumed(s.steps, state_digest(s),
          fmt::format(" and no checkpoint on this node; resumed from its replica on {} other "
                      "node{}",
                      holders, holders == 1 ? "" : "s"),
          true);
  return true;
}

void stage_peer::resumed(uint64_t steps, const std::string& digest, const std::string& from,
                         bool replica) {
  ckpt_.restored = 1;
  ckpt_.restored_steps = steps;
  ckpt_.restored_digest = digest;
  aout(self_) << opts_.name << ": no live peer of stage " << opts_.stage << from << " (step "
              << steps << ", digest " << digest_hex(digest).substr(0, 16) << ")\n";
  std::map<std::string, double> values{{"steps", static_cast<double>(steps)}};
  if (replica)
    values["replica"] = 1.0;
  report("restore", std::move(values));
  take_pending();
}

void stage_peer::announce() {
  ready_ = true;
  self_->send(board_, put_atom::value, opts_.stage, opts_.name,
              caf::actor_cast<caf::actor>(self_));
}

/// Schedules the next report and, once serving, sends `(load_atom, stage, name, throughput,
/// queue)` with the smoothed throughput (nothing when the last period measured nothing).
void stage_peer::report_load() {
  self_->delayed_send(self_, opts_.report_every, load_atom::value);
  if (!ready_)
    return;
  if (auto throughput = meter_.close())
    self_->send(board_, load_atom::value, opts_.stage, opts_.name, *throughput,
                static_cast<double>(queue_.queued()));
}

// -- local stepping -----------------------------------------------------------------------------

void stage_peer::gossip() {
  self_->request(board_, opts_.timeout, get_atom::value, opts_.stage)
    .then(
      [this](const std::vector<std::string>&, const std::vector<caf::actor>& peers) {
        std::vector<caf::actor> others;
        for (auto& p : peers)
          if (p.address() != self_->address())
            others.push_back(p);
        if (others.empty())
          return;
        std::uniform_int_distribution<size_t> pick{0, others.size() - 1};
        self_->request(others[pick(rng_)], opts_.timeout, get_atom::value, state_atom::value)
          .then([this](const stage_state& s) { average_with(s); }, [](caf::error&) {});
      },
      [](caf::error&) {});
}

void stage_peer::average_with(const stage_state& other) {
  if (!other.params.ok() || !other.params.tensor.defined())
    return;
  torch::NoGradGuard guard;
  auto mine = kernels::flatten_parameters(params_);
  if (mine.numel() != other.params.tensor.numel())
    return;
  auto avg = (mine + other.params.tensor.to(mine.dtype())) * 0.5;
  kernels::unflatten_parameters(avg, params_);
  changed();
}

// -- collaborative stepping ---------------------------------------------------------------------

/// Publishes this peer's progress, reads the stage's, and starts a round when due.
void stage_peer::progress() {
  auto& a = opts_.averaging;
  auto key = progress_key(a.prefix, opts_.stage);
  // While a round runs, the peer still stands at its step with the samples it put into it.
  auto text = fmt::format("{} {}", steps_, averaging_ ? round_samples_ : pending_samples_);
  auto put = dht::make_subkey_put(key, opts_.name, std::vector<char>(text.begin(), text.end()),
                                  dht::expires_in(self_, 3 * a.progress_period));
  auto timeout = std::min(a.progress_period, a.average_timeout);
  dht::dht_store(self_, a.dht, std::move(put), timeout, [](const messages::dht_put_result&) {},
                 [](caf::error&) {});
  if (averaging_ || catching_up_)
    return;
  auto asked_at = steps_;
  dht::dht_get(
    self_, a.dht, key, timeout,
    [this, asked_at](const messages::dht_get_result& r) {
      if (averaging_ || catching_up_ || steps_ != asked_at)
        return;
      int64_t total = pending_samples_; // our own count is never stale
      uint64_t ahead = 0;
      for (auto& rec : r.records) {
        if (!rec.has_subkey || rec.subkey == opts_.name)
          continue;
        auto pr = parse_progress(rec.value);
        if (!pr)
          continue;
        if (pr->first == steps_)
          total += pr->second;
        else if (pr->first > steps_)
          ahead = std::max(ahead, pr->first);
      }
      // A peer at a later step finished this step's round without us (we were late, or
      // restarted): its parameters are the stage's, so take them and keep our gradients.
      if (ahead > steps_)
        catch_up(ahead);
      else if (total >= opts_.averaging.target_batch)
        start_round();
    },
    [](caf::error&) {});
}

/// Takes the step's gradient out and averages it with the stage's peers at the current step.
void stage_peer::start_round() {
  auto& a = opts_.averaging;
  averaging_ = true;
  avg_.rounds++;
  auto step = steps_;
  auto samples = pending_samples_;
  auto grad = kernels::flatten_gradients(params_);
  if (pending_micro_ > 0)
    grad.div_(static_cast<double>(pending_micro_));
  for (auto& p : params_)
    if (p.grad().defined())
      p.grad().zero_();
  round_samples_ = samples;
  pending_samples_ = 0;
  pending_micro_ = 0;
  messages::tensor_list tl;
  tl.tensors.push_back(tensor_msg{grad, kernels::codec_id::none, {}, {}});
  self_
    ->request(a.averager, a.average_timeout, average_atom::value,
              step_key(a.prefix, opts_.stage, step), std::move(tl),
              static_cast<double>(samples))
    .then(
      [this, step, samples, grad](messages::average_result& r) {
        using messages::round_outcome;
        auto out = r.report.outcome;
        bool usable = r.tensors.size() == 1 && r.tensors[0].ok() && r.tensors[0].tensor.defined()
                      && r.tensors[0].tensor.numel() == grad.numel();
        if (out == round_outcome::complete || out == round_outcome::partial) {
          if (usable) {
            avg_.averaged++;
            finish_round(step, r.tensors[0].tensor.to(torch::kFloat).reshape({-1}), false);
            return;
          }
          avg_.failed++;
        } else if (out == round_outcome::no_partner) {
          avg_.no_partner++;
        } else {
          avg_.failed++;
        }
        if (samples == 0)
          avg_.skipped++;
        finish_round(step, grad, samples == 0);
      },
      [this, step, samples, grad](caf::error&) {
        avg_.failed++;
        if (samples == 0)
          avg_.skipped++;
        finish_round(step, grad, samples == 0);
      });
}

/// Steps on `grad` (the mean gradient of the step, averaged or own) unless `skip`, keeping the
/// gradient accumulated meanwhile (backwards served during the round) for the next step.
void stage_peer::finish_round(uint64_t step, const torch::Tensor& grad, bool skip) {
  if (!skip) {
    auto meanwhile = kernels::flatten_gradients(params_);
    kernels::unflatten_gradients(grad, params_);
    kernels::clipped_step(*optim_, params_, opts_.optimizer);
    kernels::unflatten_gradients(meanwhile, params_);
  }
  steps_ = step + 1;
  averaging_ = false;
  round_samples_ = 0;
  changed();
}

/// Downloads the state (parameters, optimizer, step) of a stage peer at step `target` or later.
/// The gradients accumulated meanwhile stay: they count towards the next step (computed on
/// parameters one step old, the staleness of delayed averaging). No donor: retried next tick.
void stage_peer::catch_up(uint64_t target) {
  catching_up_ = true;
  fetch_stage_state(
    self_, board_, opts_.stage, opts_.timeout, target,
    [this](const stage_state& donor, size_t donors) {
      catching_up_ = false;
      if (!load(donor).ok())
        return; // kept its own state; tried again at the next tick
      avg_.caught_up++;
      dl_.downloads++;
      dl_.donors += donors;
    },
    [this](bool) { catching_up_ = false; }); // retried at the next tick
}

caf::behavior stage_actor(caf::stateful_actor<stage_peer>* self, stage_options opts,
                          caf::actor board) {
  if (auto err = self->state.init(std::move(opts), std::move(board))) {
    self->quit(std::move(err));
    return {};
  }
  return self->state.make_behavior();
}

} // namespace

std::string progress_key(const std::string& prefix, uint64_t stage) {
  return fmt::format("{}/stage{}/progress", prefix, stage);
}

std::string step_key(const std::string& prefix, uint64_t stage, uint64_t step) {
  return fmt::format("{}/stage{}/step{}", prefix, stage, step);
}

caf::actor spawn_stage(caf::actor_system& sys, stage_options opts, caf::actor board) {
  return sys.spawn(stage_actor, std::move(opts), std::move(board));
}

} // namespace starling::actors::stage
