#include "runtime/experiment/watch.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/collab/ledger_record.hpp"
#include "actors/collab/shell.hpp"
#include "actors/dht/client.hpp"
#include "actors/dht/signing.hpp"
#include "runtime/config/config.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/log/log.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/observe/http_server.hpp"
#include "runtime/observe/snapshot.hpp"

namespace starling::runtime {

/// The builder and the store the handlers read. The builder is fed by the metric stream (under
/// the hub's lock) and by the ledger reader (an actor): `mtx` orders the two.
struct run_watch::state {
  explicit state(observe::run_description run) : builder(std::move(run)) {}
  std::mutex mtx;
  observe::snapshot_builder builder;
  std::shared_ptr<observe::snapshot_store> store = std::make_shared<observe::snapshot_store>();
  std::chrono::steady_clock::time_point last_publish{};
  std::string experiment;
  /// The serving node's gate (none in local and simulated runs).
  std::shared_ptr<node_gate> gate;

  /// Call with `mtx` held.
  void publish() {
    last_publish = std::chrono::steady_clock::now();
    read_gate();
    store->publish(builder.make());
  }

  /// Call with `mtx` held.
  void read_gate();
};

namespace {

/// What `gate` refused so far, as the snapshot builder takes it.
observe::gate_refusals gate_view(node_gate& gate) {
  namespace auth = actors::auth;
  observe::gate_refusals out;
  auto counts = gate.admission().refusals();
  for (size_t i = 0; i < auth::reason_count; ++i) {
    auto r = static_cast<auth::reason>(i);
    if (counts.of(r) > 0)
      out.by_reason[std::string{auth::to_string(r)}] = counts.of(r);
  }
  auto tally = gate.admission().refused_peers();
  for (auto& [id, p] : tally.peers()) {
    observe::gate_refused_peer x;
    // The ledger's rows name the owner key of their records by its first 16 hex digits.
    x.peer_id = auth::to_hex(p.peer_key).substr(0, 16);
    x.refusals = p.counts.total();
    x.ban_reason = p.ban_reason;
    if (!x.peer_id.empty())
      out.peers.push_back(std::move(x));
  }
  return out;
}

} // namespace

void run_watch::state::read_gate() {
  if (gate)
    builder.set_gate_refusals(gate_view(*gate));
}

namespace {

/// Writes `<out_dir>/ledger.csv` when the ledger has rows.
void write_ledger(const std::string& out_dir, const std::vector<observe::ledger_row>& rows) {
  if (out_dir.empty() || rows.empty())
    return;
  auto path = out_dir + "/ledger.csv";
  std::ofstream out{path};
  out << observe::render_ledger_csv(rows);
  if (!out)
    log(log_level::warning, "ledger", "cannot write {}", path);
}

/// Publishes a snapshot at most every 200 ms of wall time, from the stream and the ticks (a
/// simulated run ticks once per virtual second, which can be thousands of times a second of
/// wall time), and always at the end.
class watch_reporter : public reporter {
public:
  explicit watch_reporter(std::shared_ptr<run_watch::state> st) : st_(std::move(st)) {}

  void start(const run_info& info) override {
    out_dir_ = info.out_dir;
    std::lock_guard<std::mutex> guard{st_->mtx};
    st_->builder.set_pictures_dir(info.out_dir);
  }

  void on_metric(const metric_record& m) override {
    std::lock_guard<std::mutex> guard{st_->mtx};
    st_->builder.add({m.t, m.node, m.source, m.kind, m.values, m.labels});
    if (std::chrono::steady_clock::now() - st_->last_publish >= std::chrono::milliseconds(200))
      st_->publish();
  }

  bool tick(double t) override {
    std::lock_guard<std::mutex> guard{st_->mtx};
    st_->builder.advance(t);
    if (std::chrono::steady_clock::now() - st_->last_publish >= std::chrono::milliseconds(200))
      st_->publish();
    return false;
  }

  int finish(finish_context& ctx) override {
    std::lock_guard<std::mutex> guard{st_->mtx};
    st_->builder.advance(ctx.run_s);
    st_->builder.finish();
    st_->publish(); // reads the gate: the rows below have its refusals
    write_ledger(out_dir_, st_->builder.ledger_rows());
    return 0;
  }

  void on_late_metric(const metric_record& m) override {
    std::lock_guard<std::mutex> guard{st_->mtx};
    st_->builder.add({m.t, m.node, m.source, m.kind, m.values, m.labels});
  }

  void close() override {
    // The file again, with the events that came while the reporters finished and the roles
    // stopped (their last rounds and credits).
    std::lock_guard<std::mutex> guard{st_->mtx};
    st_->publish();
    write_ledger(out_dir_, st_->builder.ledger_rows());
  }

private:
  std::shared_ptr<run_watch::state> st_;
  std::string out_dir_;
};

/// The ledger of a run nobody watches: the metric stream only. Written when the reporters
/// finish, and again once every metric is in (`close`).
class ledger_reporter : public reporter {
public:
  void start(const run_info& info) override {
    out_dir_ = info.out_dir;
    if (!info.plan || !info.graph)
      return;
    // The SWARM trainers' tags, as the trainers derive them from the same plan.
    std::vector<std::string> trainers;
    for (auto& x : info.plan->instances)
      if (x.role < info.graph->roles.size() && info.graph->roles[x.role].type == "swarm.trainer")
        trainers.push_back(x.name);
    if (!trainers.empty()) {
      std::lock_guard<std::mutex> guard{mtx_};
      book_.set_trainers(trainers);
    }
  }
  void on_metric(const metric_record& m) override { add(m); }
  int finish(finish_context&) override {
    std::lock_guard<std::mutex> guard{mtx_};
    write_ledger(out_dir_, book_.rows());
    return 0;
  }
  void on_late_metric(const metric_record& m) override { add(m); }
  void close() override {
    std::lock_guard<std::mutex> guard{mtx_};
    write_ledger(out_dir_, book_.rows());
  }

private:
  void add(const metric_record& m) {
    std::lock_guard<std::mutex> guard{mtx_};
    book_.add({m.t, m.node, m.source, m.kind, m.values, m.labels});
  }

  /// `finish` runs beside late metrics.
  std::mutex mtx_;
  observe::ledger_book book_;
  std::string out_dir_;
};

/// One sweep of the ledger's shards in flight.
struct ledger_reader_state {
  std::vector<observe::ledger_entry> got;
  size_t pending = 0;
  /// Records left unread (beyond a reply's bound) or refused by their signature.
  size_t refused = 0;
  static inline const char* name = "ledger_reader";
};

using ledger_reader_atom = caf::atom_constant<caf::atom("ledger_rd")>;

/// Reads the run's 64 ledger shards of `experiment` through `dht` every `every` and hands each
/// complete read (records whose signatures verify, at most the bound per reply) to `fold` with
/// the DHT clock's now in seconds and the count of records left unread or refused.
caf::behavior ledger_reader(caf::stateful_actor<ledger_reader_state>* self, caf::actor dht,
                            std::string experiment, caf::timespan every, ledger_fold fold) {
  namespace collab = starling::actors::collab;
  auto done = [=] {
    auto& s = self->state;
    auto now = static_cast<double>(actors::dht::dht_now_ns(self)) / 1e9;
    fold(s.got, now, s.refused);
    s.got.clear();
    s.refused = 0;
    self->delayed_send(self, every, ledger_reader_atom::value);
  };
  self->send(self, ledger_reader_atom::value);
  return {
    [=](ledger_reader_atom) {
      auto& s = self->state;
      if (s.pending > 0)
        return;
      // The 64 shards of the peers' summaries, and the nodes' gate records.
      s.pending = collab::ledger_shards + 1;
      for (size_t shard = 0; shard <= collab::ledger_shards; ++shard) {
        bool gates = shard == collab::ledger_shards;
        actors::dht::dht_get(
          self, dht,
          gates ? collab::gate_ledger_key(experiment) : collab::ledger_key(experiment, shard),
          every,
          [=](const messages::dht_get_result& r) {
            auto& x = self->state;
            size_t taken = 0;
            for (auto& rec : r.records) {
              if (!rec.has_subkey)
                continue;
              // One reply decodes a bounded number of records; signatures are checked again
              // (a replica may be anyone).
              if (taken >= collab::max_ledger_reply_records || !actors::dht::verify(rec)) {
                x.refused++;
                continue;
              }
              ++taken;
              x.got.push_back(
                {rec.subkey, rec.value, static_cast<double>(rec.expiration_ns) / 1e9, gates});
            }
            if (--x.pending == 0)
              done();
          },
          [=](caf::error&) {
            if (--self->state.pending == 0)
              done();
          });
      }
    },
  };
}

/// The gate publisher's state.
struct gate_publisher_state {
  static inline const char* name = "gate_publisher";
  std::shared_ptr<node_gate> gate;
  std::string experiment;
  /// Empty until the node key came (unsigned records would be refused).
  std::string id;
  double started = 0;
};

using gate_tick_atom = caf::atom_constant<caf::atom("gate_tick")>;

caf::behavior gate_publisher(caf::stateful_actor<gate_publisher_state>* self, caf::actor dht,
                             std::string experiment, std::shared_ptr<node_gate> gate,
                             caf::timespan every) {
  namespace collab = starling::actors::collab;
  auto& s = self->state;
  s.gate = std::move(gate);
  s.experiment = std::move(experiment);
  s.started = collab::now_s(self);
  self->request(dht, std::chrono::seconds(5), dht_key_atom::value)
      .then([=](const std::string& key) { self->state.id = gate_record_id(key); },
            [](caf::error&) {});
  self->delayed_send(self, every, gate_tick_atom::value);
  return {
      [=](gate_tick_atom) {
        self->delayed_send(self, every, gate_tick_atom::value);
        auto& st = self->state;
        if (st.id.empty() || !st.gate)
          return;
        auto view = gate_view(*st.gate);
        if (view.by_reason.empty())
          return; // refused nobody: nothing to say
        collab::gate_summary g;
        g.id = st.id;
        g.time = collab::now_s(self);
        g.started = st.started;
        for (auto& [reason, n] : view.by_reason)
          g.by_reason[reason] = static_cast<double>(n);
        uint64_t listed = 0, total = 0;
        for (auto& p : view.peers) {
          if (g.parties.size() >= collab::max_gate_parties)
            break;
          g.parties.push_back({p.peer_id, static_cast<double>(p.refusals), p.ban_reason});
          listed += p.refusals;
        }
        for (auto& [reason, n] : view.by_reason)
          total += n;
        // Refusals of parties whose key the gate did not know, or beyond its bound.
        g.others = static_cast<double>(total > listed ? total - listed : 0);
        auto lifetime = 4 * std::chrono::duration<double>(every).count();
        auto put = actors::dht::make_subkey_put(collab::gate_ledger_key(st.experiment), st.id,
                                                collab::encode_gate_summary(g),
                                                collab::ns_of(g.time + lifetime), true);
        actors::dht::dht_store(
            self, dht, std::move(put), std::chrono::seconds(5),
            [](const messages::dht_put_result&) {}, [](caf::error&) {});
      },
  };
}

} // namespace

result<std::unique_ptr<run_watch>> run_watch::start(const std::string& endpoint,
                                                    const experiment_graph& g, const plan& p,
                                                    run_mode mode) {
  auto ep = parse_endpoint(endpoint);
  if (!ep)
    return fail("node.http: " + ep.error().what);
  observe::run_description run;
  run.experiment = g.name;
  run.kind = g.kind;
  run.mode = to_string(mode);
  run.nodes = p.total_nodes();
  run.seed = g.seed;
  run.start_unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (auto& x : p.instances) {
    observe::planned_member m;
    m.name = x.name;
    m.role = x.role < g.roles.size() ? g.roles[x.role].name : "?";
    m.type = x.role < g.roles.size() ? g.roles[x.role].type : "";
    m.node = x.node ? *x.node : 0;
    m.start_s = std::chrono::duration<double>(x.start).count();
    m.leave_s = x.leave ? std::chrono::duration<double>(*x.leave).count() : -1.0;
    run.members.push_back(std::move(m));
  }
  std::unique_ptr<run_watch> w{new run_watch};
  w->state_ = std::make_shared<state>(std::move(run));
  w->state_->experiment = g.name;
  {
    std::lock_guard<std::mutex> guard{w->state_->mtx};
    w->state_->publish();
  }
  observe::http_options o;
  o.host = ep->first;
  if (o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']')
    o.host = o.host.substr(1, o.host.size() - 2);
  o.port = ep->second;
  // Loopback unless the user chose otherwise; then say what that means.
  if (o.host != "localhost" && o.host.rfind("127.", 0) != 0 && o.host != "::1")
    log(log_level::warning, "http",
        "serving on {}: anyone who reaches this address sees the run's page, /status and "
        "/metrics (read-only)",
        o.host);
  auto srv = observe::http_server::start(w->state_->store, o);
  if (!srv)
    return fail("node.http: " + srv.error().what);
  w->server_ = std::move(*srv);
  return w;
}

run_watch::~run_watch() = default;

std::unique_ptr<reporter> run_watch::make_reporter() {
  return std::make_unique<watch_reporter>(state_);
}

std::string run_watch::url() const {
  return server_->url();
}

void run_watch::watch_gate(std::shared_ptr<node_gate> gate, const std::string& record_id) {
  std::lock_guard<std::mutex> guard{state_->mtx};
  state_->gate = std::move(gate);
  if (!record_id.empty())
    state_->builder.set_own_gate_id(record_id);
  state_->publish();
}

void run_watch::note(const metric_record& m) {
  std::lock_guard<std::mutex> guard{state_->mtx};
  state_->builder.add({m.t, m.node, m.source, m.kind, m.values, m.labels});
}

result<std::unique_ptr<run_watch>> watch_if_asked(const experiment_graph& g, const plan& p,
                                                  run_mode mode,
                                                  std::vector<std::unique_ptr<reporter>>& reporters,
                                                  const std::string& prefix) {
  if (g.node.http.empty())
    return std::unique_ptr<run_watch>{};
  auto w = run_watch::start(g.node.http, g, p, mode);
  if (!w)
    return fail(w.error().what);
  reporters.insert(reporters.begin(), (*w)->make_reporter());
  fmt::print("{}watch the run at {} (/status, /metrics, /ledger.csv){}\n", prefix, (*w)->url(),
             mode == run_mode::sim ? "; times on the page are the simulation's virtual time" : "");
  std::fflush(stdout);
  return w;
}

caf::actor run_watch::read_ledger(caf::actor_system& sys, const caf::actor& dht,
                                  std::chrono::nanoseconds every) {
  if (!dht || every.count() <= 0)
    return {};
  auto st = state_;
  return spawn_ledger_reader(sys, dht, st->experiment, every,
                             [st](const std::vector<observe::ledger_entry>& got, double now,
                                  size_t refused) {
                               std::lock_guard<std::mutex> guard{st->mtx};
                               auto r = st->builder.add_ledger_records(got, now);
                               st->publish();
                               if (r.rejected + refused > 0)
                                 log(log_level::debug, "ledger",
                                     "{} ledger record(s) refused in one read",
                                     r.rejected + refused);
                             });
}

std::string gate_record_id(const std::string& node_key) {
  return actors::collab::record_id("gate", node_key);
}

caf::actor spawn_gate_publisher(caf::actor_system& sys, const caf::actor& dht,
                                const std::string& experiment, std::shared_ptr<node_gate> gate,
                                std::chrono::nanoseconds every) {
  if (!dht || !gate || every.count() <= 0)
    return {};
  return sys.spawn(gate_publisher, dht, experiment, std::move(gate),
                   std::chrono::duration_cast<caf::timespan>(every));
}

caf::actor spawn_ledger_reader(caf::actor_system& sys, const caf::actor& dht,
                               const std::string& experiment, std::chrono::nanoseconds every,
                               ledger_fold fold) {
  return sys.spawn(ledger_reader, dht, experiment,
                   std::chrono::duration_cast<caf::timespan>(every), std::move(fold));
}

std::unique_ptr<reporter> make_ledger_reporter() {
  return std::make_unique<ledger_reporter>();
}

} // namespace starling::runtime
