#include "actors/dp_peer/dp_peer.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/collab/ledger_record.hpp"
#include "actors/collab/peer.hpp"
#include "actors/collab/shell.hpp"
#include "actors/collab/state_download.hpp"
#include "actors/dht/client.hpp"
#include "actors/dp_peer/backend.hpp"
#include "actors/stage/state_parts.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "messages/metrics.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::dp_peer {

namespace {

using collab::now_s;
using collab::ns_of;
using collab::seconds;
using collab::span_of;
using dp_tick_atom = caf::atom_constant<caf::atom("dp_tick")>;
using dp_wake_atom = caf::atom_constant<caf::atom("dp_wake")>;
using dp_start_atom = caf::atom_constant<caf::atom("dp_start")>;
using dp_ledger_atom = caf::atom_constant<caf::atom("dp_ledger")>;
using dp_leave_atom = caf::atom_constant<caf::atom("dp_leave")>;

caf::timespan span_of(std::chrono::nanoseconds d) {
  return std::chrono::duration_cast<caf::timespan>(d);
}

const char* mode_name(collab::peer_mode m) {
  switch (m) {
  case collab::peer_mode::full:
    return "full";
  case collab::peer_mode::client:
    return "client";
  case collab::peer_mode::auxiliary:
    return "auxiliary";
  }
  return "?";
}

/// A gradient taken out for a round, with the microbatches in it.
struct taken_round {
  collab::taken_gradient g;
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t microbatches = 0;
  double loss = 0;
  caf::actor_clock::time_point started;
  /// What the averager said (group size, parts' smallest contributor count).
  double group = 1;
  double contributors = 1;
};

struct peer_state {
  /// Progress reads that showed nobody else yet (asked again while the DHT may bootstrap).
  collab::blind_reads blind;
  dp_peer_services svc;
  std::shared_ptr<backend> model;
  dp_peer_options opts;
  /// The sub-key of its records: its address, and its node key's owner marker when signing.
  std::string id;
  /// The collaborative optimizer's shell, and this peer as the model it drives (dp_model).
  std::unique_ptr<collab::peer_shell> shell;
  std::unique_ptr<collab::peer_model> as_model;
  bool paused = false;
  bool ticking = false;
  bool left = false;
  /// A graceful leave was asked: no new microbatch; the round in flight may finish until
  /// `leave_deadline`, then the peer leaves and answers `leave_rp`.
  bool leaving = false;
  caf::response_promise leave_rp;
  caf::actor_clock::time_point leave_deadline;
  uint64_t next_micro = 0;
  uint64_t pending_first = 0;
  double loss_sum = 0;
  uint64_t loss_count = 0;
  /// The model's side of each gradient taken out for a round (the shell keeps the tensor).
  std::map<uint64_t, taken_round> taken;
  /// Downloads of a peer that stepped alone, from peers at its step (`download_state::resync`).
  std::set<uint64_t> resync_downloads;
  std::map<std::string, caf::actor> handles;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t microbatches = 0;
  /// Samples computed in all (the ledger's claim of this peer).
  double samples_computed = 0;
  /// Credits this peer gave its round partners (the ledger's accepted samples of others).
  collab::credit_book credits;
  /// When the core started (DHT clock), for the ledger's uptime.
  double started_s = 0;
  /// Its latest step's mean training loss (NaN: none yet), for its ledger summary.
  double last_loss = std::nan("");
  /// DiLoCo: the outer step and the EF stream of this peer's pseudo-gradients.
  std::optional<collab::diloco_peer> diloco;

  static inline const char* name = "dp_peer";
};

using peer_actor = caf::stateful_actor<peer_state>;

std::string progress_key(const dp_peer_options& o) {
  return o.key_prefix + "/progress";
}

void metric(peer_actor* self, std::string kind, std::map<std::string, double> values,
            std::map<std::string, std::string> labels = {}) {
  auto& s = self->state;
  if (!s.svc.metrics)
    return;
  self->send(s.svc.metrics, messages::metric_event{s.opts.name, std::move(kind),
                                                   std::move(values), std::move(labels)});
}

/// The coordinator (null before the peer started).
collab::coordinator* core_of(peer_actor* self) {
  auto& s = self->state;
  return s.shell ? s.shell->core() : nullptr;
}

/// Carries out the core's effects (the shell does).
void carry(peer_actor* self, std::vector<collab::effect> es) {
  self->state.shell->carry(std::move(es));
}

void schedule_tick(peer_actor* self, bool fresh);

/// The handle of `address`, resolved once.
void with_handle(peer_actor* self, const std::string& address,
                 std::function<void(caf::actor)> ok, std::function<void(std::string)> err) {
  auto& s = self->state;
  if (auto i = s.handles.find(address); i != s.handles.end()) {
    ok(i->second);
    return;
  }
  self->request(s.svc.resolver, span_of(s.opts.rpc_timeout), resolve_atom::value, address)
    .then(
      [=](const caf::actor& a) {
        if (!a) {
          err("resolved to nothing");
          return;
        }
        self->state.handles[address] = a;
        ok(a);
      },
      [=](caf::error& e) { err(caf::to_string(e)); });
}

void forget_handle(peer_actor* self, const std::string& address) {
  self->state.handles.erase(address);
}

void maybe_evaluate(peer_actor* self) {
  auto& s = self->state;
  auto step = core_of(self)->step();
  if (s.opts.eval_every == 0 || step == 0 || step % s.opts.eval_every != 0)
    return;
  auto e = s.model->evaluate();
  if (!e)
    return;
  metric(self, "dp_eval",
         {{"step", static_cast<double>(step)},
          {"accuracy", e->accuracy},
          {"loss", e->loss},
          {"bytes_sent", static_cast<double>(s.bytes_sent)},
          {"bytes_received", static_cast<double>(s.bytes_received)}});
}

void report_step(peer_actor* self, uint64_t step, const taken_round& t, bool averaged) {
  auto& s = self->state;
  auto round_s = std::chrono::duration<double>(self->clock().now() - t.started).count();
  if (t.microbatches > 0)
    s.last_loss = t.loss / static_cast<double>(t.microbatches);
  metric(self, "dp_step",
         {{"step", static_cast<double>(step)},
          {"samples", static_cast<double>(t.g.samples)},
          {"averaged", averaged ? 1.0 : 0.0},
          {"group", t.group},
          {"contributors", t.contributors},
          {"first", static_cast<double>(t.first)},
          {"last", static_cast<double>(t.last)},
          {"microbatches", static_cast<double>(t.microbatches)},
          {"loss", t.microbatches > 0 ? t.loss / static_cast<double>(t.microbatches)
                                      : std::nan("")},
          {"bytes_sent", static_cast<double>(s.bytes_sent)},
          {"bytes_received", static_cast<double>(s.bytes_received)},
          {"round_s", round_s}});
}

/// A state round ended (loaded or not): one dp_state_round metric.
void report_state_round(peer_actor* self, uint64_t step, bool resync, bool loaded) {
  metric(self, "dp_state_round",
         {{"step", static_cast<double>(step)},
          {"resync", resync ? 1.0 : 0.0},
          {"loaded", loaded ? 1.0 : 0.0}});
}

/// Another peer asked for part `part` of `parts` of this peer's state (parts 0: the whole
/// state); `ok`: it was served. Donors become visible in the run's metrics, which is how a run
/// (and the cross-process test) sees that client-mode peers are never asked.
void report_serve(peer_actor* self, uint64_t part, uint64_t parts, bool ok) {
  auto step = core_of(self) ? core_of(self)->step() : 0;
  metric(self, "dp_serve",
         {{"step", static_cast<double>(step)},
          {"part", static_cast<double>(part)},
          {"parts", static_cast<double>(parts)},
          {"ok", ok ? 1.0 : 0.0}});
}

void report_dropped(peer_actor* self, uint64_t first, uint64_t microbatches, uint64_t samples) {
  if (microbatches == 0)
    return;
  metric(self, "dp_dropped",
         {{"first", static_cast<double>(first)},
          {"last", static_cast<double>(first + microbatches - 1)},
          {"samples", static_cast<double>(samples)}});
}

// -- DeDLOC rounds -------------------------------------------------------------------------------

/// DiLoCo with Top-k pseudo-gradients: gradient rounds are the averager's Top-k rounds.
bool topk_rounds(const dp_peer_options& o) {
  return o.algo == algorithm::diloco && o.diloco.codec == kernels::codec_id::topk;
}

/// Bytes that one averaging round moved for this member: its contribution to every other
/// reducer and the results back, plus what its own part received and sent as a reducer.
void count_round_bytes(peer_actor* self, const messages::round_report& r) {
  auto& s = self->state;
  if (r.members.size() < 2 || r.self >= r.members.size())
    return;
  auto b = s.opts.wire_bytes_per_element;
  int64_t own = 0, others = 0;
  for (auto& p : r.parts) {
    if (p.reducer == r.self)
      own += p.size;
    else
      others += p.size;
  }
  size_t senders = 0;
  for (auto& m : r.members)
    if (!m.auxiliary)
      senders++;
  bool aux = r.members[r.self].auxiliary;
  size_t other_senders = aux ? senders : senders - 1;
  double sent = (aux ? 0.0 : static_cast<double>(others) * b)
                + static_cast<double>(own) * b * static_cast<double>(other_senders);
  double received = static_cast<double>(own) * b * static_cast<double>(other_senders)
                    + (aux ? 0.0 : static_cast<double>(others) * b);
  s.bytes_sent += static_cast<uint64_t>(sent);
  s.bytes_received += static_cast<uint64_t>(received);
}

// -- state download ------------------------------------------------------------------------------

/// The `dp_download` metric of download `id`, which ends here.
void report_download(peer_actor* self, uint64_t id, uint64_t step, size_t donors, bool ok) {
  metric(self, "dp_download",
         {{"step", static_cast<double>(step)},
          {"donors", static_cast<double>(donors)},
          {"ok", ok ? 1.0 : 0.0},
          {"resync", self->state.resync_downloads.erase(id) > 0 ? 1.0 : 0.0}});
}

void finish_download(peer_actor* self, uint64_t id, const messages::stage_state& st,
                     size_t donors) {
  auto& s = self->state;
  if (!core_of(self) || s.shell->abandoned(id))
    return;
  auto ok = s.model->import_state(st);
  report_download(self, id, st.steps, donors, ok.ok());
  if (!ok) {
    carry(self, core_of(self)->download_failed(id, now_s(self)));
    return;
  }
  if (s.opts.algo == algorithm::diloco) {
    // The downloaded parameters are the collaboration's outer start.
    auto d = collab::diloco_peer::make(s.model->parameters(), s.opts.diloco);
    if (d)
      s.diloco.emplace(std::move(*d));
  }
  carry(self, core_of(self)->download_done(id, st.steps, now_s(self)));
}

/// Downloads a state as the core says (`collab::fetch_state`: part i of n from donor i; when
/// any part fails, whole states from one donor after another).
void download(peer_actor* self, const collab::download_state& d) {
  if (d.resync)
    self->state.resync_downloads.insert(d.id);
  auto id = d.id;
  auto parts_donors = std::min<size_t>(d.donors.size(), stage::max_state_parts);
  auto donors = std::make_shared<const std::vector<std::string>>(d.donors);
  collab::donor_source src;
  src.count = donors->size();
  src.resolve = [=](size_t i, std::function<void(caf::actor)> ok,
                    std::function<void(std::string)> failed) {
    with_handle(self, collab::address_of_id((*donors)[i]), std::move(ok), std::move(failed));
  };
  src.forget = [=](size_t i) { forget_handle(self, collab::address_of_id((*donors)[i])); };
  collab::download_options o;
  o.timeout = span_of(self->state.opts.rpc_timeout * 4);
  o.min_steps = d.step;
  o.parts_fail_fast = false;
  o.whole = collab::whole_policy::in_turn;
  o.cancelled = [=] { return !core_of(self) || self->state.shell->abandoned(id); };
  collab::fetch_state(
    self, std::move(src), o,
    [=](collab::downloaded_state got) { finish_download(self, id, got.state, got.donors); },
    [=](const std::string&) {
      report_download(self, id, 0, parts_donors, false);
      carry(self, core_of(self)->download_failed(id, now_s(self)));
    });
}

// -- effects -------------------------------------------------------------------------------------

void apply_update(peer_actor* self, uint64_t id, uint64_t step, const torch::Tensor& grad,
                  bool averaged) {
  auto& s = self->state;
  auto it = s.taken.find(id);
  if (it == s.taken.end())
    return;
  auto& t = it->second;
  status st;
  if (s.opts.algo == algorithm::diloco) {
    // Averaged: the same Top-k average on every member of the round (or a partial one, own
    // contribution where a part was lost); alone: the own dense pseudo-gradient.
    if (averaged && grad.defined())
      st = s.diloco->outer_step(grad);
    else
      st = s.diloco->outer_step(s.diloco->pseudo_gradient());
  } else if (!grad.defined()) {
    st = fail("no averaged gradient kept");
  } else {
    st = s.model->apply(grad);
  }
  if (!st)
    metric(self, "dp_error", {{"step", static_cast<double>(step)}}, {{"what", st.what()}});
  report_step(self, step, t, averaged && st.ok());
  s.taken.erase(it);
  maybe_evaluate(self);
}

/// What this DiLoCo peer hands the averager: its pseudo-gradient compressed with the codec and
/// its error feedback (Top-k: sparse, carried as Top-k parts), decoded to a flat fp32 vector.
torch::Tensor diloco_contribution(peer_actor* self, uint64_t step_samples) {
  auto& s = self->state;
  auto w = s.diloco->outgoing();
  auto dense = w ? collab::decode_wire(*w, s.diloco->start().numel())
                 : result<torch::Tensor>{fail(w.error().what)};
  if (dense)
    return std::move(*dense);
  metric(self, "dp_error", {{"samples", static_cast<double>(step_samples)}},
         {{"what", "DiLoCo contribution: " + dense.error().what}});
  return s.diloco->pseudo_gradient(); // uncompressed: no worse than the lone step it replaces
}

/// Takes the step's accumulated gradient (and its microbatch range and loss) out under `id`;
/// later microbatches accumulate towards the next step.
void take_out(peer_actor* self, uint64_t id, uint64_t samples) {
  auto& s = self->state;
  auto& t = s.taken[id];
  if (s.opts.algo == algorithm::diloco && s.opts.collab.mode != collab::peer_mode::auxiliary)
    (void)s.model->inner_step(); // the remainder since the last inner step
  t.g = s.model->take();
  if (s.opts.algo == algorithm::diloco) {
    t.g.samples = samples; // the weight: every sample since the last outer step
    if (s.opts.collab.mode != collab::peer_mode::auxiliary)
      t.g.mean = diloco_contribution(self, samples);
  }
  t.first = s.pending_first;
  t.microbatches = s.next_micro - s.pending_first;
  t.last = t.microbatches > 0 ? s.next_micro - 1 : s.pending_first;
  t.loss = s.loss_sum;
  t.started = self->clock().now();
  s.pending_first = s.next_micro;
  s.loss_sum = 0;
  s.loss_count = 0;
}

/// The data-parallel peer as the model the collaborative shell drives (actors/collab/peer.hpp).
class dp_model final : public collab::peer_model {
public:
  explicit dp_model(peer_actor* self) : self_(self) {}

  collab::taken_gradient_ref take_gradient(uint64_t id, uint64_t samples) override {
    take_out(self_, id, samples);
    auto& g = self_->state.taken[id].g;
    return {g.mean, static_cast<double>(g.samples)};
  }

  void step(uint64_t id, uint64_t step, const torch::Tensor& grad,
            collab::step_basis basis) override {
    apply_update(self_, id, step, grad, basis != collab::step_basis::own);
  }

  void skipped(uint64_t id) override {
    auto& s = self_->state;
    if (auto it = s.taken.find(id); it != s.taken.end()) {
      report_dropped(self_, it->second.first, it->second.microbatches, it->second.g.samples);
      s.taken.erase(it);
    }
  }

  result<torch::Tensor> state_vector() override { return self_->state.model->state_vector(); }

  status load_state_vector(const torch::Tensor& v) override {
    return self_->state.model->load_state_vector(v);
  }

  void state_round_ended(uint64_t, uint64_t step, bool resync, bool loaded) override {
    report_state_round(self_, step, resync, loaded);
  }

  void discard_gradients() override {
    auto& s = self_->state;
    auto samples = s.model->accumulated();
    report_dropped(self_, s.pending_first, s.next_micro - s.pending_first, samples);
    s.model->discard();
    s.pending_first = s.next_micro;
    s.loss_sum = 0;
    s.loss_count = 0;
  }

  void pause() override { self_->state.paused = true; }

  void resume() override {
    self_->state.paused = false;
    schedule_tick(self_, true);
  }

  void download(const collab::download_state& d) override { dp_peer::download(self_, d); }

  void download_abandoned(uint64_t id) override { self_->state.resync_downloads.erase(id); }

  void wake_in(caf::timespan delay) override {
    self_->delayed_send(self_, delay, dp_wake_atom::value);
  }

  void answered(uint64_t id, const messages::average_result& res) override {
    auto& s = self_->state;
    auto it = s.taken.find(id);
    if (it != s.taken.end() && topk_rounds(s.opts)) {
      // Top-k rounds count what the averager moved (packed nonzeros).
      s.bytes_sent += res.report.topk_bytes_sent;
      s.bytes_received += res.report.topk_bytes_received;
    } else {
      count_round_bytes(self_, res.report);
    }
    if (it == s.taken.end())
      return; // a state round
    auto& rep = res.report;
    credit_partners(rep);
    it->second.group = static_cast<double>(rep.members.size());
    size_t least = rep.members.size();
    for (auto& p : rep.parts)
      if (p.size > 0)
        least = std::min(least, p.status == messages::part_status::averaged
                                  ? p.contributors.size()
                                  : size_t{1});
    it->second.contributors = static_cast<double>(least);
  }

private:
  /// Credits the members whose whole contribution reached this peer's part (the rule of
  /// actors/collab/ledger_record.hpp), in its book and as one `dp_credit` metric.
  void credit_partners(const messages::round_report& rep) {
    auto n = rep.members.size();
    if (n < 2 || rep.self >= n || rep.received.size() != n)
      return;
    std::vector<int64_t> sizes(n, 0);
    for (auto& p : rep.parts)
      if (p.reducer < n)
        sizes[p.reducer] += p.size;
    auto credits = collab::round_credits(sizes, rep.received, rep.self);
    std::map<std::string, double> values;
    for (size_t m = 0; m < n; ++m) {
      if (!(credits[m] > 0))
        continue;
      auto peer = collab::peer_of_member(rep.members[m].address);
      self_->state.credits.add(peer, credits[m]);
      values[peer] += credits[m];
    }
    if (!values.empty())
      metric(self_, "dp_credit", std::move(values));
  }

  peer_actor* self_;
};

// -- ledger --------------------------------------------------------------------------------------

/// Stores this peer's contribution summary (signed when its records are) under its shard.
void publish_summary(peer_actor* self, bool left) {
  auto& s = self->state;
  auto* core = core_of(self);
  if (!core || s.opts.ledger_experiment.empty() || s.opts.ledger_every.count() <= 0)
    return;
  auto now = now_s(self);
  auto& c = core->stats();
  collab::contribution_summary sum;
  sum.id = s.id;
  sum.name = s.opts.name;
  sum.time = now;
  sum.started = s.started_s;
  sum.computed = s.samples_computed;
  sum.dropped = std::min(static_cast<double>(c.samples_dropped), s.samples_computed);
  sum.rounds = static_cast<double>(c.rounds);
  sum.rounds_averaged = static_cast<double>(std::min(c.rounds_averaged, c.rounds));
  sum.bytes_sent = static_cast<double>(s.bytes_sent);
  sum.bytes_received = static_cast<double>(s.bytes_received);
  sum.left = left;
  sum.credits = s.credits.list();
  sum.credits_other = s.credits.other();
  sum.token_id = s.opts.token_id;
  if (!std::isnan(s.last_loss))
    sum.loss = s.last_loss;
  sum.step = static_cast<double>(core->step());
  auto lifetime = 4 * std::chrono::duration<double>(s.opts.ledger_every).count();
  auto key = collab::ledger_key(s.opts.ledger_experiment, collab::ledger_shard(s.id));
  auto put = dht::make_subkey_put(std::move(key), s.id, collab::encode_summary(sum),
                                  ns_of(now + lifetime), s.opts.sign_records);
  dht::dht_store(
    self, s.svc.dht, std::move(put), span_of(s.opts.rpc_timeout),
    [](const messages::dht_put_result&) {}, [](caf::error&) {});
}

// -- compute -------------------------------------------------------------------------------------

caf::timespan microbatch_delay(peer_actor* self, caf::timespan measured) {
  auto& o = self->state.opts;
  auto base = std::max<caf::timespan>(span_of(o.compute_time), measured);
  auto target = std::chrono::duration_cast<caf::timespan>(
    std::chrono::duration<double, std::nano>(static_cast<double>(base.count()) / o.speed));
  return std::max(caf::timespan{0}, target - measured);
}

void schedule_tick(peer_actor* self, bool fresh) {
  auto& s = self->state;
  if (s.ticking || s.left || s.opts.collab.mode == collab::peer_mode::auxiliary)
    return;
  s.ticking = true;
  (void)fresh;
  self->delayed_send(self, microbatch_delay(self, caf::timespan{0}), dp_tick_atom::value);
}

void on_tick(peer_actor* self) {
  auto& s = self->state;
  s.ticking = false;
  if (s.paused || s.left || s.leaving || !core_of(self))
    return;
  auto t0 = self->clock().now();
  auto index = s.next_micro;
  auto r = s.model->compute(index);
  auto measured = std::chrono::duration_cast<caf::timespan>(self->clock().now() - t0);
  if (!r) {
    metric(self, "dp_error", {{"microbatch", static_cast<double>(index)}},
           {{"what", r.error().what}});
  } else {
    s.next_micro++;
    s.microbatches++;
    s.samples_computed += static_cast<double>(r->samples);
    if (std::isfinite(r->loss)) {
      s.loss_sum += r->loss;
      s.loss_count++;
    }
    if (s.opts.algo == algorithm::diloco && s.model->accumulated() >= s.opts.inner_batch)
      (void)s.model->inner_step();
    s.shell->samples_done(r->samples);
  }
  if (s.paused || s.left || s.ticking)
    return;
  s.ticking = true;
  self->delayed_send(self, microbatch_delay(self, measured), dp_tick_atom::value);
}

void start_core(peer_actor* self) {
  auto& s = self->state;
  if (s.opts.algo == algorithm::diloco) {
    auto d = collab::diloco_peer::make(s.model->parameters(), s.opts.diloco);
    if (!d) {
      metric(self, "dp_error", {}, {{"what", d.error().what}});
      self->quit(caf::sec::invalid_argument);
      return;
    }
    s.diloco.emplace(std::move(*d));
  }
  metric(self, "dp_join",
         {{"generation", static_cast<double>(s.opts.generation)},
          {"numel", static_cast<double>(s.model->numel())}},
         {{"mode", mode_name(s.opts.collab.mode)}, {"algorithm", to_string(s.opts.algo)}});
  s.shell->start(s.id, s.opts.sign_records, s.opts.collab);
  s.started_s = now_s(self);
  if (!s.opts.ledger_experiment.empty() && s.opts.ledger_every.count() > 0)
    self->delayed_send(self, span_of(s.opts.ledger_every), dp_ledger_atom::value);
  schedule_tick(self, true);
}

std::vector<uint64_t> counters(peer_actor* self) {
  auto& s = self->state;
  std::vector<uint64_t> v(st_count, 0);
  if (auto* core = core_of(self)) {
    auto& c = core->stats();
    v[st_step] = core_of(self)->step();
    v[st_samples_reported] = c.samples_reported;
    v[st_samples_averaged] = c.samples_averaged;
    v[st_samples_alone] = c.samples_alone;
    v[st_samples_dropped] = c.samples_dropped;
    v[st_pending] = core_of(self)->pending_samples();
    v[st_in_flight] = core_of(self)->round_samples();
    v[st_rounds] = c.rounds;
    v[st_rounds_averaged] = c.rounds_averaged;
    v[st_downloads_done] = c.downloads_done;
  }
  v[st_bytes_sent] = s.bytes_sent;
  v[st_bytes_received] = s.bytes_received;
  v[st_microbatches] = s.microbatches;
  return v;
}

result<messages::stage_state> own_state(peer_actor* self) {
  auto& s = self->state;
  auto step = core_of(self) ? core_of(self)->step() : 0;
  auto st = s.model->export_state(step);
  if (st && s.opts.algo == algorithm::diloco && s.diloco)
    st->params.tensor = s.diloco->start().clone(); // the outer start, common to the peers
  return st;
}

caf::behavior dp_peer_actor(peer_actor* self, dp_peer_services svc, std::shared_ptr<backend> model,
                            dp_peer_options opts) {
  auto& s = self->state;
  s.svc = std::move(svc);
  s.model = std::move(model);
  s.opts = std::move(opts);
  s.as_model = std::make_unique<dp_model>(self);
  collab::peer_shell_options so;
  so.dht = s.svc.dht;
  so.averager = s.svc.averager;
  so.progress_key = progress_key(s.opts);
  so.gradient_key = [prefix = s.opts.key_prefix](uint64_t step) {
    return fmt::format("{}/grad/{}", prefix, step);
  };
  so.state_key = [prefix = s.opts.key_prefix](uint64_t step) {
    return fmt::format("{}/state/{}", prefix, step);
  };
  so.min_members = 2; // a group of one is no average for a data-parallel peer
  so.report_group = true;
  so.auxiliary = s.opts.collab.mode == collab::peer_mode::auxiliary;
  so.rpc_timeout = span_of(s.opts.rpc_timeout);
  if (topk_rounds(s.opts)) {
    so.topk_ratio = s.opts.diloco.codec_params.ratio;
    so.topk_error_feedback = s.opts.diloco.error_feedback;
  }
  s.shell = std::make_unique<collab::peer_shell>(self, s.as_model.get(), std::move(so));
  self->set_exit_handler([=](const caf::exit_msg& m) {
    auto& st = self->state;
    if (m.reason == caf::exit_reason::user_shutdown && core_of(self) && !st.left) {
      st.left = true;
      st.shell->leave();
      metric(self, "dp_leave", {{"step", static_cast<double>(core_of(self)->step())}});
      report_dropped(self, st.pending_first, st.next_micro - st.pending_first,
                     st.model->accumulated());
      publish_summary(self, true);
    }
    self->quit(m.reason);
  });
  self->send(self, dp_start_atom::value);
  return {
    [=](dp_start_atom) {
      auto& st = self->state;
      if (!st.opts.sign_records) {
        st.id = st.opts.address;
        start_core(self);
        return;
      }
      self->request(st.svc.dht, span_of(st.opts.rpc_timeout), dht_key_atom::value)
        .then(
          [=](const std::string& key) {
            auto& x = self->state;
            x.id = collab::record_id(x.opts.address, key);
            start_core(self);
          },
          [=](caf::error&) {
            self->delayed_send(self, std::chrono::seconds(1), dp_start_atom::value);
          });
    },
    [=](dp_tick_atom) { on_tick(self); },
    [=](stop_atom) {
      auto& st = self->state;
      auto rp = self->make_response_promise();
      if (st.left || st.leaving) {
        rp.deliver(uint32_t{0});
        return;
      }
      st.leaving = true;
      st.leave_rp = rp;
      st.leave_deadline = self->clock().now() + span_of(st.opts.collab.round_timeout);
      self->send(self, dp_leave_atom::value);
    },
    [=](dp_leave_atom) {
      auto& st = self->state;
      auto* core = core_of(self);
      auto phase = core ? core->phase() : collab::coordinator_phase::idle;
      if ((phase == collab::coordinator_phase::averaging
           || phase == collab::coordinator_phase::state_averaging)
          && self->clock().now() < st.leave_deadline) {
        self->delayed_send(self, std::chrono::milliseconds(50), dp_leave_atom::value);
        return;
      }
      st.left = true;
      if (core) {
        metric(self, "dp_leave", {{"step", static_cast<double>(core->step())}});
        report_dropped(self, st.pending_first, st.next_micro - st.pending_first,
                       st.model->accumulated());
        publish_summary(self, true);
      }
      st.shell->leave([=](uint32_t stored) {
        self->state.leave_rp.deliver(stored);
        self->quit(caf::exit_reason::user_shutdown);
      });
    },
    [=](dp_ledger_atom) {
      auto& st = self->state;
      if (st.left)
        return;
      publish_summary(self, false);
      self->delayed_send(self, span_of(st.opts.ledger_every), dp_ledger_atom::value);
    },
    [=](collab::collab_reread_atom) {
      if (core_of(self) && !self->state.left)
        self->state.shell->reread();
    },
    [=](dp_wake_atom) {
      auto& st = self->state;
      if (core_of(self) && !st.left)
        st.shell->timer();
    },
    [=](get_atom, state_atom) -> caf::result<messages::stage_state> {
      auto& st = self->state;
      if (st.opts.collab.mode == collab::peer_mode::auxiliary) {
        report_serve(self, 0, 0, false);
        return caf::make_error(caf::sec::runtime_error, "an auxiliary peer holds no state");
      }
      auto w = own_state(self);
      report_serve(self, 0, 0, w.ok());
      if (!w)
        return caf::make_error(caf::sec::runtime_error, w.error().what);
      return std::move(*w);
    },
    [=](get_atom, state_atom, uint64_t part,
        uint64_t parts) -> caf::result<messages::stage_state_part> {
      auto& st = self->state;
      if (st.opts.collab.mode != collab::peer_mode::full) {
        report_serve(self, part, parts, false);
        return caf::make_error(caf::sec::runtime_error, "only full-mode peers serve their state");
      }
      auto w = own_state(self);
      if (!w) {
        report_serve(self, part, parts, false);
        return caf::make_error(caf::sec::runtime_error, w.error().what);
      }
      auto cut = stage::cut_state_part(*w, stage::state_digest(*w), part, parts);
      report_serve(self, part, parts, cut.ok());
      if (!cut)
        return caf::make_error(caf::sec::invalid_argument, cut.error().what);
      return std::move(*cut);
    },
    [=](status_atom) { return counters(self); },
  };
}

} // namespace

const char* to_string(algorithm a) {
  return a == algorithm::diloco ? "diloco" : "dedloc";
}

status validate(const dp_peer_options& o) {
  if (o.address.empty())
    return fail("a peer needs its address");
  if (auto st = collab::validate(o.collab); !st)
    return st;
  if (!(o.speed > 0) || !std::isfinite(o.speed))
    return fail(fmt::format("speed must be a positive number, got {}", o.speed));
  if (o.compute_time < std::chrono::nanoseconds{0})
    return fail("compute_time must not be negative");
  if (o.algo == algorithm::diloco) {
    if (o.inner_batch == 0)
      return fail("inner_batch must be at least 1 sample");
    if (auto st = collab::validate(o.diloco); !st)
      return st;
    if (o.collab.delay_updates)
      return fail("delayed updates belong to DeDLOC: DiLoCo's outer step replaces the parameters "
                  "that inner steps would move while it is averaged");
  }
  if (!(o.wire_bytes_per_element > 0))
    return fail("wire_bytes_per_element must be positive");
  return {};
}

caf::actor spawn_dp_peer(caf::actor_system& sys, dp_peer_services services,
                         std::shared_ptr<backend> model, dp_peer_options opts) {
  return sys.spawn(dp_peer_actor, std::move(services), std::move(model), std::move(opts));
}

} // namespace starling::actors::dp_peer
