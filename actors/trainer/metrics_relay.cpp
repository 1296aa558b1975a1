#include "actors/trainer/metrics_relay.hpp"

#include <caf/all.hpp>

#include <cmath>

#include "actors/collab/ledger_publisher.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"

namespace starling::actors::trainer {

namespace {

struct metrics_relay_state {
  static constexpr const char* name = "metrics_relay";
  metrics_relay_options opts;
};

caf::behavior metrics_relay(caf::stateful_actor<metrics_relay_state>* self,
                            metrics_relay_options opts) {
  self->state.opts = std::move(opts);
  return {
      [=](report_atom, const std::string&, double loss, int64_t samples, int64_t retries,
          double seconds, uint64_t batch) {
        auto& o = self->state.opts;
        caf::anon_send(o.sink, messages::metric_event{o.name,
                                                      "microbatch",
                                                      {{"loss", loss},
                                                       {"samples", static_cast<double>(samples)},
                                                       {"retries", static_cast<double>(retries)},
                                                       {"latency_s", seconds},
                                                       {"batch", static_cast<double>(batch)}},
                                                      {}});
        if (o.ledger) {
          caf::anon_send(o.ledger, collab::ledger_add_atom::value, static_cast<double>(samples),
                         0.0, 0.0, 0.0);
          caf::anon_send(o.ledger, collab::ledger_gauge_atom::value, loss, std::nan(""));
        }
      },
      [=](stop_atom, const std::string&) {
        auto& o = self->state.opts;
        caf::anon_send(o.sink, messages::metric_event{o.name, "done", {}, {}});
      },
  };
}

} // namespace

caf::actor spawn_metrics_relay(caf::actor_system& sys, metrics_relay_options opts) {
  return sys.spawn(metrics_relay, std::move(opts));
}

} // namespace starling::actors::trainer
