#include "runtime/experiment/final_model.hpp"

#include <algorithm>
#include <fstream>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/models/torchscript.hpp"
#include "messages/atoms.hpp"
#include "runtime/experiment/download.hpp"

namespace starling::runtime {

std::vector<final_candidate> survey_peers(finish_context& ctx, const std::vector<caf::actor>& peers,
                                          const std::vector<std::string>& names,
                                          const final_model_options& opts,
                                          const std::function<void(const final_candidate&)>& each) {
  std::vector<final_candidate> out;
  auto needed = std::max(opts.min_counters, opts.steps_at + 1);
  for (size_t j = 0; j < peers.size(); ++j) {
    auto c = ask<std::vector<uint64_t>>(ctx, peers[j], opts.ask_timeout, status_atom::value);
    if (!c || std::get<0>(*c).size() < needed)
      continue;
    final_candidate x;
    x.name = j < names.size() ? names[j] : fmt::format("#{}", j);
    x.peer = peers[j];
    x.counters = std::move(std::get<0>(*c));
    x.steps = x.counters[opts.steps_at];
    out.push_back(std::move(x));
    if (each)
      each(out.back());
  }
  return out;
}

std::vector<final_candidate> rank_candidates(std::vector<final_candidate> candidates) {
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.steps > b.steps; });
  return candidates;
}

result<actors::collab::downloaded_state>
download_most_trained(finish_context& ctx, const std::vector<final_candidate>& candidates,
                      const final_model_options& opts) {
  auto ranked = rank_candidates(candidates);
  std::vector<caf::actor> donors;
  for (size_t i = 0; i < ranked.size() && i < opts.donors; ++i)
    donors.push_back(ranked[i].peer);
  if (donors.empty())
    return fail("no live peer answered");
  auto n = static_cast<int64_t>(donors.size());
  auto wait = opts.download.timeout * n + std::chrono::seconds(1);
  return download_state(ctx, actors::collab::donor_source::of(std::move(donors)), opts.download,
                        wait);
}

result<actors::collab::downloaded_state> download_from(finish_context& ctx, const caf::actor& peer,
                                                       std::chrono::nanoseconds timeout) {
  actors::collab::download_options o;
  o.timeout = std::chrono::duration_cast<caf::timespan>(timeout);
  return download_state(ctx, actors::collab::donor_source::of({peer}), o,
                        o.timeout + std::chrono::seconds(1));
}

void pass_time(finish_context& ctx, std::chrono::nanoseconds d) {
  // An actor that never quits: the context waits for the whole of `d` on its clock.
  ctx.run([](caf::event_based_actor*) {}, d);
}

result<std::vector<std::string>>
export_final_model(const std::vector<kernels::stage_module*>& modules, const std::string& dir,
                   const nlohmann::json& fields) {
  std::vector<std::string> files;
  for (size_t k = 0; k < modules.size(); ++k) {
    auto written = kernels::export_stage(*modules[k], static_cast<int64_t>(k), dir);
    if (!written)
      return written.error();
    files.insert(files.end(), written->torchscript.begin(), written->torchscript.end());
    files.insert(files.end(), written->state_dicts.begin(), written->state_dicts.end());
  }
  auto j = fields;
  j["files"] = files;
  std::ofstream out{dir + "/export.json"};
  out << j.dump(2) << "\n";
  out.close();
  if (!out)
    return fail(fmt::format("{}/export.json: cannot write", dir));
  return files;
}

} // namespace starling::runtime
