#include "actors/stage/stage.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <type_traits>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/collab/coordinator.hpp"
#include "actors/collab/grad_accumulator.hpp"
#include "actors/collab/ledger_publisher.hpp"
#include "actors/collab/ledger_record.hpp"
#include "actors/collab/peer.hpp"
#include "actors/collab/settle.hpp"
#include "actors/collab/shell.hpp"
#include "actors/dht/client.hpp"
#include "actors/stage/checkpoint.hpp"
#include "actors/stage/device_queue.hpp"
#include "actors/stage/fetch_state.hpp"
#include "actors/stage/load_view.hpp"
#include "actors/stage/state_parts.hpp"
#include "actors/stage/torch_backend.hpp"
#include "kernels/flat.hpp"
#include "kernels/seeded_hash.hpp"
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

double seconds_of(caf::timespan t) {
  return std::chrono::duration<double>(t).count();
}

/// The coordinator's options for a stage peer's `averaging_options`. The stage keeps computing
/// while a round runs (delayed updates: backwards served meanwhile count towards the next step,
/// as before the coordinator) and keeps its gradients across a catch-up download: they are
/// confirmed samples its trainers count as done, dropping them would lose that work.
collab::coordinator_options core_options(const stage_options& o) {
  auto& a = o.averaging;
  auto period = seconds_of(a.progress_period);
  collab::coordinator_options c;
  c.progress.target_batch = a.target_batch > 0 ? static_cast<uint64_t>(a.target_batch) : 0;
  c.progress.min_refresh = period;
  c.progress.max_refresh = 4 * period;
  // A peer that died stops counting soon (its rate would otherwise be extrapolated); the core
  // keeps a live record alive every `record_lifetime / 2`.
  c.progress.record_lifetime = 4 * period;
  c.publish_interval = period;
  c.read_timeout = 2 * period;
  c.delay_updates = true;
  // Its samples come from trainers: when they stop sending, so does its rate.
  c.idle_after = 8 * period;
  c.step_on_failure = true;
  c.round_timeout = seconds_of(a.average_timeout);
  c.state_round_timeout = seconds_of(a.average_timeout);
  // `fetch_stage_state` may ask the board, the donors' parts and then their whole states.
  c.download_timeout = 4 * seconds_of(o.timeout);
  c.download_retry = seconds_of(o.retry_every);
  c.keep_gradients_on_download = true;
  c.average_state_every = a.average_state_every;
  c.resync_after_lone_step = a.resync_after_lone_step;
  c.lone_steps_when_deserted = true;
  return c;
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

/// The backend `opts` asks for.
result<std::unique_ptr<backend>> make_backend(const stage_options& opts) {
  if (opts.backend == compute_backend::cost_model) {
    auto models = opts.models ? opts.models : kernels::model_registry::builtins();
    auto depth = models->depth(opts.model);
    if (!depth)
      return depth.error();
    // The placeholder parameters' seed from the stage's blocks, equal on every peer of a stage
    // (as a real model's seeded initialization).
    auto init = kernels::splitmix64_mix(static_cast<uint64_t>(opts.begin) * 1000003ull
                                        + static_cast<uint64_t>(opts.end));
    return make_cost_model(opts.cost_model, *depth, opts.begin, opts.end, opts.seed, init);
  }
  torch_backend_options t;
  t.model = opts.model;
  t.models = opts.models;
  t.begin = opts.begin;
  t.end = opts.end;
  t.timer = opts.timer;
  t.modeled_forward_s = opts.modeled_forward_s;
  t.modeled_backward_factor = opts.modeled_backward_factor;
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
class stage_peer : public collab::peer_model {
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

  /// What a request's compute produced: its cost on the device and the reply.
  template <class T>
  using computed_reply = result<std::pair<compute_result, T>>;

  /// Queues a request on the device (a backward before waiting forwards with `backward_first`):
  /// `compute` runs when the request gets the device, on the parameters of that moment, and the
  /// reply leaves when its device time is over (at once when the device was free and that is
  /// now), or fails at once when the peer dies first. `batch`: its samples (for the estimate
  /// probes see while it waits).
  template <class T>
  caf::result<T> enqueue(time_point arrived, bool backward, int64_t batch,
                         std::function<computed_reply<T>()> compute);

  /// Gives the free device to the next waiting requests: computes each and answers those that
  /// complete at once; the next one that takes time is timed by its ticket.
  void serve_next();

  /// Keeps `deliver` under `ticket` until a `(tick_atom, ticket)` or `serve_next` runs it; `fail`
  /// answers the caller if the peer dies first.
  void park(uint64_t ticket, std::function<void()> deliver,
            std::function<void(const caf::error&)> fail);

  /// Device seconds (at the peer's speed) a request of `batch` samples is expected to need: the
  /// last measured forward or backward per sample.
  double estimate(bool backward, int64_t batch) const {
    return per_sample_s_[backward ? 1 : 0] * static_cast<double>(batch);
  }

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
  /// Tells the ledger publisher that a computed gradient of `batch` samples was lost.
  void ledger_lost(int64_t batch);

  // -- local stepping ---------------------------------------------------------------------------

  /// Averages parameters with a random sibling's (gossip): peers of a stage that step
  /// independently stay close without a synchronous round, and a failed partner costs nothing.
  void gossip();
  void average_with(const stage_state& other);

  /// Zeroes the accumulated gradient.
  void zero_gradients() {
    for (auto& p : params_)
      if (p.grad().defined())
        p.grad().zero_();
  }

  // -- collaborative stepping: the model the shell drives (actors/collab/peer.hpp) ------------

  /// Asks the DHT for the node's key (its progress records are owned and signed), then starts
  /// the core; without an answer the records are plain (sub-key = the peer's name).
  void join_collaboration();
  void start_core(std::string id, bool sign);
  collab::taken_gradient_ref take_gradient(uint64_t id, uint64_t samples) override;
  void step(uint64_t id, uint64_t step, const torch::Tensor& grad,
            collab::step_basis basis) override;
  result<torch::Tensor> state_vector() override;
  status load_state_vector(const torch::Tensor& v) override;
  void state_round_ended(uint64_t id, uint64_t step, bool resync, bool loaded) override;
  void discard_gradients() override;
  /// Downloads the state (parameters, optimizer, step) of a stage peer at the core's step or
  /// later from the stage's live peers (not the core's donor ids: the board knows them).
  void download(const collab::download_state& d) override;
  void wake_in(caf::timespan delay) override {
    self_->delayed_send(self_, delay, tick_atom::value);
  }
  /// The `(status_atom)` counters.
  std::vector<uint64_t> counters() const;
  /// Now on the core's clock.
  collab::seconds now() const { return collab::now_s(self_); }

  caf::event_based_actor* self_;
  stage_options opts_;
  caf::actor board_;
  std::unique_ptr<backend> dev_;
  std::unique_ptr<torch::optim::Optimizer> optim_;
  std::vector<torch::Tensor> params_;
  /// The model's buffers (running statistics): in the state and its averaging rounds.
  kernels::module_buffers buffers_;
  /// The device: one request at a time, backwards first (`backward_first`); queue ids are the
  /// tickets of the held replies.
  device_queue queue_;
  /// A request waiting for the device: `run` computes it (answering its device seconds, its
  /// real compute seconds and samples, or none after it answered an error) and `deliver` sends
  /// the computed reply.
  struct device_job {
    std::function<std::optional<std::array<double, 3>>()> run;
    std::function<void()> deliver;
  };
  /// Requests waiting for the device, by ticket.
  std::map<uint64_t, device_job> jobs_;
  /// Computed replies waiting for their device time to pass, by ticket.
  std::map<uint64_t, std::function<void()>> held_;
  /// Last measured device seconds per sample of a forward and of a backward.
  std::array<double, 2> per_sample_s_{0.0, 0.0};
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
  /// sum of microbatch means).
  int64_t pending_micro_ = 0;
  /// The collaborative optimizer's shell (collaborative stepping only; its core runs from when
  /// the peer serves).
  std::unique_ptr<collab::peer_shell> shell_;
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
  buffers_ = kernels::split_buffers(dev_->buffers());
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
    else if (auto st = collab::validate(core_options(opts_)); !st)
      why = "collaborative stepping: " + st.what();
    if (!why.empty())
      return caf::make_error(caf::sec::invalid_argument, why);
    collab::peer_shell_options so;
    so.dht = a.dht;
    so.averager = a.averager;
    so.progress_key = progress_key(a.prefix, opts_.stage);
    so.gradient_key = [prefix = a.prefix, stage = opts_.stage](uint64_t step) {
      return step_key(prefix, stage, step);
    };
    so.state_key = [prefix = a.prefix, stage = opts_.stage](uint64_t step) {
      return fmt::format("{}/stage{}/state{}", prefix, stage, step);
    };
    shell_ = std::make_unique<collab::peer_shell>(self_, this, std::move(so));
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
      report("downloaded", {{"step", static_cast<double>(steps_)},
                            {"donors", static_cast<double>(donors)}});
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
    // The core's timer (`wake_at`; a bare tick: held replies carry a ticket).
    [this](tick_atom) {
      if (shell_)
        shell_->timer();
    },
    // A progress read that showed nobody else, asked again.
    [this](collab::collab_reread_atom) {
      if (shell_)
        shell_->reread();
    },
    [this](tick_atom, uint64_t ticket) {
      auto i = held_.find(ticket);
      if (i == held_.end())
        return;
      auto deliver = std::move(i->second);
      held_.erase(i);
      deliver();
      serve_next();
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
    [this](status_atom) { return counters(); },
  };
}

// -- serving ------------------------------------------------------------------------------------

caf::result<tensor_msg> stage_peer::forward(const stage_forward& req) {
  if (draining_)
    return leaving();
  if (!req.input.ok())
    return caf::make_error(caf::sec::invalid_argument, "bad input: " + req.input.error);
  auto arrived = self_->clock().now();
  return enqueue<tensor_msg>(
    arrived, false, batch_of(req.input.tensor), [this, req]() -> computed_reply<tensor_msg> {
      auto r = dev_->forward(req.input.tensor, req.targets.tensor, req.seed);
      if (!r)
        return r.error();
      // The loss travels exactly; activations with the peer's codec.
      tensor_msg reply{r->output, dev_->is_last() ? kernels::codec_id::none : opts_.codec, {}, {}};
      return std::make_pair(*r, std::move(reply));
    });
}

caf::result<stage_backward_reply> stage_peer::backward(const stage_backward& req) {
  if (draining_)
    return leaving();
  if (!req.input.ok() || !req.grad_output.ok())
    return caf::make_error(caf::sec::invalid_argument, "bad input or gradient");
  auto arrived = self_->clock().now();
  return enqueue<stage_backward_reply>(
    arrived, true, batch_of(req.input.tensor),
    [this, req]() -> computed_reply<stage_backward_reply> {
      // The microbatch's gradient is computed apart from the accumulated (confirmed) ones and
      // held until the trainer confirms this attempt: a retried backward enters the optimizer
      // once.
      auto confirmed = kernels::flatten_gradients(params_);
      zero_gradients();
      auto r =
        dev_->backward(req.input.tensor, req.grad_output.tensor, req.targets.tensor, req.seed);
      uncommitted_grad held;
      held.grad = kernels::flatten_gradients(params_);
      (void)kernels::unflatten_gradients(confirmed, params_); // fits: taken from them
      if (!r)
        return r.error();
      auto batch = batch_of(req.input.tensor);
      samples_ += static_cast<uint64_t>(batch);
      held.batch = batch;
      stage_backward_reply reply;
      if (r->output.defined())
        reply.grad_input = tensor_msg{r->output, opts_.codec, {}, {}};
      if (dev_->is_last())
        reply.loss = r->loss;
      // Overdue once the reply left (after this request's device time) and a commit timeout
      // passed.
      held.deadline = self_->clock().now()
                      + std::chrono::duration_cast<caf::timespan>(
                        std::chrono::duration<double>(r->device_s / opts_.speed))
                      + opts_.commit_timeout;
      // A second delivery of the same attempt replaces the first: one gradient either way.
      uncommitted_[{req.microbatch_id, req.attempt}] = std::move(held);
      if (!expiring_) {
        expiring_ = true;
        self_->delayed_send(self_, opts_.commit_timeout, messages::commit_atom::value);
      }
      return std::make_pair(*r, std::move(reply));
    });
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
    ledger_lost(j->second.batch);
    j = uncommitted_.erase(j);
  }
  apply(g);
  commits_.applied++;
  if (opts_.ledger) {
    auto n = static_cast<double>(g.batch);
    self_->send(opts_.ledger, collab::ledger_add_atom::value, n, 0.0, 0.0, 0.0);
    if (opts_.stage == 0)
      self_->send(opts_.ledger, collab::ledger_credit_atom::value,
                  collab::trainer_credit_name(id), n);
  }
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
    // Confirmed: now the samples count for the core (`start_round` takes them out).
    pending_micro_++;
    if (shell_)
      shell_->samples_done(static_cast<uint64_t>(g.batch));
    return;
  }
  if (pending_samples_ < opts_.local_batch)
    return;
  // Gradients were summed over microbatches of mean losses: scale to a mean.
  auto micro = static_cast<double>(pending_samples_) / static_cast<double>(g.batch);
  for (auto& p : params_)
    if (p.grad().defined())
      p.grad().div_(micro);
  kernels::set_learning_rate(*optim_, kernels::scheduled_lr(opts_.optimizer, steps_));
  kernels::clipped_step(*optim_, params_, opts_.optimizer);
  optim_->zero_grad();
  pending_samples_ = 0;
  steps_++;
  changed();
  gossip();
}

void stage_peer::ledger_lost(int64_t batch) {
  if (opts_.ledger) {
    auto n = static_cast<double>(batch);
    self_->send(opts_.ledger, collab::ledger_add_atom::value, n, n, 0.0, 0.0);
  }
}

void stage_peer::expire_uncommitted() {
  auto now = self_->clock().now();
  for (auto i = uncommitted_.begin(); i != uncommitted_.end();) {
    if (i->second.deadline <= now) {
      commits_.lost++;
      ledger_lost(i->second.batch);
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
caf::result<T> stage_peer::enqueue(time_point arrived, bool backward, int64_t batch,
                                   std::function<computed_reply<T>()> compute) {
  auto ticket = next_ticket_++;
  queue_.push(ticket, arrived, estimate(backward, batch), backward && opts_.backward_first);
  // Computes the request that got the device: its cost, and the reply kept in `out`.
  auto run = [this, backward, batch, compute = std::move(compute)](
               std::optional<T>& out) -> result<std::array<double, 3>> {
    auto r = compute();
    if (!r)
      return r.error();
    auto device_s = r->first.device_s / opts_.speed;
    per_sample_s_[backward ? 1 : 0] = device_s / static_cast<double>(std::max<int64_t>(1, batch));
    out.emplace(std::move(r->second));
    return std::array<double, 3>{device_s, r->first.ran_s, r->first.samples};
  };
  if (!queue_.running() && queue_.queued() == 1) {
    // The device is free and nothing waits: compute now; answer now if that is all it takes.
    auto got = queue_.start();
    auto began = self_->clock().now();
    std::optional<T> out;
    auto cost = run(out);
    if (!cost) {
      queue_.computed(began, began, 0, 0);
      queue_.finish();
      return to_error(cost.error());
    }
    auto now = self_->clock().now();
    auto done = queue_.computed(began, now, (*cost)[0], (*cost)[1]);
    if (done <= now) {
      queue_.finish();
      meter_.add((*cost)[0], (*cost)[2]);
      return std::move(*out);
    }
    auto rp = self_->make_response_promise<T>();
    park(
      ticket,
      [this, rp, c = *cost, v = std::move(*out)]() mutable {
        queue_.finish();
        meter_.add(c[0], c[2]);
        rp.deliver(std::move(v));
      },
      [rp](const caf::error& e) mutable { rp.deliver(e); });
    self_->delayed_send(self_, done - now, tick_atom::value, got->id);
    return rp;
  }
  // The device is busy: the request waits for it and is computed when it gets it.
  auto rp = self_->make_response_promise<T>();
  auto out = std::make_shared<std::optional<T>>();
  device_job job;
  job.run = [rp, out, run = std::move(run)]() mutable -> std::optional<std::array<double, 3>> {
    auto cost = run(*out);
    if (!cost) {
      rp.deliver(to_error(cost.error()));
      return std::nullopt;
    }
    return *cost;
  };
  job.deliver = [rp, out]() mutable { rp.deliver(std::move(**out)); };
  jobs_.emplace(ticket, std::move(job));
  on_death_->emplace(ticket, [rp](const caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

void stage_peer::serve_next() {
  while (auto got = queue_.start()) {
    auto j = jobs_.find(got->id);
    if (j == jobs_.end()) {
      queue_.finish(); // cannot happen: every waiting request has its job
      continue;
    }
    auto job = std::move(j->second);
    jobs_.erase(j);
    auto began = self_->clock().now();
    auto cost = job.run();
    if (!cost) { // it answered its error
      on_death_->erase(got->id);
      queue_.computed(began, began, 0, 0);
      queue_.finish();
      continue;
    }
    auto now = self_->clock().now();
    auto done = queue_.computed(began, now, (*cost)[0], (*cost)[1]);
    auto deliver = [this, deaths = on_death_, id = got->id, c = *cost,
                    d = std::move(job.deliver)]() mutable {
      deaths->erase(id);
      queue_.finish();
      meter_.add(c[0], c[2]);
      d();
    };
    if (done <= now) {
      deliver();
      continue;
    }
    held_.emplace(got->id, std::move(deliver));
    self_->delayed_send(self_, done - now, tick_atom::value, got->id);
    return;
  }
}

void stage_peer::park(uint64_t ticket, std::function<void()> deliver,
                      std::function<void(const caf::error&)> fail) {
  auto deaths = on_death_;
  deaths->emplace(ticket, std::move(fail));
  held_.emplace(ticket, [deaths, ticket, f = std::move(deliver)] {
    deaths->erase(ticket);
    f();
  });
}

// -- state --------------------------------------------------------------------------------------

stage_state stage_peer::snapshot() const {
  stage_state s;
  s.params.tensor = kernels::flatten_parameters(params_);
  s.params.codec = kernels::codec_id::none;
  // Downloads and checkpoints carry lamb8's codes and scales, not its dequantized moments.
  if (auto m = kernels::save_optimizer_moments(*optim_, kernels::moments_form::compact); m.ok()) {
    if (m->packed.empty()) {
      s.moments.tensor = m->moments;
      s.moments.codec = kernels::codec_id::none;
    }
    s.packed_moments = std::move(m->packed);
    s.optimizer_steps = m->steps;
  }
  s.steps = steps_;
  s.samples = samples_;
  s.modeled.size = dev_->modeled_state_bytes();
  if (!buffers_.floats.empty()) {
    s.buffers.tensor = kernels::flatten_parameters(buffers_.floats);
    s.buffers.codec = kernels::codec_id::none;
  }
  if (!buffers_.integers.empty()) {
    s.int_buffers.tensor = kernels::flatten_integers(buffers_.integers);
    s.int_buffers.codec = kernels::codec_id::none;
  }
  return s;
}

/// Takes a donor's (untrusted) state: parameters, optimizer state and step, all or nothing.
status stage_peer::load(const stage_state& s) {
  if (!s.params.ok() || !s.params.tensor.defined())
    return fail(fmt::format("the state's parameters did not arrive: {}", s.params.error));
  if (!s.moments.ok())
    return fail(fmt::format("the state's optimizer moments did not arrive: {}", s.moments.error));
  if (!s.buffers.ok() || !s.int_buffers.ok())
    return fail(fmt::format("the state's buffers did not arrive: {}",
                            s.buffers.ok() ? s.int_buffers.error : s.buffers.error));
  torch::NoGradGuard guard;
  auto before = kernels::flatten_parameters(params_);
  auto floats_before = kernels::flatten_parameters(buffers_.floats);
  auto integers_before = kernels::flatten_integers(buffers_.integers);
  auto buffers = [](const messages::tensor_msg& m) {
    return m.tensor.defined() ? m.tensor.reshape({-1}) : torch::Tensor{};
  };
  // Buffers first: `load_buffers` checks everything before it writes.
  if (auto r = kernels::load_buffers(buffers_, buffers(s.buffers), buffers(s.int_buffers)); !r)
    return r;
  auto undo = [&] { // fits: taken from them
    (void)kernels::unflatten_parameters(before, params_);
    (void)kernels::load_buffers(buffers_, floats_before, integers_before);
  };
  if (auto r = kernels::unflatten_parameters(s.params.tensor, params_); !r.ok()) {
    undo();
    return r;
  }
  if (s.moments.tensor.defined() || !s.packed_moments.empty()) {
    auto r = kernels::load_optimizer_moments(
      *optim_, {s.moments.tensor, s.optimizer_steps, s.packed_moments});
    if (!r.ok()) {
      undo();
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
  // It stops counting for its stage at once (a tombstone over its progress record).
  if (shell_)
    shell_->leave();
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
  if (draining_ && held_.empty() && jobs_.empty() && uncommitted_.empty())
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
    std::map<std::string, double> values{{"bytes", static_cast<double>(bytes)},
                                         {"steps", static_cast<double>(steps)}};
    if (opts_.checkpoint.wall_times) {
      values["seconds"] = seconds;
      values["actor_seconds"] = in_actor_s;
    }
    report("checkpoint", std::move(values));
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
  if (collaborative(opts_))
    join_collaboration();
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
  auto board = opts_.gossip_board ? opts_.gossip_board : board_;
  self_->request(board, opts_.timeout, get_atom::value, opts_.stage)
    .then(
      [this](const std::vector<std::string>&, const std::vector<caf::actor>& peers) {
        std::vector<caf::actor> others;
        for (auto& p : peers)
          if (p.address() != self_->address())
            others.push_back(p);
        if (others.empty())
          return;
        std::uniform_int_distribution<size_t> pick{0, others.size() - 1};
        auto& partner = others[pick(rng_)];
        self_->request(opts_.view ? opts_.view(partner) : partner, opts_.timeout,
                       get_atom::value, state_atom::value)
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

void stage_peer::join_collaboration() {
  self_
    ->request(opts_.averaging.dht, std::max(opts_.averaging.progress_period, opts_.timeout),
              dht_key_atom::value)
    .then([this](const std::string& key) { start_core(collab::record_id(opts_.name, key), true); },
          [this](caf::error&) { start_core(opts_.name, false); });
}

void stage_peer::start_core(std::string id, bool sign) {
  // It joins at the step of the state it serves (downloaded, restored or its own).
  shell_->start(std::move(id), sign, core_options(opts_), steps_);
  // Confirmed before the core ran (or a slot's pending gradient taken up): they count too.
  if (pending_samples_ > 0)
    shell_->samples_done(static_cast<uint64_t>(pending_samples_));
}

collab::taken_gradient_ref stage_peer::take_gradient(uint64_t, uint64_t samples) {
  // The step's gradient is taken out (a mean over its microbatches); backwards confirmed while
  // a round runs accumulate towards the next step. The core counted the same samples:
  // `pending_samples_`.
  auto grad = kernels::flatten_gradients(params_);
  if (pending_micro_ > 0)
    grad.div_(static_cast<double>(pending_micro_));
  zero_gradients();
  pending_samples_ = 0;
  pending_micro_ = 0;
  return {grad, static_cast<double>(samples)};
}

void stage_peer::step(uint64_t, uint64_t step, const torch::Tensor& grad,
                      collab::step_basis basis) {
  // Clipped; the gradient accumulated meanwhile (backwards served during the round) stays.
  kernels::set_learning_rate(*optim_, kernels::scheduled_lr(opts_.optimizer, step));
  auto r = collab::step_on(params_, *optim_, opts_.optimizer.max_grad_norm, grad);
  if (!r)
    aout(self_) << opts_.name << ": step " << step << " not taken: " << r.error().what << "\n";
  // One line per step: what it stepped on (the run's record of every update, next to the
  // losses it is compared with).
  report("step", {{"step", static_cast<double>(step)},
                  {"averaged", basis != collab::step_basis::own ? 1.0 : 0.0},
                  {"partial", basis == collab::step_basis::partial ? 1.0 : 0.0},
                  {"grad_norm", r ? *r : -1.0}});
  steps_ = step + 1; // the core moved on either way
  if (opts_.ledger) {
    self_->send(opts_.ledger, collab::ledger_add_atom::value, 0.0, 0.0, 1.0,
                basis != collab::step_basis::own ? 1.0 : 0.0);
    self_->send(opts_.ledger, collab::ledger_gauge_atom::value, std::nan(""),
                static_cast<double>(step + 1));
  }
  changed();
}

result<torch::Tensor> stage_peer::state_vector() {
  return collab::state_vector(params_, *optim_, buffers_);
}

status stage_peer::load_state_vector(const torch::Tensor& v) {
  auto st = collab::load_state_vector(params_, *optim_, v, buffers_);
  if (!st)
    aout(self_) << opts_.name << ": averaged state not loaded: " << st.what() << "\n";
  else
    changed();
  return st;
}

void stage_peer::state_round_ended(uint64_t, uint64_t, bool, bool loaded) {
  if (loaded)
    report("state_loaded", {{"step", static_cast<double>(steps_)}});
}

void stage_peer::discard_gradients() {
  zero_gradients();
  pending_samples_ = 0;
  pending_micro_ = 0;
}

/// Downloads the state (parameters, optimizer, step) of a stage peer at the core's step or later
/// from the stage's live peers (not the core's donor ids: the board knows the stage's peers).
void stage_peer::download(const collab::download_state& d) {
  auto id = d.id;
  fetch_stage_state(
    self_, board_, opts_.stage, opts_.timeout, d.step,
    [this, id](const stage_state& donor, size_t donors) {
      if (!shell_->running() || shell_->abandoned(id))
        return;
      if (!load(donor).ok()) {
        shell_->download_failed(id);
        return;
      }
      dl_.downloads++;
      dl_.donors += donors;
      report("downloaded", {{"step", static_cast<double>(steps_)},
                            {"donors", static_cast<double>(donors)}});
      shell_->download_done(id, donor.steps);
    },
    [this, id](bool) {
      if (shell_->running() && !shell_->abandoned(id))
        shell_->download_failed(id);
    });
}

std::vector<uint64_t> stage_peer::counters() const {
  std::vector<uint64_t> v(st_count, 0);
  v[st_steps] = steps_;
  v[st_samples] = samples_;
  v[st_downloads] = dl_.downloads;
  v[st_donors] = dl_.donors;
  v[st_queued] = static_cast<uint64_t>(queue_.queued());
  if (auto* core = shell_ ? shell_->core() : nullptr) {
    auto& c = core->stats();
    v[st_rounds] = c.rounds;
    v[st_averaged] = c.rounds_averaged;
    v[st_no_partner] = shell_->no_partner();
    v[st_failed] = c.rounds_failed + c.rounds_timed_out - shell_->no_partner();
    v[st_skipped] = c.skipped_steps;
    v[st_caught_up] = c.downloads_done;
    v[st_samples_averaged] = c.samples_averaged;
    v[st_samples_alone] = c.samples_alone;
    v[st_samples_dropped] = c.samples_dropped;
    v[st_pending] = core->pending_samples();
    v[st_state_rounds] = c.state_rounds;
    v[st_state_rounds_loaded] = c.state_rounds_loaded;
  }
  return v;
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
