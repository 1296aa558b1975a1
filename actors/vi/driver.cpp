#include "actors/vi/driver.hpp"

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/vi.hpp"

namespace starling::actors::vi {

namespace {

using messages::metric_event;
using messages::vi_report;

struct driver_state {
  static constexpr const char* name = "vi_driver";
  driver_options opts;
  /// The workers resolved so far, in the order their resolutions came back.
  std::vector<caf::actor> workers;
  caf::actor server;
};

using driver_actor = caf::stateful_actor<driver_state>;

void failed(driver_actor* self, const std::string& reason) {
  self->send(self->state.opts.sink,
             metric_event{self->state.opts.name, "failed", {}, {{"reason", reason}}});
}

/// Runs a segment of `n` iterations, then the next one the policy asks for.
void run_segment(driver_actor* self, uint64_t n) {
  self->request(self->state.server, caf::infinite, vi_run_atom::value, n)
      .then(
          [=](vi_report& r) {
            auto& o = self->state.opts;
            if (!r.wire_error.empty()) {
              // A report whose envelope was refused carries no numbers: the run fails with why.
              failed(self, "report refused: " + r.wire_error);
              return;
            }
            metric_event m{o.name, "segment", {}, {}};
            m.values["iterations"] = static_cast<double>(r.iterations);
            m.values["bits_up"] = static_cast<double>(r.bits_up);
            m.values["bits_down"] = static_cast<double>(r.bits_down);
            m.values["live_workers"] = r.live_workers;
            auto more = o.next(&r, m);
            self->send(o.sink, std::move(m));
            if (more > 0)
              run_segment(self, more);
            else
              self->send(o.sink, metric_event{o.name, "done", {}, {}});
          },
          [=](caf::error& e) { failed(self, self->system().render(e)); });
}

caf::behavior driver(driver_actor* self, driver_options opts) {
  self->state.opts = std::move(opts);
  auto& o = self->state.opts;
  for (auto& t : o.workers)
    self->request(o.resolver, std::chrono::seconds(10), resolve_atom::value, t)
        .then(
            [=](const caf::actor& w) {
              auto& st = self->state;
              st.workers.push_back(w);
              if (st.workers.size() < st.opts.workers.size())
                return;
              st.server = spawn_server(self->system(), st.opts.dim, st.workers, st.opts.server);
              self->link_to(st.server);
              metric_event m{st.opts.name, "start", {}, {}};
              if (auto n = st.opts.next(nullptr, m); n > 0)
                run_segment(self, n);
            },
            [=](caf::error& e) { failed(self, "worker " + t + ": " + self->system().render(e)); });
  return {[](stop_atom) {}};
}

} // namespace

caf::actor spawn_driver(caf::actor_system& sys, driver_options opts) {
  return sys.spawn(driver, std::move(opts));
}

} // namespace starling::actors::vi
