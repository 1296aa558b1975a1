#include "runtime/own_loop/collaborative_optimizer.hpp"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <sodium.h>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/collab/peer.hpp"
#include "actors/collab/shell.hpp"
#include "actors/collab/state_download.hpp"
#include "actors/dht/dht.hpp"
#include "actors/stage/state_parts.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "messages/swarm.hpp"
#include "runtime/config/config.hpp"
#include "runtime/node/node.hpp"

namespace starling::runtime::own_loop {

namespace {

namespace collab = actors::collab;
using ol_samples_atom = caf::atom_constant<caf::atom("ol_samples")>;
using ol_wake_atom = caf::atom_constant<caf::atom("ol_wake")>;
using ol_peers_atom = caf::atom_constant<caf::atom("ol_peers")>;
using ol_poll_atom = caf::atom_constant<caf::atom("ol_poll")>;

/// How often a peer waiting for others reads the collaboration's progress.
constexpr auto peers_poll = std::chrono::milliseconds(250);

caf::timespan span_s(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

/// Which optimizer's state travels, and how (two fp32 slots per parameter element).
enum class opt_kind : uint8_t { sgd, adam, adamw };

/// A change of the parameters the actor has for the user's thread, applied in order.
struct pending_op {
  enum kind_t : uint8_t { update, load_state, load_vector } kind = update;
  /// `update`: the flat mean gradient to step on; whether it is the collaboration's average;
  /// the step it completes.
  at::Tensor grad;
  bool together = false;
  uint64_t step = 0;
  /// `update` alone: why (`step_status::alone_reason`).
  std::string why;
  /// `load_state`: a downloaded state; `load_vector`: an averaged state vector.
  messages::stage_state state;
  at::Tensor vec;
};

/// What the user's thread and the actor share, behind `m`. The parameters and the optimizer are
/// touched by the user's thread, or by the actor while `lent` (the user's thread then waits on
/// `cv` inside `step()`, holding nothing).
struct exchange {
  std::mutex m;
  std::condition_variable cv;
  torch::optim::Optimizer* opt = nullptr;
  opt_kind kind = opt_kind::sgd;
  std::vector<torch::Tensor> params;
  int64_t numel = 0;
  /// The gradients added since the last take: per parameter, flat CPU fp32 sums of
  /// mean gradient x batch size.
  std::vector<torch::Tensor> acc;
  uint64_t acc_samples = 0;
  bool lent = false;
  bool paused = false;
  bool dead = false;
  /// The last samples message the actor processed.
  uint64_t acked = 0;
  std::deque<pending_op> ops;
  /// The state as it stands (parameters, moments, step counts, global step): what donors and
  /// state rounds get. Its tensors are replaced, never written in place.
  messages::stage_state snapshot;
  /// The global step of the parameters as they stand.
  uint64_t step = 0;
  /// Applied since the user's last `step()` returned.
  uint64_t new_together = 0, new_alone = 0, new_downloads = 0, new_state_rounds = 0;
  /// Why the last lone step applied since then was taken alone.
  std::string alone_reason;
  std::string apply_error;
  optimizer_stats stats;
};

std::string key_of(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

torch::Tensor flat_cpu(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, torch::kFloat).reshape({-1});
}

/// The optimizer's moments (2 x numel: first slot then second) and per-parameter step counts.
std::pair<torch::Tensor, std::vector<uint64_t>> moments_of(exchange& ex) {
  auto a = torch::zeros({ex.numel}, torch::kFloat);
  auto b = torch::zeros({ex.numel}, torch::kFloat);
  std::vector<uint64_t> steps(ex.params.size(), 0);
  auto& state = ex.opt->state();
  int64_t off = 0;
  for (size_t i = 0; i < ex.params.size(); ++i) {
    auto& p = ex.params[i];
    auto n = p.numel();
    auto it = state.find(key_of(p));
    if (it != state.end() && it->second) {
      auto* base = it->second.get();
      if (ex.kind == opt_kind::sgd) {
        auto& s = static_cast<torch::optim::SGDParamState&>(*base);
        if (s.momentum_buffer().defined()) {
          a.slice(0, off, off + n).copy_(flat_cpu(s.momentum_buffer()));
          steps[i] = 1;
        }
      } else if (ex.kind == opt_kind::adam) {
        auto& s = static_cast<torch::optim::AdamParamState&>(*base);
        a.slice(0, off, off + n).copy_(flat_cpu(s.exp_avg()));
        b.slice(0, off, off + n).copy_(flat_cpu(s.exp_avg_sq()));
        steps[i] = static_cast<uint64_t>(s.step());
      } else {
        auto& s = static_cast<torch::optim::AdamWParamState&>(*base);
        a.slice(0, off, off + n).copy_(flat_cpu(s.exp_avg()));
        b.slice(0, off, off + n).copy_(flat_cpu(s.exp_avg_sq()));
        steps[i] = static_cast<uint64_t>(s.step());
      }
    }
    off += n;
  }
  return {torch::cat({a, b}), std::move(steps)};
}

/// Loads parameters (flat), moments (2 x numel) and step counts into the model and optimizer.
void load_into(exchange& ex, const torch::Tensor& flat, const torch::Tensor& moments,
               const std::vector<uint64_t>& steps) {
  torch::NoGradGuard no_grad;
  auto& state = ex.opt->state();
  int64_t off = 0;
  for (size_t i = 0; i < ex.params.size(); ++i) {
    auto& p = ex.params[i];
    auto n = p.numel();
    auto shaped = [&](const torch::Tensor& v, int64_t at) {
      return v.slice(0, at, at + n).reshape(p.sizes()).to(p.device(), p.scalar_type()).clone();
    };
    p.copy_(shaped(flat, off));
    auto key = key_of(p);
    if (steps[i] == 0) {
      state.erase(key);
    } else if (ex.kind == opt_kind::sgd) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(shaped(moments, off));
      state[key] = std::move(s);
    } else if (ex.kind == opt_kind::adam) {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(static_cast<int64_t>(steps[i]));
      s->exp_avg(shaped(moments, off));
      s->exp_avg_sq(shaped(moments, ex.numel + off));
      state[key] = std::move(s);
    } else {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(static_cast<int64_t>(steps[i]));
      s->exp_avg(shaped(moments, off));
      s->exp_avg_sq(shaped(moments, ex.numel + off));
      state[key] = std::move(s);
    }
    off += n;
  }
}

void refresh_snapshot(exchange& ex) {
  std::vector<torch::Tensor> flat;
  for (auto& p : ex.params)
    flat.push_back(flat_cpu(p));
  auto [moments, steps] = moments_of(ex);
  messages::stage_state s;
  s.params.tensor = torch::cat(flat);
  s.moments.tensor = std::move(moments);
  s.optimizer_steps = std::move(steps);
  s.steps = ex.step;
  ex.snapshot = std::move(s);
}

void zero_grads(exchange& ex) {
  for (auto& p : ex.params)
    if (p.grad().defined())
      p.mutable_grad().zero_();
}

/// Applies the pending changes in order (with `m` held, by whichever thread holds the
/// parameters now) and refreshes the snapshot.
void drain(exchange& ex) {
  if (ex.ops.empty())
    return;
  while (!ex.ops.empty()) {
    auto op = std::move(ex.ops.front());
    ex.ops.pop_front();
    try {
      if (op.kind == pending_op::update) {
        int64_t off = 0;
        for (auto& p : ex.params) {
          auto n = p.numel();
          auto g = op.grad.slice(0, off, off + n).reshape(p.sizes());
          p.mutable_grad() = g.to(p.device(), p.scalar_type()).clone();
          off += n;
        }
        ex.opt->step();
        zero_grads(ex);
        ex.step = op.step + 1;
        (op.together ? ex.new_together : ex.new_alone)++;
        if (!op.together)
          ex.alone_reason = std::move(op.why);
        (op.together ? ex.stats.steps_together : ex.stats.steps_alone)++;
      } else if (op.kind == pending_op::load_state) {
        load_into(ex, op.state.params.tensor.to(torch::kFloat).reshape({-1}),
                  op.state.moments.tensor.to(torch::kFloat).reshape({-1}),
                  op.state.optimizer_steps);
        ex.step = op.state.steps;
        ex.new_downloads++;
        ex.stats.downloads++;
      } else {
        auto steps = ex.snapshot.optimizer_steps;
        load_into(ex, op.vec.slice(0, 0, ex.numel), op.vec.slice(0, ex.numel), steps);
        ex.new_state_rounds++;
        ex.stats.state_rounds_loaded++;
      }
    } catch (const std::exception& e) {
      ex.apply_error = e.what();
    }
  }
  ex.stats.global_step = ex.step;
  refresh_snapshot(ex);
}

// -- the actor -----------------------------------------------------------------------------------

struct peer_state {
  std::shared_ptr<exchange> ex;
  caf::actor resolver;
  caf::timespan rpc{};
  std::unique_ptr<collab::peer_shell> shell;
  std::unique_ptr<collab::peer_model> model;
  bool left = false;
  /// `wait_for_peers` callers: the peers each waits for.
  std::vector<std::pair<uint64_t, caf::response_promise>> waiting;
  bool polling = false;

  static inline const char* name = "own_loop_peer";
};

using peer_actor = caf::stateful_actor<peer_state>;

/// Whether `st` fits the wrapped model (a donor of another run or model is skipped).
bool fits(const exchange& ex, const messages::stage_state& st) {
  return st.wire_error.empty() && st.params.ok() && st.moments.ok() && st.params.tensor.defined()
         && st.moments.tensor.defined() && st.params.tensor.numel() == ex.numel
         && st.moments.tensor.numel() == 2 * ex.numel
         && st.optimizer_steps.size() == ex.params.size()
         && st.params.tensor.scalar_type() == torch::kFloat;
}

/// Downloads a state as the core says (`collab::fetch_state`: parts from several donors, whole
/// states in turn when a part fails); a state of another model counts as a donor's failure.
void download(peer_actor* self, const collab::download_state& d) {
  auto id = d.id;
  auto donors = std::make_shared<const std::vector<std::string>>(d.donors);
  collab::donor_source src;
  src.count = donors->size();
  src.resolve = [=](size_t i, std::function<void(caf::actor)> ok,
                    std::function<void(std::string)> failed) {
    self->request(self->state.resolver, self->state.rpc, resolve_atom::value,
                  collab::address_of_id((*donors)[i]))
      .then(
        [=](const caf::actor& a) {
          if (a)
            ok(a);
          else
            failed("resolved to nothing");
        },
        [=](caf::error& e) { failed(caf::to_string(e)); });
  };
  collab::download_options o;
  o.timeout = self->state.rpc * 4;
  o.min_steps = d.step;
  o.parts_fail_fast = false;
  o.whole = collab::whole_policy::in_turn;
  auto ex = self->state.ex;
  o.refuse = [ex](const messages::stage_state& st) {
    return fits(*ex, st) ? std::string{} : std::string{"a state of another model"};
  };
  o.cancelled = [=] { return !self->state.shell->running() || self->state.shell->abandoned(id); };
  collab::fetch_state(
    self, std::move(src), o,
    [=](collab::downloaded_state got) {
      auto& x = self->state;
      auto loaded = got.state.steps;
      {
        std::lock_guard<std::mutex> lk{x.ex->m};
        pending_op op;
        op.kind = pending_op::load_state;
        op.state = std::move(got.state);
        x.ex->ops.push_back(std::move(op));
        if (x.ex->lent)
          drain(*x.ex);
      }
      x.ex->cv.notify_all();
      x.shell->download_done(id, loaded);
    },
    [=](const std::string&) { self->state.shell->download_failed(id); });
}

/// The user's loop as the model the collaborative shell drives (actors/collab/peer.hpp).
class loop_model final : public collab::peer_model {
public:
  explicit loop_model(peer_actor* self) : self_(self) {}

  collab::taken_gradient_ref take_gradient(uint64_t, uint64_t) override {
    auto& ex = *self_->state.ex;
    std::lock_guard<std::mutex> lk{ex.m};
    auto weight = static_cast<double>(ex.acc_samples);
    auto mean = torch::cat(ex.acc);
    if (ex.acc_samples > 0)
      mean.div_(weight);
    for (auto& a : ex.acc)
      a.zero_();
    ex.acc_samples = 0;
    return {mean, weight};
  }

  void step(uint64_t id, uint64_t step, const torch::Tensor& grad,
            collab::step_basis basis) override {
    auto& ex = *self_->state.ex;
    auto why = answers_.extract(id);
    {
      std::lock_guard<std::mutex> lk{ex.m};
      if (!grad.defined()) {
        ex.apply_error = "no gradient kept for the step";
        return;
      }
      pending_op op;
      op.kind = pending_op::update;
      op.grad = grad;
      op.together = basis != collab::step_basis::own;
      op.step = step;
      if (!op.together)
        op.why = why ? std::move(why.mapped())
                     : "no answer from the averager (no round: no other peer seen; or the round "
                       "timed out)";
      ex.ops.push_back(std::move(op));
      if (ex.lent)
        drain(ex);
    }
    ex.cv.notify_all();
  }

  result<torch::Tensor> state_vector() override {
    auto& ex = *self_->state.ex;
    std::lock_guard<std::mutex> lk{ex.m};
    auto* core = self_->state.shell->core();
    if (!ex.ops.empty() || !core || ex.snapshot.steps != core->step())
      return fail("the parameters wait for the training thread to apply the last step");
    return torch::cat({ex.snapshot.params.tensor, ex.snapshot.moments.tensor});
  }

  status load_state_vector(const torch::Tensor& v) override {
    auto& ex = *self_->state.ex;
    {
      std::lock_guard<std::mutex> lk{ex.m};
      if (v.numel() != 3 * ex.numel)
        return fail(fmt::format("an averaged state of {} elements, expected {}", v.numel(),
                                3 * ex.numel));
      pending_op op;
      op.kind = pending_op::load_vector;
      op.vec = v.to(torch::kFloat).reshape({-1}).clone();
      ex.ops.push_back(std::move(op));
      if (ex.lent)
        drain(ex);
    }
    ex.cv.notify_all();
    return {};
  }

  void discard_gradients() override {
    auto& ex = *self_->state.ex;
    std::lock_guard<std::mutex> lk{ex.m};
    for (auto& a : ex.acc)
      a.zero_();
    ex.acc_samples = 0;
  }

  void pause() override { set_paused(true); }
  void resume() override { set_paused(false); }

  void skipped(uint64_t id) override { answers_.erase(id); }

  void answered(uint64_t id, const messages::average_result& res) override {
    // Kept for the step of gradient round `id` (state rounds' answers are erased unused: their
    // ids come from the same sequence and never step).
    auto& r = res.report;
    answers_[id] = fmt::format("{}{}{} (group of {})", messages::to_string(r.outcome),
                               r.detail.empty() ? "" : ": ", r.detail, r.members.size());
  }

  void state_round_ended(uint64_t id, uint64_t, bool, bool) override { answers_.erase(id); }

  void download(const collab::download_state& d) override { own_loop::download(self_, d); }

  void wake_in(caf::timespan delay) override {
    self_->delayed_send(self_, delay, ol_wake_atom::value);
  }

private:
  void set_paused(bool on) {
    auto& ex = *self_->state.ex;
    {
      std::lock_guard<std::mutex> lk{ex.m};
      ex.paused = on;
    }
    ex.cv.notify_all();
  }

  peer_actor* self_;
  /// What the averager answered per round id, until the round's step.
  std::map<uint64_t, std::string> answers_;
};

/// Peers of the core's last read, this one included, at any step.
uint64_t peers_seen(peer_actor* self) {
  auto* core = self->state.shell->core();
  if (!core)
    return 0;
  auto e = core->estimate(self->state.shell->now());
  return e.peers + e.behind + e.ahead.size();
}

/// Answers the `wait_for_peers` callers whose count is reached; reads again for the others.
void poll_peers(peer_actor* self) {
  auto& s = self->state;
  s.polling = false;
  auto seen = peers_seen(self);
  auto& w = s.waiting;
  for (auto i = w.begin(); i != w.end();) {
    if (seen >= i->first || s.left) {
      i->second.deliver(seen);
      i = w.erase(i);
    } else {
      ++i;
    }
  }
  if (w.empty() || s.left)
    return;
  s.shell->reread(); // fed to the core: it learns of the others as soon as they show
  s.polling = true;
  self->delayed_send(self, peers_poll, ol_poll_atom::value);
}

result<messages::stage_state> served_state(peer_actor* self) {
  auto& ex = *self->state.ex;
  std::lock_guard<std::mutex> lk{ex.m};
  if (!ex.snapshot.params.tensor.defined())
    return fail("no state yet");
  return ex.snapshot;
}

caf::behavior loop_peer(peer_actor* self, std::shared_ptr<exchange> ex,
                        collab::peer_shell_options so, caf::actor resolver, std::string id,
                        collab::coordinator_options co, caf::timespan rpc) {
  auto& s = self->state;
  s.ex = std::move(ex);
  s.resolver = std::move(resolver);
  s.rpc = rpc;
  s.model = std::make_unique<loop_model>(self);
  s.shell = std::make_unique<collab::peer_shell>(self, s.model.get(), std::move(so));
  self->set_exit_handler([=](const caf::exit_msg& m) {
    auto& st = self->state;
    if (m.reason == caf::exit_reason::user_shutdown && st.shell->running() && !st.left) {
      st.left = true;
      st.shell->leave();
    }
    self->quit(m.reason);
  });
  s.shell->start(std::move(id), true, std::move(co));
  return {
    [=](ol_samples_atom, uint64_t samples, uint64_t seq) {
      auto& st = self->state;
      if (!st.left)
        st.shell->samples_done(samples);
      {
        std::lock_guard<std::mutex> lk{st.ex->m};
        st.ex->acked = seq;
      }
      st.ex->cv.notify_all();
    },
    [=](ol_peers_atom, uint64_t n) -> caf::result<uint64_t> {
      auto& st = self->state;
      auto rp = self->make_response_promise<uint64_t>();
      st.waiting.emplace_back(n, rp);
      if (!st.polling)
        poll_peers(self);
      return rp;
    },
    [=](ol_poll_atom) { poll_peers(self); },
    [=](ol_wake_atom) {
      if (!self->state.left)
        self->state.shell->timer();
    },
    [=](collab::collab_reread_atom) {
      if (!self->state.left)
        self->state.shell->reread();
    },
    [=](get_atom, state_atom) -> caf::result<messages::stage_state> {
      auto st = served_state(self);
      if (!st)
        return caf::make_error(caf::sec::runtime_error, st.error().what);
      return std::move(*st);
    },
    [=](get_atom, state_atom, uint64_t part,
        uint64_t parts) -> caf::result<messages::stage_state_part> {
      auto st = served_state(self);
      if (!st)
        return caf::make_error(caf::sec::runtime_error, st.error().what);
      auto cut = actors::stage::cut_state_part(*st, actors::stage::state_digest(*st), part, parts);
      if (!cut)
        return caf::make_error(caf::sec::invalid_argument, cut.error().what);
      return std::move(*cut);
    },
  };
}

status check_endpoint(const std::string& what, const std::string& text, bool port0) {
  auto ep = parse_endpoint(text);
  if (!ep)
    return fail(fmt::format("{}: {}", what, ep.error().what));
  if (!port0 && ep->second == 0)
    return fail(fmt::format("{}: expected HOST:PORT with a port in [1, 65535], got \"{}\"", what,
                            text));
  return {};
}

} // namespace

const char* to_string(step_outcome o) {
  switch (o) {
  case step_outcome::accumulating:
    return "accumulating";
  case step_outcome::stepped_together:
    return "stepped together";
  case step_outcome::stepped_alone:
    return "stepped alone";
  case step_outcome::state_downloaded:
    return "state downloaded";
  case step_outcome::failed:
    return "failed";
  }
  return "?";
}

status validate(const options& o) {
  if (o.run.empty())
    return fail("run: a run needs a name (peers with the same name train together)");
  if (o.target_batch_size == 0)
    return fail("target_batch_size: must be at least 1 sample");
  if (auto st = check_endpoint("listen", o.listen, true); !st)
    return st;
  for (auto& b : o.bootstrap)
    if (auto st = check_endpoint("bootstrap", b, false); !st)
      return st;
  auto positive = [](const char* name, double v) -> status {
    if (!(v > 0) || !std::isfinite(v))
      return fail(fmt::format("{}: must be a positive number of seconds, got {}", name, v));
    return {};
  };
  for (auto [name, v] : {std::pair{"matchmaking_s", o.matchmaking_s},
                         std::pair{"averaging_timeout_s", o.averaging_timeout_s},
                         std::pair{"round_timeout_s", o.round_timeout_s},
                         std::pair{"download_timeout_s", o.download_timeout_s},
                         std::pair{"rpc_timeout_s", o.rpc_timeout_s}})
    if (auto st = positive(name, v); !st)
      return st;
  if (o.round_timeout_s <= o.matchmaking_s)
    return fail(fmt::format("round_timeout_s ({}) must exceed matchmaking_s ({})",
                            o.round_timeout_s, o.matchmaking_s));
  return {};
}

struct collaborative_optimizer::impl {
  options opts;
  std::shared_ptr<exchange> ex;
  std::unique_ptr<node> nd;
  caf::actor peer;
  caf::actor averager;
  caf::actor dht;
  uint64_t sent = 0;

  ~impl() {
    if (!nd)
      return;
    if (peer) {
      caf::scoped_actor self{nd->system()};
      self->monitor(peer);
      self->send_exit(peer, caf::exit_reason::user_shutdown);
      self->receive([](const caf::down_msg&) {},
                    caf::after(std::chrono::seconds(2)) >> [] {});
    }
    for (auto& a : {averager, dht})
      if (a)
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    nd->shutdown();
  }
};

collaborative_optimizer::collaborative_optimizer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

collaborative_optimizer::~collaborative_optimizer() = default;

result<std::unique_ptr<collaborative_optimizer>>
collaborative_optimizer::join(torch::optim::Optimizer& opt, const options& o) {
  try {
    if (auto st = validate(o); !st)
      return fail(st.what());
    auto ex = std::make_shared<exchange>();
    ex->opt = &opt;
    if (dynamic_cast<torch::optim::SGD*>(&opt)) {
      ex->kind = opt_kind::sgd;
    } else if (auto* adam = dynamic_cast<torch::optim::Adam*>(&opt)) {
      ex->kind = opt_kind::adam;
      for (auto& g : adam->param_groups())
        if (static_cast<torch::optim::AdamOptions&>(g.options()).amsgrad())
          return fail("Adam with amsgrad is not supported (its max_exp_avg_sq does not travel)");
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&opt)) {
      ex->kind = opt_kind::adamw;
      for (auto& g : adamw->param_groups())
        if (static_cast<torch::optim::AdamWOptions&>(g.options()).amsgrad())
          return fail("AdamW with amsgrad is not supported (its max_exp_avg_sq does not travel)");
    } else {
      return fail("unsupported optimizer: the collaborative optimizer wraps torch::optim::SGD, "
                  "Adam or AdamW (their state travels in downloads and state rounds)");
    }
    for (auto& g : opt.param_groups())
      for (auto& p : g.params()) {
        if (p.scalar_type() != torch::kFloat)
          return fail(fmt::format("parameter {} is {}, expected float32", ex->params.size(),
                                  c10::toString(p.scalar_type())));
        ex->params.push_back(p);
        ex->acc.push_back(torch::zeros({p.numel()}, torch::kFloat));
        ex->numel += p.numel();
      }
    if (ex->params.empty())
      return fail("the optimizer has no parameters");
    refresh_snapshot(*ex);

    auto p = std::make_unique<impl>();
    p->opts = o;
    p->ex = ex;
    caf_options caf_opts;
    node_options nopts;
    nopts.listen = o.listen;
    nopts.experiment = "own_loop/" + o.run;
    auto started = node::start(caf_opts, nopts, o.name);
    if (!started)
      return fail(fmt::format("cannot start the node on {}: {}", o.listen,
                              started.error().what));
    p->nd = std::move(*started);
    auto& nd = *p->nd;
    auto& sys = nd.system();
    // Reach the bootstrap peers first: a wrong address is an error now, not a lonely run.
    for (auto& b : o.bootstrap)
      if (auto dir = nd.join(b, [](const std::string&, const std::string&) {}); !dir)
        return fail(fmt::format("bootstrap {}: {}", b, dir.error().what));
    actors::dht::dht_options d;
    d.address = nd.endpoint() + "/dht";
    d.id = actors::dht::identity{nd.key().public_key(), nd.key().secret_key()};
    d.rpc_timeout = span_s(std::min(2.0, o.rpc_timeout_s));
    for (auto& b : o.bootstrap)
      d.bootstrap.push_back(b + "/dht");
    p->dht = actors::dht::spawn_dht(sys, nd.resolver(), d);
    nd.register_actor("dht", p->dht);

    actors::averager::averager_options ao;
    ao.address = nd.endpoint() + "/avg";
    ao.key_prefix = o.run + "/avg/";
    ao.matchmaking_window = span_s(o.matchmaking_s);
    ao.poll_interval = span_s(o.matchmaking_s / 8);
    ao.round_timeout = span_s(o.averaging_timeout_s);
    ao.rpc_timeout = span_s(std::min(2.0, o.rpc_timeout_s));
    ao.family_groups = o.persistent_groups;
    ao.persistent_groups = o.persistent_groups;
    if (auto data = nd.data_endpoint()) {
      ao.transport = data->link_layer();
    } else {
      auto ep = nd.endpoint();
      ao.data_host = ep.substr(0, ep.rfind(':'));
      ao.data_security = nd.link_security();
    }
    if (auto st = actors::averager::validate(ao); !st)
      return fail(fmt::format("averager: {}", st.what()));
    p->averager = actors::averager::spawn_averager(sys, p->dht, nd.resolver(), ao);
    nd.register_actor("avg", p->averager);

    // The progress records' sub-key: the peer's address and its node key's owner marker.
    std::string dht_key;
    {
      caf::scoped_actor self{sys};
      std::string why = "no answer";
      self->request(p->dht, std::chrono::seconds(5), dht_key_atom::value)
        .receive([&](const std::string& k) { dht_key = k; },
                 [&](caf::error& e) { why = sys.render(e); });
      if (dht_key.empty())
        return fail(fmt::format("the node's DHT did not give its key: {}", why));
    }
    auto address = nd.endpoint() + "/collab";

    collab::coordinator_options co;
    co.progress.target_batch = o.target_batch_size;
    co.round_timeout = o.round_timeout_s;
    co.state_round_timeout = o.round_timeout_s;
    co.download_timeout = o.download_timeout_s;
    co.read_timeout = o.rpc_timeout_s;
    co.average_state_every = o.average_state_every;
    if (auto st = collab::validate(co); !st)
      return fail(st.what());

    collab::peer_shell_options so;
    so.dht = p->dht;
    so.averager = p->averager;
    so.progress_key = o.run + "/progress";
    so.gradient_key = [run = o.run](uint64_t step) { return fmt::format("{}/grad/{}", run, step); };
    so.state_key = [run = o.run](uint64_t step) { return fmt::format("{}/state/{}", run, step); };
    so.min_members = 2; // a group of one is no average
    so.report_group = true;
    so.rpc_timeout = span_s(o.rpc_timeout_s);
    p->peer = sys.spawn(loop_peer, ex, std::move(so), nd.resolver(),
                        collab::record_id(address, dht_key), co, span_s(o.rpc_timeout_s));
    p->peer->attach_functor([ex](const caf::error&) {
      {
        std::lock_guard<std::mutex> lk{ex->m};
        ex->dead = true;
      }
      ex->cv.notify_all();
    });
    nd.register_actor("collab", p->peer);
    return std::unique_ptr<collaborative_optimizer>(new collaborative_optimizer(std::move(p)));
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot join the run: {}", e.what()));
  }
}

step_status collaborative_optimizer::step(uint64_t batch_size) noexcept {
  step_status out;
  try {
    auto& ex = *impl_->ex;
    auto& o = impl_->opts;
    std::unique_lock<std::mutex> lk{ex.m};
    if (ex.dead) {
      out.outcome = step_outcome::failed;
      out.error = "the collaboration's peer stopped";
      out.global_step = ex.step;
      return out;
    }
    uint64_t seq = 0;
    std::string error;
    if (batch_size > 0) {
      // The gradients of this batch (computed on the parameters as they stand) count first;
      // what the collaboration brought is applied after.
      bool finite = true;
      for (auto& p : ex.params)
        if (p.grad().defined() && !torch::isfinite(p.grad()).all().item<bool>())
          finite = false;
      if (!finite) {
        zero_grads(ex);
        error = "a gradient holds NaN or infinity: the batch was dropped";
      } else {
        for (size_t i = 0; i < ex.params.size(); ++i)
          if (ex.params[i].grad().defined())
            ex.acc[i].add_(flat_cpu(ex.params[i].grad()), static_cast<double>(batch_size));
        zero_grads(ex);
        ex.acc_samples += batch_size;
        ex.stats.samples += batch_size;
        seq = ++impl_->sent;
        caf::anon_send(impl_->peer, ol_samples_atom::value, batch_size, seq);
      }
    }
    // Lend the parameters while waiting: the actor applies what comes at once.
    auto t0 = std::chrono::steady_clock::now();
    ex.lent = true;
    drain(ex);
    if (seq > 0)
      ex.cv.wait_until(lk, t0 + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::duration<double>(o.rpc_timeout_s)),
                       [&] { return ex.acked >= seq || ex.dead; });
    if (ex.paused)
      ex.cv.wait_until(lk, t0 + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::duration<double>(o.round_timeout_s + 1)),
                       [&] { return !ex.paused || ex.dead; });
    ex.lent = false;
    drain(ex);
    out.global_step = ex.step;
    out.steps_taken = ex.new_together + ex.new_alone;
    out.state_averaged = ex.new_state_rounds > 0;
    if (ex.new_downloads > 0)
      out.outcome = step_outcome::state_downloaded;
    else if (ex.new_together > 0)
      out.outcome = step_outcome::stepped_together;
    else if (ex.new_alone > 0)
      out.outcome = step_outcome::stepped_alone;
    if (ex.new_alone > 0)
      out.alone_reason = std::move(ex.alone_reason);
    ex.alone_reason.clear();
    if (!ex.apply_error.empty())
      error = std::move(ex.apply_error);
    ex.apply_error.clear();
    ex.new_together = ex.new_alone = ex.new_downloads = ex.new_state_rounds = 0;
    if (!error.empty()) {
      out.outcome = step_outcome::failed;
      out.error = std::move(error);
    }
  } catch (const std::exception& e) {
    out.outcome = step_outcome::failed;
    out.error = e.what();
  } catch (...) {
    out.outcome = step_outcome::failed;
    out.error = "unknown error";
  }
  return out;
}

status collaborative_optimizer::wait_for_peers(size_t peers, double timeout_s) noexcept {
  try {
    if (!(timeout_s > 0))
      return fail(fmt::format("wait_for_peers: the timeout must be positive, got {}", timeout_s));
    auto& sys = impl_->nd->system();
    caf::scoped_actor self{sys};
    uint64_t seen = 0;
    std::string why;
    self
      ->request(impl_->peer,
                std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(timeout_s)),
                ol_peers_atom::value, static_cast<uint64_t>(peers))
      .receive([&](uint64_t n) { seen = n; }, [&](caf::error& e) { why = sys.render(e); });
    if (seen >= peers)
      return {};
    if (!why.empty())
      return fail(fmt::format("{} peers not seen within {} s ({})", peers, timeout_s, why));
    return fail(fmt::format("{} peers not seen: {} (this peer left)", peers, seen));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

uint64_t collaborative_optimizer::global_step() const noexcept {
  std::lock_guard<std::mutex> lk{impl_->ex->m};
  return impl_->ex->step;
}

optimizer_stats collaborative_optimizer::stats() const {
  std::lock_guard<std::mutex> lk{impl_->ex->m};
  return impl_->ex->stats;
}

std::string collaborative_optimizer::endpoint() const {
  return impl_->nd->endpoint();
}

std::string collaborative_optimizer::parameters_digest() const {
  auto& ex = *impl_->ex;
  std::lock_guard<std::mutex> lk{ex.m};
  crypto_generichash_state h;
  crypto_generichash_init(&h, nullptr, 0, 16);
  for (auto& p : ex.params) {
    auto c = flat_cpu(p).contiguous();
    crypto_generichash_update(&h, static_cast<const unsigned char*>(c.data_ptr()),
                              static_cast<unsigned long long>(c.numel()) * sizeof(float));
  }
  unsigned char out[16];
  crypto_generichash_final(&h, out, sizeof out);
  std::string hex;
  for (auto b : out)
    hex += fmt::format("{:02x}", b);
  return hex;
}

} // namespace starling::runtime::own_loop
