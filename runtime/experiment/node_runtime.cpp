#include "runtime/experiment/node_runtime.hpp"

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/supervisor/supervisor.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/rebalance_atoms.hpp"
#include "runtime/metrics/metrics.hpp"

namespace starling::runtime {

// -- metric_record, reporter, finish_context ------------------------------------------------------

double metric_record::value(const std::string& key, double fallback) const {
  auto i = values.find(key);
  return i == values.end() ? fallback : i->second;
}

const std::string& metric_record::label(const std::string& key) const {
  static const std::string none;
  auto i = labels.find(key);
  return i == labels.end() ? none : i->second;
}

finish_context::~finish_context() = default;

reporter::~reporter() = default;

void reporter::start(const run_info&) {
  // nop
}

void reporter::on_metric(const metric_record&) {
  // nop
}

bool reporter::tick(double) {
  return false;
}

int reporter::finish(finish_context&) {
  return 0;
}

void reporter::on_late_metric(const metric_record&) {
  // nop
}

void reporter::close() {
  // nop
}

host::~host() = default;

// -- metric_hub ---------------------------------------------------------------------------------

metric_hub::metric_hub(std::vector<std::unique_ptr<reporter>> reporters,
                       const std::string& jsonl_path)
  : reporters_(std::move(reporters)) {
  if (!jsonl_path.empty())
    out_ = std::make_unique<jsonl_writer>(jsonl_path);
}

metric_hub::~metric_hub() = default;

void metric_hub::start(const run_info& info) {
  std::lock_guard<std::mutex> guard{mtx_};
  for (auto& r : reporters_)
    r->start(info);
}

void metric_hub::deliver(const metric_record& m) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (out_) {
    nlohmann::json j{{"t", m.t}, {"node", m.node}, {"source", m.source}, {"event", m.kind}};
    for (auto& [k, v] : m.values)
      j[k] = v;
    for (auto& [k, v] : m.labels)
      j[k] = v;
    out_->write(j);
  }
  if (observer_)
    observer_(m);
  if (finishing_) {
    // The reporters are writing their summaries (see `finish`); the ledger takes these still.
    for (auto& r : reporters_)
      r->on_late_metric(m);
    return;
  }
  for (auto& r : reporters_)
    r->on_metric(m);
}

bool metric_hub::tick(double t) {
  std::lock_guard<std::mutex> guard{mtx_};
  bool done = false;
  for (auto& r : reporters_)
    done = r->tick(t) || done;
  return done;
}

int metric_hub::finish(finish_context& ctx) {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    finishing_ = true;
  }
  // Without the lock: a reporter's finish asks the roles for their state while, in a run stopped
  // mid-way, their metrics keep coming. Held, the lock blocked every actor thread that delivered
  // one, and with them the answers: each ask waited for its timeout and the summary found no
  // live peer. Metrics that arrive now are still written to the JSONL file.
  int rc = 0;
  for (auto& r : reporters_) {
    auto x = r->finish(ctx);
    if (rc == 0)
      rc = x;
  }
  return rc;
}

void metric_hub::close() {
  std::lock_guard<std::mutex> guard{mtx_};
  if (closed_)
    return;
  closed_ = true;
  for (auto& r : reporters_)
    r->close();
}

// -- threaded_host ------------------------------------------------------------------------------

void threaded_host::register_actor(const std::string& name, const caf::actor& a) {
  caf::anon_send(directory_, put_atom::value, name, a);
}

void threaded_host::adopt(const caf::actor& a) {
  std::lock_guard<std::mutex> guard{mtx_};
  owned_.push_back(a);
}

void threaded_host::put(const std::string& name, const caf::actor& a) {
  register_actor(name, a);
  adopt(a);
}

caf::actor threaded_host::service(const std::string& name,
                                  const std::function<caf::actor(host&)>& make) {
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (auto i = services_.find(name); i != services_.end())
      return i->second;
  }
  // Made outside the lock: a service's factory may ask the host for others (the DHT).
  auto a = make(*this);
  if (a) {
    put(name, a);
    std::lock_guard<std::mutex> guard{mtx_};
    services_[name] = a;
  }
  return a;
}

void threaded_host::stop_all(caf::exit_reason reason) {
  std::vector<caf::actor> owned;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    owned.swap(owned_);
    services_.clear();
  }
  for (auto& a : owned)
    caf::anon_send_exit(a, reason);
}

void run_and_wait(caf::actor_system& sys, const std::function<void(caf::event_based_actor*)>& body,
                  std::chrono::nanoseconds timeout) {
  auto a = sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    body(self);
    return {[](stop_atom) {}};
  });
  caf::scoped_actor self{sys};
  self->monitor(a);
  bool gone = false;
  self->receive_while([&] { return !gone; })(
    [&](caf::down_msg&) { gone = true; },
    caf::after(std::chrono::duration_cast<caf::timespan>(timeout)) >> [&] { gone = true; });
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

// -- the metrics sink ---------------------------------------------------------------------------

namespace {

metric_record record_of(messages::metric_event&& e, size_t node, double t) {
  metric_record r;
  r.t = e.t >= 0 ? e.t : t;
  r.node = node;
  r.source = std::move(e.source);
  r.kind = std::move(e.kind);
  r.values = std::move(e.values);
  r.labels = std::move(e.labels);
  return r;
}

struct sink_state {
  caf::actor forward;
  bool resolving = false;
  /// Events waiting for the forward target to resolve (bounded: a lost node 0 drops them).
  std::vector<messages::metric_event> backlog;
};

} // namespace

caf::actor spawn_metric_sink(node_host& h, std::function<void(const metric_record&)> deliver,
                             std::string forward_to,
                             std::function<void(const metric_record&)> observe) {
  auto* hp = &h;
  auto node = h.index();
  auto name = h.name();
  return h.system().spawn([=](caf::stateful_actor<sink_state>* self) -> caf::behavior {
    auto handle = [=](messages::metric_event& e) {
      if (e.t < 0)
        e.t = seconds_of(hp->elapsed());
      if (observe)
        observe(record_of(messages::metric_event{e}, node, seconds_of(hp->elapsed())));
      if (deliver) {
        deliver(record_of(std::move(e), node, seconds_of(hp->elapsed())));
        return;
      }
      auto& st = self->state;
      if (st.forward) {
        self->send(st.forward, std::move(e));
        return;
      }
      if (st.backlog.size() < 10000)
        st.backlog.push_back(std::move(e));
      if (st.resolving)
        return;
      st.resolving = true;
      self->request(hp->resolver(), std::chrono::seconds(5), resolve_atom::value, forward_to)
        .then(
          [=](const caf::actor& a) {
            auto& st = self->state;
            st.resolving = false;
            st.forward = a;
            self->monitor(a);
            for (auto& x : st.backlog)
              self->send(a, std::move(x));
            st.backlog.clear();
          },
          [=](caf::error&) { self->state.resolving = false; });
    };
    self->set_down_handler([=](const caf::down_msg& dm) {
      if (dm.source == self->state.forward.address())
        self->state.forward = nullptr;
    });
    return {
      [=](messages::metric_event& e) {
        if (!e.wire_error.empty()) {
          // A metric whose envelope was refused (counted by the wire context) is nobody's
          // metric: it becomes this node's note of the refusal, with the reason.
          messages::metric_event note;
          note.source = name + "/wire";
          note.kind = "refused";
          note.labels["reason"] = e.wire_error;
          handle(note);
          return;
        }
        handle(e);
      },
      // The supervisor's notes: restarts and stage migrations of the node's instances.
      [=](respawn_atom, uint64_t, const std::string& instance, int generation) {
        messages::metric_event e;
        e.source = instance;
        e.kind = "restart";
        e.values["generation"] = generation;
        e.labels["node"] = name;
        handle(e);
      },
      [=](put_atom, load_atom, uint64_t, const std::string& instance, uint64_t stage,
          bool by_board) {
        // A volunteer's stage peer placed when it started (child_spec::place_first).
        messages::metric_event e;
        e.source = instance;
        e.kind = "placed";
        e.values["stage"] = static_cast<double>(stage);
        e.labels["by"] = by_board ? "board" : "default";
        e.labels["node"] = name;
        handle(e);
      },
      [=](migrate_atom, uint64_t, const std::string& instance, uint64_t from, uint64_t to,
          const std::vector<double>& seen) {
        messages::metric_event e;
        e.source = instance;
        e.kind = "migrate";
        e.values["from"] = static_cast<double>(from);
        e.values["to"] = static_cast<double>(to);
        // The stages' throughputs the decision saw (samples/s), as `stage<k>`.
        for (size_t k = 0; k < seen.size(); ++k)
          e.values[fmt::format("stage{}", k)] = seen[k];
        handle(e);
      },
    };
  });
}

// -- the node's share: supervisor and fault injector -------------------------------------------

namespace {

caf::timespan to_span(std::chrono::nanoseconds d) {
  return std::chrono::duration_cast<caf::timespan>(d);
}

/// Carries out the node's share of the fault plan at its times, on CAF's clock.
caf::behavior fault_injector(caf::event_based_actor* self, node_host* h,
                             std::vector<size_t> faults, caf::actor supervisor,
                             std::vector<std::pair<size_t, size_t>> children,
                             std::function<void(const planned_fault&)> node_fault) {
  auto now = h->elapsed();
  auto& p = h->plan();
  for (auto f : faults) {
    auto at = p.faults[f].at;
    if (at < now)
      continue; // before this node (re)started
    self->delayed_send(self, to_span(at - now), tick_atom::value, static_cast<uint64_t>(f));
  }
  return {
    [=](tick_atom, uint64_t f) {
      auto& fault = h->plan().faults[f];
      messages::metric_event e;
      e.source = h->name() + "/faults";
      e.kind = "fault";
      e.labels["action"] = to_string(fault.what);
      if (fault.what == planned_fault::action::kill_instance) {
        auto& inst = h->plan().instances[fault.instance];
        e.labels["instance"] = inst.name;
        e.values["restart_s"] = fault.never ? -1.0 : seconds_of(fault.restart);
        for (auto& [instance, child] : children)
          if (instance == fault.instance)
            self->send(supervisor, preempt_atom::value, static_cast<uint64_t>(child),
                       to_span(fault.restart), fault.never);
      } else if (node_fault) {
        e.labels["node"] = h->name();
        node_fault(fault);
      }
      self->send(h->metrics(), std::move(e));
    },
  };
}

} // namespace

node_share start_node_share(node_host& h, const role_registry& registry, int incarnation,
                            std::vector<size_t> faults,
                            std::function<void(const planned_fault&)> node_fault) {
  node_share share;
  auto& p = h.plan();
  auto& g = h.graph();
  auto now = h.elapsed();
  std::vector<actors::supervisor::child_spec> specs;
  auto* hp = &h;
  for (auto i : p.on_node(h.index())) {
    auto& inst = p.instances[i];
    if (inst.leave && *inst.leave <= now)
      continue; // it left before this node (re)started
    auto& role = g.roles[inst.role];
    auto* type = registry.find(role.type);
    if (!type)
      continue; // validated before: a registry without the type never gets here
    actors::supervisor::child_spec c;
    c.name = inst.name;
    c.restart_delay = to_span(role.restart.delay);
    c.supervised = role.restart.supervised;
    c.start_after = inst.start > now ? to_span(inst.start - now) : caf::timespan{0};
    c.leave_after = inst.leave ? to_span(*inst.leave - now) : caf::timespan{-1};
    // After a node restart every instance comes back as a later generation: it downloads its
    // state like any respawned instance, and its generation-stamped names stay unique.
    c.first_generation = incarnation * 1000;
    c.stage = type->initial_variant(role.options, inst.index);
    // A volunteer's instance of a rebalanced role starts where the run needs it most.
    c.place_first = role.placement.open && static_cast<bool>(type->rebalancing);
    auto seed = p.seed;
    const role_spec* rp = &role;
    auto index = inst.index;
    auto name = inst.name;
    c.spawn_at = [hp, type, rp, index, name, seed](int generation, uint64_t variant) {
      role_context ctx{*hp, *rp};
      ctx.index = index;
      ctx.name = name;
      ctx.generation = generation;
      ctx.variant = variant;
      ctx.seed = instance_seed(seed, rp->name, index, generation);
      auto a = type->spawn(ctx, rp->options);
      if (a) {
        hp->register_actor(name, a);
        hp->adopt(a);
      }
      return a;
    };
    share.children.emplace_back(i, specs.size());
    specs.push_back(std::move(c));
  }
  // Roles whose instances may change variant ask for the supervisor's rebalancing.
  actors::supervisor::rebalancing_options rebalancing;
  for (auto i : p.on_node(h.index())) {
    auto& role = g.roles[p.instances[i].role];
    auto* type = registry.find(role.type);
    if (type && type->rebalancing && type->rebalancing(h, role.options, rebalancing))
      break;
  }
  rebalancing.seed ^= instance_seed(p.seed, "supervisor", h.index(), incarnation);
  share.supervisor = actors::supervisor::spawn_supervisor(h.system(), std::move(specs), h.sink,
                                                          rebalancing);
  h.adopt(share.supervisor);
  h.register_actor("supervisor", share.supervisor);
  share.injector = h.system().spawn(fault_injector, hp, std::move(faults), share.supervisor,
                                    share.children, std::move(node_fault));
  h.adopt(share.injector);
  return share;
}

} // namespace starling::runtime
