#include "actors/dp_peer/dp_peer.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/collab/peer.hpp"
#include "actors/collab/shell.hpp"
#include "actors/collab/state_download.hpp"
#include "actors/dht/client.hpp"
#include "actors/dp_peer/backend.hpp"
#include "actors/stage/state_parts.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "messages/collab.hpp"
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
using dp_gather_atom = caf::atom_constant<caf::atom("dp_gather")>;
using dp_start_atom = caf::atom_constant<caf::atom("dp_start")>;

caf::timespan span_of(std::chrono::nanoseconds d) {
  return std::chrono::duration_cast<caf::timespan>(d);
}

/// How long DiLoCo members gather under a round's key before they pick its reducer.
constexpr seconds diloco_window = 2.0;

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

messages::wire_tensor_msg to_msg(const collab::wire_tensor& w) {
  messages::wire_tensor_msg m;
  m.dtype = static_cast<uint8_t>(w.header.dtype);
  m.shape = w.header.shape;
  m.codec = static_cast<uint8_t>(w.header.codec);
  m.ratio = w.header.params.ratio;
  m.k = w.header.params.k;
  m.seed = w.header.params.seed;
  m.block_size = w.header.params.block_size;
  m.sample_size = w.header.params.sample_size;
  m.index_bits = w.header.params.index_bits;
  m.chunk_bytes = w.header.params.chunk_bytes;
  m.bytes.assign(w.bytes.begin(), w.bytes.end());
  return m;
}

collab::wire_tensor from_msg(const messages::wire_tensor_msg& m) {
  // Out-of-range enums are caught by `decode_wire`'s header validation.
  collab::wire_tensor w;
  w.header.dtype = static_cast<kernels::wire_dtype>(m.dtype);
  w.header.shape = m.shape;
  w.header.codec = static_cast<kernels::codec_id>(m.codec);
  w.header.params.ratio = m.ratio;
  w.header.params.k = m.k;
  w.header.params.seed = m.seed;
  w.header.params.block_size = m.block_size;
  w.header.params.sample_size = m.sample_size;
  w.header.params.index_bits = m.index_bits;
  w.header.params.chunk_bytes = m.chunk_bytes;
  w.bytes.assign(m.bytes.begin(), m.bytes.end());
  return w;
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
  /// DiLoCo: the round's compressed average.
  std::optional<collab::wire_tensor> wire;
};

/// A DiLoCo round this peer reduces.
struct reducer_round {
  uint64_t round_id = 0;
  uint64_t step = 0;
  /// Members expected to contribute (this peer included when it contributes).
  size_t expected = 0;
  size_t added = 0;
  /// Contributors waiting for the result.
  std::vector<caf::response_promise> waiting;
  bool finished = false;
};

/// Contributions that came before this peer decided on a round.
struct early_contribution {
  messages::diloco_contribution c;
  caf::response_promise rp;
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
  // DiLoCo
  std::optional<collab::diloco_peer> diloco;
  std::optional<collab::diloco_reducer> reducer;
  std::map<std::string, reducer_round> reducing;
  std::map<std::string, std::vector<early_contribution>> early;
  std::set<std::string> not_reducing;

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

/// Whether the core still waits for gradient round `id`.
bool round_live(peer_actor* self, uint64_t id) {
  auto& s = self->state;
  return s.shell && s.shell->round_live(id) && s.taken.count(id) > 0;
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

void report_dropped(peer_actor* self, uint64_t first, uint64_t microbatches, uint64_t samples) {
  if (microbatches == 0)
    return;
  metric(self, "dp_dropped",
         {{"first", static_cast<double>(first)},
          {"last", static_cast<double>(first + microbatches - 1)},
          {"samples", static_cast<double>(samples)}});
}

// -- DeDLOC rounds -------------------------------------------------------------------------------

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

// -- DiLoCo rounds -------------------------------------------------------------------------------

std::string diloco_key(const dp_peer_options& o, uint64_t step) {
  return fmt::format("{}/diloco/{}", o.key_prefix, step);
}

void finish_reduction(peer_actor* self, const std::string& round) {
  auto& s = self->state;
  auto it = s.reducing.find(round);
  if (it == s.reducing.end() || it->second.finished)
    return;
  auto& rr = it->second;
  rr.finished = true;
  auto& red = *s.reducer;
  bool own = s.opts.collab.mode != collab::peer_mode::auxiliary;
  auto recipients = rr.waiting.size();
  if (red.contributions() == 0) {
    for (auto& rp : rr.waiting)
      rp.deliver(caf::make_error(caf::sec::runtime_error, "no contribution reached the reducer"));
    if (core_of(self) && own)
      carry(self, core_of(self)->round_failed(rr.round_id, now_s(self)));
    return;
  }
  auto w = red.finish(std::max<size_t>(recipients, 1));
  if (!w) {
    for (auto& rp : rr.waiting)
      rp.deliver(caf::make_error(caf::sec::runtime_error, w.error().what));
    if (core_of(self))
      carry(self, core_of(self)->round_failed(rr.round_id, now_s(self)));
    return;
  }
  auto msg = to_msg(*w);
  for (auto& rp : rr.waiting) {
    s.bytes_sent += w->size();
    rp.deliver(msg);
  }
  rr.waiting.clear();
  auto t = s.taken.find(rr.round_id);
  if (!core_of(self) || t == s.taken.end() || !round_live(self, rr.round_id))
    return;
  t->second.wire = *w;
  t->second.group = static_cast<double>(rr.expected);
  t->second.contributors = static_cast<double>(rr.added);
  carry(self, core_of(self)->round_done(rr.round_id, now_s(self), rr.expected));
}

void add_contribution(peer_actor* self, const std::string& round,
                      const messages::diloco_contribution& c, caf::response_promise rp) {
  auto& s = self->state;
  auto& rr = s.reducing[round];
  if (rr.finished) {
    rp.deliver(caf::make_error(caf::sec::runtime_error, "the round was already reduced"));
    return;
  }
  auto w = from_msg(c.delta);
  if (auto st = s.reducer->add(w, c.weight); !st) {
    rp.deliver(caf::make_error(caf::sec::invalid_argument, st.what()));
    return;
  }
  s.bytes_received += w.size();
  rr.added++;
  rr.waiting.push_back(std::move(rp));
  if (rr.added >= rr.expected)
    finish_reduction(self, round);
}

/// The round's members have gathered under its key: pick the reducer and send to it (or reduce).
void diloco_gathered(peer_actor* self, uint64_t id, uint64_t step,
                     const std::vector<messages::dht_record>& records) {
  auto& s = self->state;
  auto t = s.taken.find(id);
  if (!core_of(self) || t == s.taken.end() || !round_live(self, id))
    return;
  auto round = diloco_key(s.opts, step);
  std::string reducer;
  size_t contributors = 0;
  std::set<std::string> seen;
  auto consider = [&](const std::string& address, char mode) {
    if (!seen.insert(address).second)
      return;
    if (mode != 'a')
      contributors++;
    if (mode != 'c' && (reducer.empty() || address < reducer))
      reducer = address;
  };
  consider(s.opts.address, s.opts.collab.mode == collab::peer_mode::client      ? 'c'
                           : s.opts.collab.mode == collab::peer_mode::auxiliary ? 'a'
                                                                                : 'f');
  for (auto& r : records)
    if (r.has_subkey && r.value.size() == 1)
      consider(r.subkey, r.value[0]);
  bool contributes = s.opts.collab.mode != collab::peer_mode::auxiliary;
  if (reducer.empty() || contributors < 2) {
    // Alone (or nobody may reduce): no exchange.
    carry(self, core_of(self)->round_failed(id, now_s(self)));
    return;
  }
  if (reducer == s.opts.address) {
    auto& rr = s.reducing[round];
    rr.round_id = id;
    rr.step = step;
    rr.expected = contributors;
    if (contributes && t->second.g.samples > 0
        && s.reducer->add(*t->second.wire, static_cast<double>(t->second.g.samples)).ok())
      rr.added++;
    else if (contributes)
      rr.expected--; // nothing of its own to add
    auto early = std::move(s.early[round]);
    s.early.erase(round);
    for (auto& e : early)
      add_contribution(self, round, e.c, std::move(e.rp));
    if (rr.added >= rr.expected)
      finish_reduction(self, round);
    else
      self->delayed_send(self, span_of(s.opts.collab.round_timeout / 2), dp_gather_atom::value,
                         round);
    return;
  }
  // Someone else reduces: contributions sent here early go back with an error.
  s.not_reducing.insert(round);
  for (auto& e : s.early[round])
    e.rp.deliver(caf::make_error(caf::sec::runtime_error, "not this round's reducer"));
  s.early.erase(round);
  if (!contributes || t->second.g.samples == 0) {
    carry(self, core_of(self)->round_failed(id, now_s(self)));
    return;
  }
  messages::diloco_contribution c;
  c.round = round;
  c.sender = s.opts.address;
  c.weight = static_cast<double>(t->second.g.samples);
  c.delta = to_msg(*t->second.wire);
  auto sent = t->second.wire->size();
  auto timeout = span_of(s.opts.collab.round_timeout);
  with_handle(
    self, reducer,
    [=](caf::actor a) {
      self->state.bytes_sent += sent;
      self->request(a, timeout, c)
        .then(
          [=](messages::wire_tensor_msg& m) {
            auto& st = self->state;
            auto it = st.taken.find(id);
            if (!core_of(self) || it == st.taken.end() || !round_live(self, id))
              return;
            auto w = from_msg(m);
            st.bytes_received += w.size();
            it->second.wire = std::move(w);
            it->second.group = static_cast<double>(contributors);
            it->second.contributors = static_cast<double>(contributors);
            carry(self, core_of(self)->round_done(id, now_s(self), contributors));
          },
          [=](caf::error&) {
            forget_handle(self, reducer);
            auto& st = self->state;
            auto it = st.taken.find(id);
            if (core_of(self) && it != st.taken.end() && round_live(self, id))
              carry(self, core_of(self)->round_failed(id, now_s(self)));
          });
    },
    [=](std::string) {
      auto& st = self->state;
      auto it = st.taken.find(id);
      if (core_of(self) && it != st.taken.end() && round_live(self, id))
        carry(self, core_of(self)->round_failed(id, now_s(self)));
    });
}

void start_diloco_round(peer_actor* self, const collab::start_round& r) {
  auto& s = self->state;
  auto& t = s.taken[r.id];
  if (s.opts.collab.mode != collab::peer_mode::auxiliary) {
    auto out = s.diloco->outgoing();
    if (!out) {
      carry(self, core_of(self)->round_failed(r.id, now_s(self)));
      return;
    }
    t.wire = std::move(*out);
  }
  auto round = diloco_key(s.opts, r.step);
  char mode = s.opts.collab.mode == collab::peer_mode::client      ? 'c'
              : s.opts.collab.mode == collab::peer_mode::auxiliary ? 'a'
                                                                   : 'f';
  auto put = dht::make_subkey_put(round, s.opts.address, std::vector<char>{mode},
                                  ns_of(now_s(self) + 4 * diloco_window + 60));
  dht::dht_store(
    self, s.svc.dht, std::move(put), span_of(s.opts.rpc_timeout),
    [](const messages::dht_put_result&) {}, [](caf::error&) {});
  auto id = r.id;
  auto step = r.step;
  self->delayed_send(self, span_of(diloco_window), dp_gather_atom::value, id, step);
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
    if (averaged && t.wire)
      st = s.diloco->outer_step(*t.wire);
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

/// Takes the step's accumulated gradient (and its microbatch range and loss) out under `id`;
/// later microbatches accumulate towards the next step.
void take_out(peer_actor* self, uint64_t id, uint64_t samples) {
  auto& s = self->state;
  auto& t = s.taken[id];
  if (s.opts.algo == algorithm::diloco && s.opts.collab.mode != collab::peer_mode::auxiliary)
    (void)s.model->inner_step(); // the remainder since the last inner step
  t.g = s.model->take();
  if (s.opts.algo == algorithm::diloco)
    t.g.samples = samples; // the weight: every sample since the last outer step
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
    count_round_bytes(self_, res.report);
    auto& s = self_->state;
    auto it = s.taken.find(id);
    if (it == s.taken.end())
      return; // a state round
    auto& rep = res.report;
    it->second.group = static_cast<double>(rep.members.size());
    size_t least = rep.members.size();
    for (auto& p : rep.parts)
      if (p.size > 0)
        least = std::min(least, p.status == messages::part_status::averaged
                                  ? p.contributors.size()
                                  : size_t{1});
    it->second.contributors = static_cast<double>(least);
  }

  bool run_round(const collab::start_round& r) override {
    if (self_->state.opts.algo != algorithm::diloco)
      return false;
    start_diloco_round(self_, r);
    return true;
  }

private:
  peer_actor* self_;
};

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
  if (s.paused || s.left || !core_of(self))
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
    s.reducer.emplace(s.model->numel(), s.opts.diloco.codec, s.opts.diloco.codec_params,
                      s.opts.diloco.error_feedback);
  }
  metric(self, "dp_join",
         {{"generation", static_cast<double>(s.opts.generation)},
          {"numel", static_cast<double>(s.model->numel())}},
         {{"mode", mode_name(s.opts.collab.mode)}, {"algorithm", to_string(s.opts.algo)}});
  s.shell->start(s.id, s.opts.sign_records, s.opts.collab);
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
  s.shell = std::make_unique<collab::peer_shell>(self, s.as_model.get(), std::move(so));
  self->set_exit_handler([=](const caf::exit_msg& m) {
    auto& st = self->state;
    if (m.reason == caf::exit_reason::user_shutdown && core_of(self) && !st.left) {
      st.left = true;
      st.shell->leave();
      metric(self, "dp_leave", {{"step", static_cast<double>(core_of(self)->step())}});
      report_dropped(self, st.pending_first, st.next_micro - st.pending_first,
                     st.model->accumulated());
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
    [=](collab::collab_reread_atom) {
      if (core_of(self) && !self->state.left)
        self->state.shell->reread();
    },
    [=](dp_wake_atom) {
      auto& st = self->state;
      if (core_of(self) && !st.left)
        st.shell->timer();
    },
    [=](dp_gather_atom, uint64_t id, uint64_t step) {
      auto& st = self->state;
      auto t = st.taken.find(id);
      if (!core_of(self) || t == st.taken.end() || !round_live(self, id))
        return;
      dht::dht_get(
        self, st.svc.dht, diloco_key(st.opts, step), span_of(st.opts.rpc_timeout),
        [=](const messages::dht_get_result& r) { diloco_gathered(self, id, step, r.records); },
        [=](caf::error&) { diloco_gathered(self, id, step, {}); });
    },
    [=](dp_gather_atom, const std::string& round) { finish_reduction(self, round); },
    [=](messages::diloco_contribution& c) -> caf::result<messages::wire_tensor_msg> {
      auto& st = self->state;
      auto rp = self->make_response_promise<messages::wire_tensor_msg>();
      if (st.opts.algo != algorithm::diloco || !st.reducer
          || st.opts.collab.mode == collab::peer_mode::client || st.not_reducing.count(c.round)) {
        rp.deliver(caf::make_error(caf::sec::runtime_error, "not this round's reducer"));
        return rp;
      }
      if (st.reducing.count(c.round) > 0) {
        add_contribution(self, c.round, c, rp);
        return rp;
      }
      // Not decided on this round yet: keep it until this peer gathers (or gives up).
      st.early[c.round].push_back({c, rp});
      return rp;
    },
    [=](get_atom, state_atom) -> caf::result<messages::stage_state> {
      auto& st = self->state;
      if (st.opts.collab.mode == collab::peer_mode::auxiliary)
        return caf::make_error(caf::sec::runtime_error, "an auxiliary peer holds no state");
      auto w = own_state(self);
      if (!w)
        return caf::make_error(caf::sec::runtime_error, w.error().what);
      return std::move(*w);
    },
    [=](get_atom, state_atom, uint64_t part,
        uint64_t parts) -> caf::result<messages::stage_state_part> {
      auto& st = self->state;
      if (st.opts.collab.mode != collab::peer_mode::full)
        return caf::make_error(caf::sec::runtime_error, "only full-mode peers serve their state");
      auto w = own_state(self);
      if (!w)
        return caf::make_error(caf::sec::runtime_error, w.error().what);
      auto cut = stage::cut_state_part(*w, stage::state_digest(*w), part, parts);
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
