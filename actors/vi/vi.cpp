#include "actors/vi/vi.hpp"

#include <optional>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "messages/atoms.hpp"
#include "messages/vi.hpp"

using starling::messages::vi_downlink;
using starling::messages::vi_phase;
using starling::messages::vi_report;
using starling::messages::vi_uplink;

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const starling::actors::vi::vi_problem>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(starling::actors::vi::method_options)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(starling::actors::vi::server_options)

namespace starling::actors::vi {

namespace {

// --- worker ---------------------------------------------------------------------------------

struct worker_state {
  std::optional<worker_core> core;
  static inline const char* name = "vi_worker";
};

vi_report report_of(const worker_core& core) {
  vi_report r;
  r.iterations = core.iterations();
  r.z = core.z();
  r.bits_up = core.bits_up();
  r.bits_down = core.bits_down();
  return r;
}

caf::behavior worker_impl(caf::stateful_actor<worker_state>* self,
                          std::shared_ptr<const vi_problem> problem, std::size_t index,
                          method_options options) {
  const auto dim = problem->dim();
  self->state.core.emplace(std::move(problem), index, options, std::vector<double>(dim, 0.0));
  return {
    [=](vi_step_atom, const vi_downlink& d, bool apply) -> caf::result<vi_uplink> {
      // A downlink whose envelope was refused (counted by the wire context): answer the reason.
      if (!d.wire_error.empty())
        return caf::make_error(caf::sec::invalid_argument, d.wire_error);
      auto& core = *self->state.core;
      if (apply)
        if (auto st = core.downlink(d); !st)
          return caf::make_error(caf::sec::runtime_error, st.what());
      return core.uplink();
    },
    [=](vi_finish_atom, const vi_downlink& d) -> caf::result<vi_report> {
      if (!d.wire_error.empty())
        return caf::make_error(caf::sec::invalid_argument, d.wire_error);
      auto& core = *self->state.core;
      if (auto st = core.downlink(d); !st)
        return caf::make_error(caf::sec::runtime_error, st.what());
      return report_of(core);
    },
  };
}

// --- server ---------------------------------------------------------------------------------

struct server_state {
  std::optional<server_core> core;
  std::vector<caf::actor> workers;
  std::vector<bool> alive;
  server_options options;
  caf::response_promise promise;
  bool running = false;
  uint64_t target = 0;
  uint64_t iterations = 0;
  std::vector<vi_uplink> uplinks;
  std::vector<std::pair<std::size_t, vi_report>> reports;
  std::size_t outstanding = 0;
  static inline const char* name = "vi_server";
};

using server_actor = caf::stateful_actor<server_state>;

std::size_t live_count(const server_state& st) {
  return static_cast<std::size_t>(std::count(st.alive.begin(), st.alive.end(), true));
}

void abort_run(server_actor* self, std::string why) {
  auto& st = self->state;
  if (!st.running)
    return;
  st.running = false;
  st.promise.deliver(caf::make_error(caf::sec::runtime_error, std::move(why)));
}

/// Marks worker i as lost; under `fail` (or with nobody left) the run ends with an error.
void lose_worker(server_actor* self, std::size_t i, const std::string& reason) {
  auto& st = self->state;
  if (!st.alive[i])
    return;
  st.alive[i] = false;
  if (st.options.on_worker_loss == worker_loss_policy::fail)
    abort_run(self, fmt::format("vi server: worker {} lost in round {} ({}); on_worker_loss = fail",
                                i, st.core->round(), reason));
  else if (live_count(st) == 0)
    abort_run(self, fmt::format("vi server: all {} workers lost", st.workers.size()));
}

void step_round(server_actor* self, const vi_downlink& d, bool apply);

void finish_round(server_actor* self) {
  auto& st = self->state;
  if (!st.running)
    return;
  if (st.reports.empty()) {
    abort_run(self, "vi server: no worker reported its final state");
    return;
  }
  std::sort(st.reports.begin(), st.reports.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  auto r = std::move(st.reports.front().second);
  r.live_workers = static_cast<uint32_t>(live_count(st));
  st.running = false;
  st.promise.deliver(std::move(r));
}

/// Called once per answered (or failed) request of a round; aggregates once all are in.
void on_uplink_done(server_actor* self) {
  auto& st = self->state;
  if (--st.outstanding > 0 || !st.running)
    return;
  auto down = st.core->aggregate(st.uplinks);
  if (!down) {
    abort_run(self, "vi server: " + down.error().what);
    return;
  }
  const auto phase = static_cast<vi_phase>(down->phase);
  if (phase == vi_phase::compressed || phase == vi_phase::eg_half)
    ++st.iterations;
  if (st.iterations < st.target) {
    step_round(self, *down, true);
    return;
  }
  // Last iteration: workers apply it and report instead of starting another round.
  st.reports.clear();
  for (std::size_t i = 0; i < st.workers.size(); ++i) {
    if (!st.alive[i])
      continue;
    ++st.outstanding;
    self->request(st.workers[i], st.options.timeout, vi_finish_atom::value, *down)
      .then(
        [=](vi_report& r) {
          if (!r.wire_error.empty())
            lose_worker(self, i, r.wire_error);
          else
            self->state.reports.emplace_back(i, std::move(r));
          if (--self->state.outstanding == 0)
            finish_round(self);
        },
        [=](caf::error& e) {
          lose_worker(self, i, self->system().render(e));
          if (--self->state.outstanding == 0)
            finish_round(self);
        });
  }
}

void step_round(server_actor* self, const vi_downlink& d, bool apply) {
  auto& st = self->state;
  st.uplinks.clear();
  for (std::size_t i = 0; i < st.workers.size(); ++i) {
    if (!st.alive[i])
      continue;
    ++st.outstanding;
    self->request(st.workers[i], st.options.timeout, vi_step_atom::value, d, apply)
      .then(
        [=](vi_uplink& u) {
          // An uplink whose envelope was refused carries no vector: the worker is lost.
          if (!u.wire_error.empty())
            lose_worker(self, i, u.wire_error);
          else
            self->state.uplinks.push_back(std::move(u));
          on_uplink_done(self);
        },
        [=](caf::error& e) {
          lose_worker(self, i, self->system().render(e));
          on_uplink_done(self);
        });
  }
}

caf::behavior server_impl(server_actor* self, std::size_t dim, std::vector<caf::actor> workers,
                          server_options options) {
  auto& st = self->state;
  st.core.emplace(dim, options.method);
  st.options = options;
  st.alive.assign(workers.size(), true);
  for (auto& w : workers)
    self->monitor(w);
  st.workers = std::move(workers);
  // A dead worker is noticed here at once; its pending request then fails and is counted.
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    for (std::size_t i = 0; i < s.workers.size(); ++i)
      if (s.workers[i].address() == dm.source)
        lose_worker(self, i, self->system().render(dm.reason));
  });
  return {
    [=](vi_run_atom, uint64_t iterations) -> caf::result<vi_report> {
      auto& s = self->state;
      if (s.running)
        return caf::make_error(caf::sec::runtime_error, "vi server: a run is already in progress");
      if (iterations == 0)
        return caf::make_error(caf::sec::runtime_error, "vi server: asked for 0 iterations");
      if (live_count(s) == 0)
        return caf::make_error(caf::sec::runtime_error, "vi server: no live worker");
      // A later run continues where the previous one stopped (the workers applied its last
      // downlink in vi_finish), so a long run can be observed in segments.
      s.promise = self->make_response_promise<vi_report>();
      s.running = true;
      s.target = s.iterations + iterations;
      step_round(self, vi_downlink{}, false);
      return s.promise;
    },
  };
}

} // namespace

caf::actor spawn_worker(caf::actor_system& sys, std::shared_ptr<const vi_problem> problem,
                        std::size_t index, const method_options& options) {
  return sys.spawn(worker_impl, std::move(problem), index, options);
}

caf::actor spawn_server(caf::actor_system& sys, std::size_t dim, std::vector<caf::actor> workers,
                        const server_options& options) {
  return sys.spawn(server_impl, dim, std::move(workers), options);
}

} // namespace starling::actors::vi
