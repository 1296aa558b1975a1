// Cluster mode: this process is node `index` of the plan. It runs a DHT node (bootstrapped from
// `--join`), announces itself in the run's node table (`<experiment>/nodes`, sub-key = index,
// value = endpoint and listening ports) so that `@<node>/<name>` addresses resolve, starts its
// share of the plan, and carries out its faults: instance kills on CAF's clock, partitions by
// refusing to resolve the other side and shutting its own sockets to it (node kills are the
// `starling node` parent's business: it kills and restarts this process). Node 0 runs the
// reporters (the others forward their metrics to it) and, once they say the work is done,
// tells the other nodes through the DHT (`<experiment>/done`).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/client.hpp"
#include "actors/dht/dht.hpp"
#include "actors/transfer/data_channel.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "messages/metrics.hpp"
#include "runtime/experiment/contribution.hpp"
#include "runtime/experiment/node_runtime.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/experiment/watch.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/address.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/links.hpp"
#include "runtime/node/node.hpp"
#include "runtime/observe/ledger.hpp"

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;

/// A node of the table: its endpoint and the ports it listens on.
struct table_entry {
  std::string endpoint;
  std::set<uint16_t> ports;
};

/// Parses `host:port p1,p2,...` (untrusted DHT bytes).
std::optional<table_entry> parse_entry(const std::vector<char>& v) {
  if (v.empty() || v.size() > 512)
    return std::nullopt;
  std::string text(v.begin(), v.end());
  std::istringstream ss{text};
  table_entry e;
  std::string ports;
  if (!(ss >> e.endpoint))
    return std::nullopt;
  if (!parse_endpoint(e.endpoint))
    return std::nullopt;
  if (ss >> ports) {
    std::istringstream ps{ports};
    std::string one;
    while (std::getline(ps, one, ',')) {
      char* end = nullptr;
      auto p = std::strtoul(one.c_str(), &end, 10);
      if (end == one.c_str() || *end != '\0' || p == 0 || p > 65535)
        return std::nullopt;
      e.ports.insert(static_cast<uint16_t>(p));
    }
  }
  return e;
}

std::string nodes_key(const experiment_graph& g) {
  return g.name + "/nodes";
}

std::string done_key(const experiment_graph& g) {
  return g.name + "/done";
}

/// Volunteers' claims of open slots: sub-key = instance name, value = the claimant's endpoint.
std::string slots_key(const experiment_graph& g) {
  return g.name + "/slots";
}

/// When node 0 started the run (system clock, ns since the epoch, as text): every node runs
/// the plan on this clock, so that fault times mean the same instant everywhere.
std::string start_key(const experiment_graph& g) {
  return g.name + "/start";
}

int64_t system_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

/// Puts this node on the run's clock. Node 0's first incarnation waits until every numbered
/// node has joined the node table (at most `patience`), then starts the run and publishes its
/// start; the others (and a restarted node 0) wait for that record (at most `patience`) and take
/// its time, so that plan times mean the same instant on every node and no node misses the
/// start. Without the record a node keeps its own start (plan times then count from when it
/// started).
void sync_run_clock(caf::actor_system& sys, caf::actor dht, const experiment_graph& g,
                    size_t nodes, bool publish,
                    const std::function<void(nanoseconds)>& set_elapsed,
                    std::chrono::seconds patience) {
  caf::scoped_actor self{sys};
  auto deadline = std::chrono::steady_clock::now() + patience;
  auto read = [&](const std::string& key, const std::function<void(const messages::dht_record&)>& f) {
    self->request(dht, std::chrono::seconds(2), get_atom::value, key)
      .receive(
        [&](const messages::dht_get_result& r) {
          for (auto& rec : r.records)
            f(rec);
        },
        [](caf::error&) {});
  };
  if (publish) {
    while (std::chrono::steady_clock::now() < deadline) {
      std::set<std::string> joined;
      read(g.name + "/nodes", [&](const messages::dht_record& rec) {
        if (rec.has_subkey)
          joined.insert(rec.subkey);
      });
      if (joined.size() >= nodes)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    set_elapsed(nanoseconds{0});
    auto start = std::to_string(system_now_ns());
    auto put = actors::dht::make_put(start_key(g), std::vector<char>(start.begin(), start.end()),
                                     actors::dht::dht_now_ns(self.ptr()) + g.duration.count()
                                       + 3'600'000'000'000);
    self->request(dht, std::chrono::seconds(5), std::move(put))
      .receive([](const messages::dht_put_result&) {}, [](caf::error&) {});
    return;
  }
  while (std::chrono::steady_clock::now() < deadline) {
    std::optional<int64_t> start;
    read(start_key(g), [&](const messages::dht_record& rec) {
      if (rec.has_subkey || rec.value.empty() || rec.value.size() >= 32)
        return;
      std::string text(rec.value.begin(), rec.value.end());
      char* end = nullptr;
      auto v = std::strtoll(text.c_str(), &end, 10);
      if (end != text.c_str() && *end == '\0')
        start = v;
    });
    if (start) {
      auto elapsed = system_now_ns() - *start;
      set_elapsed(nanoseconds{std::max<int64_t>(0, elapsed)});
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

struct resolver_state {
  std::map<size_t, table_entry> table;
  caf::actor_clock::time_point fetched{};
  std::set<size_t> blocked;
};

/// Resolves `@<node>/<name>` through the run's node table and refuses the nodes a partition
/// cut off; everything else goes to the node's own resolver.
caf::behavior run_resolver(caf::stateful_actor<resolver_state>* self, caf::actor base,
                           caf::actor dht, size_t own, std::string own_endpoint,
                           std::string table_key, std::string claims_key) {
  using rp_type = caf::typed_response_promise<caf::actor>;
  auto forward = [=](std::string address, rp_type rp) {
    self->request(base, std::chrono::seconds(10), resolve_atom::value, std::move(address))
      .then([rp](const caf::actor& a) mutable { rp.deliver(a); },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  };
  auto blocked_endpoint = [=](const std::string& ep) {
    for (auto n : self->state.blocked)
      if (auto i = self->state.table.find(n); i != self->state.table.end() && i->second.endpoint == ep)
        return true;
    return false;
  };
  // Refreshes the table, then runs `k`.
  auto refresh = [=](std::function<void()> k) {
    actors::dht::dht_get(
      self, dht, table_key, std::chrono::seconds(5),
      [=](const messages::dht_get_result& r) {
        for (auto& rec : r.records) {
          if (!rec.has_subkey)
            continue;
          char* end = nullptr;
          auto idx = std::strtoul(rec.subkey.c_str(), &end, 10);
          if (end == rec.subkey.c_str() || *end != '\0')
            continue;
          if (auto e = parse_entry(rec.value))
            self->state.table[idx] = *e;
        }
        self->state.fetched = self->clock().now();
        k();
      },
      [=](caf::error&) { k(); });
  };
  auto cut = [=] {
    for (auto n : self->state.blocked)
      if (auto i = self->state.table.find(n); i != self->state.table.end()) {
        auto ep = parse_endpoint(i->second.endpoint);
        if (!ep)
          continue;
        auto k = cut_connections(ep->first, i->second.ports);
        log(log_level::info, "partition", "cut {} connection(s) to node{} ({})", k, n,
            i->second.endpoint);
      }
  };
  return {
    [=](resolve_atom, const std::string& address) -> caf::result<caf::actor> {
      auto rp = self->make_response_promise<caf::actor>();
      auto inst = instance_address::parse(address);
      if (!inst) {
        auto addr = peer_address::parse(address);
        if (addr && blocked_endpoint(addr->endpoint()))
          return caf::make_error(caf::sec::cannot_connect_to_node,
                                 "partitioned from " + addr->endpoint());
        forward(address, rp);
        return rp;
      }
      if (inst->node < 0) {
        // A volunteer slot: whoever claimed it is in the claims record.
        auto name = inst->name;
        actors::dht::dht_get(
          self, dht, claims_key, std::chrono::seconds(5),
          [=](const messages::dht_get_result& r) mutable {
            for (auto& rec : r.records)
              if (rec.has_subkey && rec.subkey == name && !rec.value.empty()
                  && rec.value.size() < 256) {
                std::string ep(rec.value.begin(), rec.value.end());
                if (parse_endpoint(ep) && !blocked_endpoint(ep)) {
                  forward(ep + "/" + name, rp);
                  return;
                }
              }
            rp.deliver(caf::make_error(caf::sec::cannot_connect_to_node,
                                       "no volunteer holds slot " + name));
          },
          [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      }
      auto n = static_cast<size_t>(inst->node);
      if (n == own) {
        forward(own_endpoint + "/" + inst->name, rp);
        return rp;
      }
      if (self->state.blocked.count(n))
        return caf::make_error(caf::sec::cannot_connect_to_node,
                               fmt::format("partitioned from node{}", n));
      auto use = [=]() mutable {
        auto i = self->state.table.find(n);
        if (i == self->state.table.end()) {
          rp.deliver(caf::make_error(caf::sec::cannot_connect_to_node,
                                     fmt::format("node{} is not in the run's node table", n)));
          return;
        }
        forward(i->second.endpoint + "/" + inst->name, rp);
      };
      auto stale = self->clock().now() - self->state.fetched > std::chrono::seconds(2);
      if (self->state.table.count(n) && !stale)
        use();
      else
        refresh(use);
      return rp;
    },
    // A partition (the nodes to cut off) or a heal (an empty list).
    [=](put_atom, const std::vector<uint64_t>& nodes) {
      self->state.blocked.clear();
      for (auto n : nodes)
        self->state.blocked.insert(static_cast<size_t>(n));
      if (!nodes.empty())
        refresh(cut);
    },
  };
}

/// Re-stores the node's table entry every `period` (ports change as data planes open).
caf::behavior table_announcer(caf::event_based_actor* self, caf::actor dht, std::string key,
                              size_t index, std::string endpoint, caf::timespan period) {
  self->send(self, tick_atom::value);
  return {
    [=](tick_atom) {
      std::string ports;
      for (auto p : listening_ports())
        ports += (ports.empty() ? "" : ",") + std::to_string(p);
      auto text = endpoint + " " + ports;
      auto put = actors::dht::make_subkey_put(key, std::to_string(index),
                                              std::vector<char>(text.begin(), text.end()),
                                              actors::dht::expires_in(self, 3 * period));
      actors::dht::dht_store(self, dht, std::move(put), period,
                             [](const messages::dht_put_result&) {}, [](caf::error&) {});
      self->delayed_send(self, period, tick_atom::value);
    },
  };
}

class cluster_host : public threaded_host {
public:
  cluster_host(node& nd, size_t index, const experiment_graph& g, const struct plan& p,
               caf::actor_clock::time_point t0)
    : threaded_host(nd.directory()),
      nd_(nd),
      index_(index),
      name_(fmt::format("node{}", index)),
      graph_(g),
      plan_(p),
      t0_(t0) {
    // nop
  }

  const actors::auth::key_pair* node_key() const override { return &nd_.key(); }
  caf::actor node_directory() override { return nd_.directory(); }

  caf::actor_system& system() override { return nd_.system(); }
  run_mode mode() const override { return run_mode::cluster; }
  size_t index() const override { return index_; }
  const std::string& name() const override { return name_; }
  std::string endpoint() const override { return nd_.endpoint(); }
  std::string token_id() const override { return nd_.token_id(); }
  bool reachable() const override { return !graph_.node.client && nd_.listening(); }
  caf::actor resolver() override { return resolver_; }
  caf::actor dht() override { return dht_; }
  caf::actor metrics() override { return sink; }

  caf::actor spawn_averager(const std::string& name,
                            actors::averager::averager_options opts) override {
    opts.address = endpoint() + "/" + name;
    if (auto data = nd_.data_endpoint()) {
      opts.transport = data->link_layer(); // the node's link pool, shared with its transfers
    } else {
      auto ep = endpoint();
      opts.data_host = ep.substr(0, ep.rfind(':'));
      opts.data_security = nd_.link_security();
    }
    auto a = actors::averager::spawn_averager(nd_.system(), dht_, resolver_, opts);
    put(name, a);
    return a;
  }

  caf::actor view(const caf::actor& a) override { return a; }

  caf::actor shared_service(const std::string&, const std::function<caf::actor()>&) override {
    return {};
  }

  const experiment_graph& graph() const override { return graph_; }
  const struct plan& plan() const override { return plan_; }
  nanoseconds elapsed() override { return nd_.system().clock().now() - t0_; }

  /// Moves the start of the run (the run's clock is node 0's).
  void set_start(caf::actor_clock::time_point t0) { t0_ = t0; }

  /// Starts the DHT, the node table and the run's resolver.
  void start_services(const std::vector<std::string>& join) {
    auto& sys = nd_.system();
    actors::dht::dht_options d;
    d.address = endpoint() + "/dht";
    d.client = graph_.node.client;
    // The node's own key: its DHT id is its peer id, and its records are signed by the key its
    // envelopes name.
    d.id = actors::dht::identity{nd_.key().public_key(), nd_.key().secret_key()};
    for (auto& j : join)
      d.bootstrap.push_back(j + "/dht");
    dht_ = actors::dht::spawn_dht(sys, nd_.resolver(), d);
    put("dht", dht_);
    resolver_ = sys.spawn(run_resolver, nd_.resolver(), dht_, index_, endpoint(), nodes_key(graph_),
                          slots_key(graph_));
    adopt(resolver_);
    adopt(sys.spawn(table_announcer, dht_, nodes_key(graph_), index_, endpoint(),
                    caf::timespan{std::chrono::seconds(1)}));
  }

  void stop() { stop_all(caf::exit_reason::user_shutdown); }

private:
  node& nd_;
  size_t index_;
  std::string name_;
  const experiment_graph& graph_;
  const struct plan& plan_;
  caf::actor_clock::time_point t0_;
  caf::actor dht_;
  caf::actor resolver_;
};

class cluster_finish : public finish_context {
public:
  explicit cluster_finish(cluster_host& h) : h_(h) {}

  std::vector<caf::actor> live(const std::string& role) override {
    std::vector<caf::actor> out;
    auto& g = h_.graph();
    auto& p = h_.plan();
    caf::scoped_actor self{h_.system()};
    for (size_t r = 0; r < g.roles.size(); ++r) {
      if (g.roles[r].name != role)
        continue;
      for (auto i : p.of_role(r)) {
        auto& x = p.instances[i];
        if (!x.node)
          continue;
        self->request(h_.resolver(), std::chrono::seconds(5), resolve_atom::value,
                      fmt::format("@{}/{}", *x.node, x.name))
          .receive([&](const caf::actor& a) { out.push_back(a); }, [](caf::error&) {});
      }
    }
    return out;
  }

  void run(std::function<void(caf::event_based_actor*)> body, nanoseconds timeout) override {
    run_and_wait(h_.system(), body, timeout);
  }

  host& node() override { return h_; }

private:
  cluster_host& h_;
};

} // namespace

namespace {

/// The value of a slot claim a volunteer released when it left (not an endpoint: nobody
/// resolves it, and the next claimant's claim replaces it).
constexpr const char* released_claim = "-";

/// Claims a slot for this volunteer, confirmed after a settle delay (of two volunteers racing
/// for one slot, the claim the DHT kept wins and the other tries the next). The slot is of the
/// open role the run needs most: the fewest live claims per open slot the plan gives it (ties:
/// plan order); within it the first planned open slot nobody holds, else, when every one is
/// held, one more instance of that role (`<role>.<k>`, appended to `p`), up to
/// `node.max_volunteers` live claims in all (0: no limit).
/// Returns its index among the plan's instances, or why no slot was taken.
result<size_t> claim_slot(caf::actor_system& sys, caf::actor dht, const experiment_graph& g,
                          plan& p, const std::string& endpoint) {
  caf::scoped_actor self{sys};
  auto holders = [&] {
    std::map<std::string, std::string> out;
    self->request(dht, std::chrono::seconds(5), get_atom::value, slots_key(g))
      .receive(
        [&](const messages::dht_get_result& r) {
          for (auto& rec : r.records)
            if (rec.has_subkey && rec.value.size() < 256)
              out[rec.subkey] = std::string(rec.value.begin(), rec.value.end());
        },
        [](caf::error&) {});
    return out;
  };
  // The open roles, in plan order, with their open slots.
  std::vector<size_t> roles;
  std::map<size_t, std::vector<size_t>> open;
  std::map<size_t, size_t> next_index;
  for (size_t i = 0; i < p.instances.size(); ++i) {
    auto& x = p.instances[i];
    next_index[x.role] = std::max(next_index[x.role], x.index + 1);
    if (x.node)
      continue;
    if (!open.count(x.role))
      roles.push_back(x.role);
    open[x.role].push_back(i);
  }
  if (roles.empty())
    return fail(fmt::format("the run '{}' plans no open slot", g.name));
  const auto limit = static_cast<size_t>(g.node.max_volunteers);
  auto role_of = [&](const std::string& name) -> std::optional<size_t> {
    auto dot = name.rfind('.');
    if (dot == std::string::npos)
      return std::nullopt;
    for (auto r : roles)
      if (g.roles[r].name == name.substr(0, dot))
        return r;
    return std::nullopt;
  };
  // Bounded: each try that loses a race costs a settle delay.
  for (int attempt = 0; attempt < 16; ++attempt) {
    auto held = holders();
    std::map<size_t, size_t> live_of;
    size_t live = 0;
    for (auto& [name, value] : held)
      if (value != released_claim && value != endpoint)
        if (auto r = role_of(name)) {
          ++live_of[*r];
          ++live;
        }
    if (limit > 0 && live >= limit)
      return fail(fmt::format("the run '{}' takes at most {} volunteer(s) at once and has {} now "
                              "(node.max_volunteers in its file); try again later",
                              g.name, limit, live));
    auto order = roles;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      // live_a / open_a < live_b / open_b, without division.
      return live_of[a] * open[b].size() < live_of[b] * open[a].size();
    });
    auto free = [&](const std::string& name) {
      auto h = held.find(name);
      return h == held.end() || h->second == endpoint || h->second == released_claim;
    };
    std::optional<size_t> pick;
    for (auto r : order) {
      for (auto i : open[r])
        if (free(p.instances[i].name)) {
          pick = i;
          break;
        }
      if (pick)
        break;
      // Every planned slot of the role is held: one more instance of it.
      for (auto k = next_index[r]; !pick; ++k)
        if (auto name = fmt::format("{}.{}", g.roles[r].name, k); free(name)) {
          planned_instance x;
          x.role = r;
          x.index = k;
          x.name = name;
          p.instances.push_back(x);
          next_index[r] = k + 1;
          open[r].push_back(p.instances.size() - 1);
          pick = p.instances.size() - 1;
        }
      break;
    }
    if (!pick)
      break;
    auto& x = p.instances[*pick];
    auto put = actors::dht::make_subkey_put(slots_key(g), x.name,
                                            std::vector<char>(endpoint.begin(), endpoint.end()),
                                            actors::dht::dht_now_ns(self.ptr()) + 6'000'000'000);
    self->request(dht, std::chrono::seconds(5), std::move(put))
      .receive([](const messages::dht_put_result&) {}, [](caf::error&) {});
    std::this_thread::sleep_for(std::chrono::seconds(1)); // the settle delay of racing claims
    held = holders();
    if (held.count(x.name) && held[x.name] == endpoint)
      return *pick;
  }
  return fail(fmt::format("every slot this volunteer tried in the run '{}' was taken by another "
                          "at the same moment; join again",
                          g.name));
}

/// Keeps a volunteer's claim alive (it expires 6 s after the volunteer is gone).
caf::behavior claim_keeper(caf::event_based_actor* self, caf::actor dht, std::string key,
                           std::string slot, std::string endpoint) {
  self->send(self, tick_atom::value);
  return {
    [=](tick_atom) {
      auto put = actors::dht::make_subkey_put(key, slot,
                                              std::vector<char>(endpoint.begin(), endpoint.end()),
                                              actors::dht::expires_in(self, std::chrono::seconds(6)));
      actors::dht::dht_store(self, dht, std::move(put), std::chrono::seconds(2),
                             [](const messages::dht_put_result&) {}, [](caf::error&) {});
      self->delayed_send(self, std::chrono::seconds(2), tick_atom::value);
    },
  };
}

/// Releases a volunteer's slot: a claim of `released_claim` that outlives the keeper's last
/// claim by a millisecond (the DHT keeps the record that expires last, and the next claimant's
/// claim, made later, expires later still). Returns how many DHT nodes stored it.
uint32_t release_slot(caf::actor_system& sys, const caf::actor& dht, const std::string& key,
                      const std::string& slot) {
  caf::scoped_actor self{sys};
  std::string v{released_claim};
  auto put = actors::dht::make_subkey_put(key, slot, std::vector<char>(v.begin(), v.end()),
                                          actors::dht::dht_now_ns(self.ptr()) + 6'001'000'000);
  uint32_t stored = 0;
  self->request(dht, std::chrono::seconds(5), std::move(put))
    .receive([&](const messages::dht_put_result& r) { stored = r.wire_error.empty() ? r.accepted : 0; },
             [](caf::error&) {});
  return stored;
}

/// A graceful leave of this node's instances: each that answers `stop_atom` (a data-parallel
/// peer) finishes its round and stores its tombstone. Returns the tombstones' acknowledgements
/// (the least over the instances; nothing when no instance answered).
std::optional<uint32_t> leave_instances(caf::actor_system& sys, const caf::actor& directory,
                                        const std::vector<std::string>& names,
                                        std::chrono::nanoseconds bound) {
  caf::scoped_actor self{sys};
  std::optional<uint32_t> least;
  for (auto& name : names) {
    caf::actor a;
    self->request(directory, std::chrono::seconds(2), get_atom::value, name)
      .receive([&](const caf::actor& x) { a = x; }, [](caf::error&) {});
    if (!a)
      continue;
    self->request(a, caf::timespan{bound}, stop_atom::value)
      .receive([&](uint32_t stored) { least = std::min(least.value_or(stored), stored); },
               [&](caf::error&) { least = 0; });
  }
  return least;
}

/// The run's nodes a volunteer watches: connections it opened (a down one counts as lost),
/// shared with the down callbacks.
struct watched_nodes {
  std::mutex mtx;
  std::set<std::string> live;
  std::atomic<int> watched{0};
  std::atomic<int> lost{0};
};

/// Opens a connection to `ep` and watches it; false when the node could not be joined.
bool watch_node(node& nd, const std::shared_ptr<watched_nodes>& w, const std::string& ep) {
  {
    // Counted before the join: a connection lost as soon as it opened is never more lost
    // than watched, nor left live.
    std::lock_guard<std::mutex> guard{w->mtx};
    if (!w->live.insert(ep).second)
      return true;
    ++w->watched;
  }
  auto j = nd.join(ep, [w, ep](const std::string&, const std::string&) {
    {
      std::lock_guard<std::mutex> guard{w->mtx};
      w->live.erase(ep);
    }
    ++w->lost;
  });
  if (j)
    return true;
  std::lock_guard<std::mutex> guard{w->mtx};
  w->live.erase(ep);
  --w->watched;
  return false;
}

/// The endpoints in the run's node table, besides `own` and client-mode names (nothing can
/// dial those).
std::set<std::string> table_endpoints(caf::actor_system& sys, const caf::actor& dht,
                                      const std::string& key, const std::string& own) {
  std::set<std::string> out;
  caf::scoped_actor self{sys};
  self->request(dht, std::chrono::seconds(5), get_atom::value, key)
    .receive(
      [&](const messages::dht_get_result& r) {
        for (auto& rec : r.records)
          if (rec.has_subkey)
            if (auto e = parse_entry(rec.value);
                e && e->endpoint != own && !is_client_endpoint(e->endpoint))
              out.insert(e->endpoint);
      },
      [](caf::error&) {});
  return out;
}

/// A client-mode volunteer is reached only over connections it opened: every `period` it joins
/// the nodes of the run's table it holds no connection to (started, or started again, after
/// it); one it could not join is left alone for ten periods (a dead node's record outlives it
/// for a while). Detached: a join blocks for up to the node's connection timeout.
caf::behavior client_rejoiner(caf::event_based_actor* self, node* nd,
                              std::shared_ptr<watched_nodes> w, caf::actor dht, std::string key,
                              caf::timespan period) {
  auto failed = std::make_shared<std::map<std::string, caf::actor_clock::time_point>>();
  self->delayed_send(self, period, tick_atom::value);
  return {
    [=](tick_atom) {
      auto now = self->clock().now();
      for (auto& ep : table_endpoints(self->system(), dht, key, nd->endpoint())) {
        if (auto f = failed->find(ep); f != failed->end() && now < f->second)
          continue;
        {
          std::lock_guard<std::mutex> guard{w->mtx};
          if (w->live.count(ep))
            continue;
        }
        if (watch_node(*nd, w, ep)) {
          failed->erase(ep);
          log(log_level::info, "volunteer", "client mode: connected to {}, which can reach this "
                                            "node through it", ep);
        } else {
          (*failed)[ep] = now + period * 10;
        }
      }
      self->delayed_send(self, period, tick_atom::value);
    },
  };
}

/// Uptime as `1h02m`, `3m05s` or `42 s`.
std::string uptime_text(double s) {
  auto t = static_cast<int64_t>(s);
  if (t >= 3600)
    return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60)
    return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{} s", t);
}

/// One volunteer's contribution (contribution.hpp): the counts, the ledger book they read, and
/// the first read's arrival, behind one lock (the reader's and the sink's threads write, the
/// runner's reads).
struct contribution {
  std::mutex mtx;
  std::condition_variable read;
  observe::ledger_book book;
  contribution_count count;
};

} // namespace

int run_cluster_node(const experiment_graph& g, const role_registry& registry, node& nd,
                     const cluster_settings& settings) {
  auto wall0 = std::chrono::steady_clock::now();
  auto s = settings;
  caf::actor keeper;
  std::string slot_name;
  auto p = make_plan(g, run_mode::cluster, s.count, g.seed);
  if (!p) {
    fmt::print(stderr, "starling: error: {}\n", p.error().what);
    return 2;
  }
  auto& sys = nd.system();
  auto t0 = sys.clock().now() - std::chrono::duration_cast<caf::timespan>(s.elapsed);
  if (s.volunteer)
    s.index = s.count; // until it holds a slot: beyond the numbered nodes
  cluster_host h{nd, s.index, g, *p, t0};
  if (!s.out_dir.empty())
    h.dir = s.out_dir + "/" + h.name();
  h.start_services(s.join);
  sync_run_clock(
    sys, h.dht(), g, s.count, s.index == 0 && s.incarnation == 0 && !s.volunteer,
    [&](nanoseconds elapsed) {
      h.set_start(sys.clock().now() - std::chrono::duration_cast<caf::timespan>(elapsed));
    },
    std::chrono::seconds(60));
  // The `starling node` parent reads this line to put its own fault clock on the run's.
  fmt::print("node{}: run clock {:.3f} s\n", s.index, seconds_of(h.elapsed()));
  std::fflush(stdout);
  if (s.volunteer) {
    // Volunteers take the slots the plan leaves open: claim one, then run it as node
    // `count + k` of this process's copy of the plan (the others address it as @open/<name>).
    std::this_thread::sleep_for(std::chrono::seconds(1)); // the DHT bootstrap
    const auto planned = p->instances.size();
    auto slot = claim_slot(sys, h.dht(), g, *p, nd.endpoint());
    if (!slot) {
      fmt::print(stderr, "starling: error: {}\n", slot.error().what);
      h.stop();
      return 2;
    }
    p->instances[*slot].node = s.count;
    keeper = sys.spawn(claim_keeper, h.dht(), slots_key(g), p->instances[*slot].name,
                       nd.endpoint());
    h.adopt(keeper);
    slot_name = p->instances[*slot].name;
    fmt::print("volunteer: holds slot {}{}\n", slot_name,
               *slot >= planned ? " (every open slot of the plan was held: one more instance)"
                                : "");
    std::fflush(stdout);
  }
  // A volunteer watches the run's numbered nodes as the table lists them now: once all are
  // lost it says so instead of waiting for a run nobody serves.
  // In client mode these connections are how the run reaches it: it also joins the nodes that
  // start later.
  auto watching = std::make_shared<watched_nodes>();
  if (s.volunteer && s.watch_nodes) {
    auto endpoints = table_endpoints(sys, h.dht(), nodes_key(g), nd.endpoint());
    endpoints.insert(s.join.begin(), s.join.end());
    for (auto& ep : endpoints)
      watch_node(nd, watching, ep);
    if (!nd.listening())
      h.adopt(sys.spawn<caf::detached>(client_rejoiner, &nd, watching, h.dht(), nodes_key(g),
                                       caf::timespan{std::chrono::seconds(3)}));
  }
  std::shared_ptr<contribution> contrib;
  std::function<void(const metric_record&)> observe_own;
  if (s.volunteer && s.contribution_every.count() > 0 && !slot_name.empty()) {
    contrib = std::make_shared<contribution>();
    auto every = s.contribution_every;
    auto name = slot_name;
    h.adopt(spawn_ledger_reader(
      sys, h.dht(), g.name, every,
      [contrib, name](const std::vector<observe::ledger_entry>& got, double now, size_t) {
        std::lock_guard<std::mutex> guard{contrib->mtx};
        contrib->book.add_records(got, now);
        double computed = 0, accepted = 0;
        for (auto& row : contrib->book.rows())
          if (row.peer == name) {
            computed = row.computed;
            accepted = row.accepted;
          }
        contrib->count.ledger_read(computed, accepted);
        contrib->read.notify_all();
      }));
    observe_own = [contrib, name](const metric_record& m) {
      if (m.source != name || (m.kind != "dp_step" && m.kind != "dp_dropped"))
        return;
      std::lock_guard<std::mutex> guard{contrib->mtx};
      contrib->count.own_samples(m.value("samples", 0));
    };
    // The baseline before the instance starts (a read takes at most `every` per shard, in
    // parallel); without it by then, the first read that comes is the baseline.
    std::unique_lock<std::mutex> lock{contrib->mtx};
    contrib->read.wait_for(lock, std::max<nanoseconds>(std::chrono::seconds(10), 3 * every),
                           [&] { return contrib->count.has_baseline(); });
  }
  bool reporting = s.index == 0 && !s.volunteer;
  std::unique_ptr<metric_hub> hub;
  std::unique_ptr<metric_hub> local_log;
  // Node 0 reports the run: it serves the run's page when asked to (`node.http`, `--http`).
  // Any other node asked to serves one too, from the peers' ledger summaries in the DHT (the
  // metric stream goes to node 0): the run stays visible while node 0 is down. Nodes on one
  // machine given one fixed port by a shared YAML cannot all bind it: only node 0 fails on that.
  std::unique_ptr<run_watch> watch;
  if (!g.node.http.empty()) {
    auto w = run_watch::start(g.node.http, g, *p, run_mode::cluster);
    if (w) {
      watch = std::move(*w);
      watch->watch_gate(nd.gate(), gate_record_id(nd.key().public_key()));
      fmt::print("node{}: watch the run at {} (/status, /metrics, /ledger.csv)\n", s.index,
                 watch->url());
      std::fflush(stdout);
    } else if (reporting) {
      fmt::print(stderr, "starling: error: {}\n", w.error().what);
      h.stop();
      return 2;
    } else {
      log(log_level::warning, "http", "node{} serves no page: {}", s.index, w.error().what);
    }
  }
  if (reporting) {
    auto reporters = make_reporters(g);
    if (watch)
      reporters.insert(reporters.begin(), watch->make_reporter());
    hub = std::make_unique<metric_hub>(std::move(reporters), s.out_dir + "/metrics.jsonl");
    run_info info;
    info.graph = &g;
    info.plan = &*p;
    info.mode = run_mode::cluster;
    info.out_dir = s.out_dir;
    info.tty = ::isatty(2) != 0;
    hub->start(info);
    auto* hp = hub.get();
    h.sink = spawn_metric_sink(h, [hp](const metric_record& m) { hp->deliver(m); }, "");
  } else {
    h.sink = spawn_metric_sink(h, {}, "@0/metrics", observe_own);
  }
  h.register_actor("metrics", h.sink);
  h.adopt(h.sink);
  if (watch)
    if (auto r = watch->read_ledger(sys, h.dht(), g.node.ledger_every))
      h.adopt(r);
  // What this node's gate refuses goes to the run's ledger: every node's page shows it.
  if (auto gp = spawn_gate_publisher(sys, h.dht(), g.name, nd.gate(), g.node.ledger_every))
    h.adopt(gp);
  // The node's faults: its instances' kills, and partitions that include it. Its own kill is
  // the parent process's (`starling node` restarts this one).
  std::vector<size_t> mine;
  for (auto f : p->faults_of(s.index))
    if (p->faults[f].what != planned_fault::action::kill_node)
      mine.push_back(f);
  auto resolver = h.resolver();
  auto index = s.index;
  auto share = start_node_share(h, registry, s.incarnation, std::move(mine),
                                [resolver, index](const planned_fault& f) {
                                  std::vector<uint64_t> others;
                                  if (f.what == planned_fault::action::partition) {
                                    for (auto& grp : f.groups)
                                      if (std::find(grp.begin(), grp.end(), index) == grp.end())
                                        for (auto n : grp)
                                          others.push_back(n);
                                  }
                                  caf::anon_send(resolver, put_atom::value, others);
                                });
  if (s.incarnation > 0) // this process replaces one that a kill_node fault killed
    caf::anon_send(h.sink, messages::metric_event{fmt::format("node{}/faults", s.index),
                                                  "restart_node",
                                                  {{"incarnation", s.incarnation}},
                                                  {{"node", fmt::format("node{}", s.index)}}});
  fmt::print("node{} of {}: {} role instance(s), {} fault action(s); {} {}\n", s.index, s.count,
             share.children.size(), p->faults_of(s.index).size(),
             nd.listening() ? "listening on" : "in client mode, named", nd.endpoint());
  std::fflush(stdout);
  bool done = false;
  bool stopped = false;
  bool gone = false;
  int rc = 0;
  {
    // Scoped: a live scoped actor would keep the actor system from shutting down.
    caf::scoped_actor self{sys};
    double next = 1.0;
    auto next_line = std::chrono::steady_clock::now() + s.contribution_every;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (s.stop && s.stop()) {
        stopped = true;
        break;
      }
      if (watching->watched > 0 && watching->lost >= watching->watched) {
        gone = true;
        break;
      }
      if (contrib && std::chrono::steady_clock::now() >= next_line) {
        next_line += s.contribution_every;
        std::lock_guard<std::mutex> guard{contrib->mtx};
        fmt::print(
            "volunteer: your contribution: {:.0f} samples, {:.0f} accepted, uptime {}\n",
            contrib->count.samples(), contrib->count.accepted(),
            uptime_text(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count()));
        std::fflush(stdout);
      }
      auto t = seconds_of(h.elapsed());
      if (t >= next) {
        next = t + 1.0;
        if (reporting) {
          done = hub->tick(t);
        } else {
          self->request(h.dht(), std::chrono::seconds(1), get_atom::value, done_key(g))
            .receive(
              [&](const messages::dht_get_result& r) {
                for (auto& rec : r.records)
                  done = done || (!rec.has_subkey && !rec.value.empty());
              },
              [](caf::error&) {});
        }
      }
      if (done || h.elapsed() >= g.duration)
        break;
    }
    if (reporting) {
      // The reporters ask the live roles first; then the other nodes hear that the run is over.
      cluster_finish fin{h};
      fin.run_s = seconds_of(h.elapsed());
      fin.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
      fin.timed_out = !done && !stopped;
      fin.stopped = stopped;
      rc = hub->finish(fin);
      // Until another node holds it: stored on this node alone (a lookup that found nobody
      // under load), the mark would leave with this process and the others would run on until
      // the duration (seen once in the 4-process swarm-tiny test).
      auto want = std::min<uint32_t>(2, static_cast<uint32_t>(s.count));
      for (int attempt = 0; attempt < 5; ++attempt) {
        auto put = actors::dht::make_put(done_key(g), {'1'},
                                         actors::dht::dht_now_ns(self.ptr()) + 600'000'000'000);
        uint32_t accepted = 0;
        self->request(h.dht(), std::chrono::seconds(5), std::move(put))
          .receive(
            [&](const messages::dht_put_result& r) {
              accepted = r.wire_error.empty() ? r.accepted : 0;
            },
            [](caf::error&) {});
        if (accepted >= want)
          break;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    } else if (gone) {
      fmt::print(stderr, "starling: error: every node of the run this volunteer knew is gone "
                         "({} of {} lost); nothing left to work with\n",
                 watching->lost.load(), watching->watched.load());
      rc = 3;
    } else if (stopped && s.volunteer && s.graceful_leave && !slot_name.empty()) {
      // The round in flight ends first (at most the round's deadline), then the tombstones, then
      // the slot: each stored and acknowledged before the process goes.
      fmt::print("volunteer: leaving gracefully: no new work, the round in flight finishes "
                 "(a second Ctrl-C quits at once)\n");
      std::fflush(stdout);
      auto tomb = leave_instances(sys, nd.directory(), {slot_name}, std::chrono::seconds(90));
      if (keeper)
        caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
      auto released = release_slot(sys, h.dht(), slots_key(g), slot_name);
      fmt::print("volunteer: left: progress tombstone {}, slot {} released ({})\n",
                 !tomb         ? std::string{"not needed (no data-parallel peer)"}
                 : *tomb > 0   ? fmt::format("stored on {} DHT node(s)", *tomb)
                               : std::string{"NOT acknowledged"},
                 slot_name,
                 released > 0 ? fmt::format("stored on {} DHT node(s)", released)
                              : std::string{"NOT acknowledged"});
      rc = (tomb && *tomb == 0) || released == 0 ? 1 : 0;
    } else {
      fmt::print("node{} stopping ({}) after {:.1f} s\n", s.index,
                 stopped  ? "signal"
                 : done   ? "the run is complete"
                          : "duration",
                 seconds_of(h.elapsed()));
    }
  }
  h.stop();
  // The node's actors use this host and the hub until they are gone.
  nd.shutdown();
  // Every metric this node got is in: the ledger's file gets the peers' last numbers.
  if (hub)
    hub->close();
  return rc;
}

} // namespace starling::runtime
