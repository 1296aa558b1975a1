#include "runtime/observe/status.hpp"

#include <cmath>

#include <nlohmann/json.hpp>

#include "runtime/observe/exposition.hpp"
#include "runtime/observe/snapshot.hpp"

namespace starling::runtime::observe {

namespace {

nlohmann::json number(double v) {
  if (!std::isfinite(v))
    return nullptr;
  return v;
}

} // namespace

std::string render_status(const snapshot& s) {
  nlohmann::json j;
  j["version"] = s.version;
  j["run"] = {{"experiment", s.run.experiment},
              {"kind", s.run.kind},
              {"mode", s.run.mode},
              {"nodes", s.run.nodes},
              {"seed", s.run.seed},
              {"start_unix_s", number(s.run.start_unix_s)}};
  j["run_time_s"] = number(s.run_time_s);
  j["finished"] = s.finished;
  // Every family of /metrics: an unlabelled one as its value, a labelled one as an object keyed
  // by its label's value (each family here has at most one label, except starling_run_info,
  // which `run` above carries).
  auto& metrics = j["metrics"] = nlohmann::json::object();
  for (auto& f : families_of(s)) {
    if (f.name == "starling_run_info")
      continue;
    if (f.samples.size() == 1 && f.samples[0].labels.empty()) {
      metrics[f.name] = number(f.samples[0].value);
      continue;
    }
    auto& m = metrics[f.name] = nlohmann::json::object();
    for (auto& x : f.samples)
      if (x.labels.size() == 1)
        m[x.labels[0].second] = number(x.value);
  }
  auto& members = j["members"] = nlohmann::json::array();
  for (auto& m : s.members)
    members.push_back({{"name", m.name},
                       {"role", m.role},
                       {"detail", m.detail},
                       {"node", m.node},
                       {"live", m.live},
                       {"last_seen_s", number(m.last_seen_s)},
                       {"samples", number(m.samples)},
                       {"restarts", m.restarts}});
  // The ledger's first rows (all of them in /ledger.csv): the page stays light with many peers.
  auto& ledger = j["ledger"] = nlohmann::json::array();
  for (size_t i = 0; i < s.ledger.size() && i < max_status_ledger_rows; ++i) {
    auto& r = s.ledger[i];
    ledger.push_back({{"peer", r.peer},
                      {"peer_id", r.peer_id},
                      {"computed", number(r.computed)},
                      {"accepted", number(r.accepted)},
                      {"dropped", number(r.dropped)},
                      {"rounds", number(r.rounds)},
                      {"rounds_averaged", number(r.rounds_averaged)},
                      {"uptime_s", number(r.uptime_s)},
                      {"bytes_sent", number(r.bytes_sent)},
                      {"bytes_received", number(r.bytes_received)},
                      {"refusals", r.refusals},
                      {"refused_by", r.refused_by},
                      {"banned", r.banned},
                      {"ban_reason", r.ban_reason},
                      {"left", r.left},
                      {"record", r.record},
                      {"stage", r.stage},
                      {"loss", number(r.loss)},
                      {"step", number(r.step)},
                      {"token_id", r.token_id}});
  }
  j["ledger_rows"] = s.ledger.size();
  auto& curve = j["loss_curve"] = nlohmann::json::array();
  for (auto& [t, l] : s.loss_curve)
    curve.push_back({number(t), number(l)});
  // Strings from peers may hold any bytes: replace what is not UTF-8 instead of throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace starling::runtime::observe
