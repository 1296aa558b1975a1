#include "runtime/experiment/watch.hpp"

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "runtime/config/config.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/log/log.hpp"
#include "runtime/observe/http_server.hpp"
#include "runtime/observe/snapshot.hpp"

namespace starling::runtime {

/// The builder (fed under the metric hub's lock) and the store the handlers read.
struct run_watch::state {
  explicit state(observe::run_description run) : builder(std::move(run)) {}
  observe::snapshot_builder builder;
  std::shared_ptr<observe::snapshot_store> store = std::make_shared<observe::snapshot_store>();
  std::chrono::steady_clock::time_point last_publish{};

  void publish() {
    last_publish = std::chrono::steady_clock::now();
    store->publish(builder.make());
  }
};

namespace {

/// Publishes a snapshot at most every 200 ms of wall time, from the stream and the ticks (a
/// simulated run ticks once per virtual second, which can be thousands of times a second of
/// wall time), and always at the end.
class watch_reporter : public reporter {
public:
  explicit watch_reporter(std::shared_ptr<run_watch::state> st) : st_(std::move(st)) {}

  void on_metric(const metric_record& m) override {
    st_->builder.add({m.t, m.node, m.source, m.kind, m.values, m.labels});
    if (std::chrono::steady_clock::now() - st_->last_publish >= std::chrono::milliseconds(200))
      st_->publish();
  }

  bool tick(double t) override {
    st_->builder.advance(t);
    if (std::chrono::steady_clock::now() - st_->last_publish >= std::chrono::milliseconds(200))
      st_->publish();
    return false;
  }

  int finish(finish_context& ctx) override {
    st_->builder.advance(ctx.run_s);
    st_->builder.finish();
    st_->publish();
    return 0;
  }

private:
  std::shared_ptr<run_watch::state> st_;
};

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
  w->state_->publish();
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
  fmt::print("{}watch the run at {} (/status, /metrics){}\n", prefix, (*w)->url(),
             mode == run_mode::sim ? "; times on the page are the simulation's virtual time" : "");
  std::fflush(stdout);
  return w;
}

} // namespace starling::runtime
