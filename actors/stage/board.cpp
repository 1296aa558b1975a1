#include "actors/stage/board.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include <cmath>
#include <limits>

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"

namespace starling::actors::stage {

namespace {

struct board_state {
  std::vector<std::map<std::string, caf::actor>> stages;
  /// Reported (throughput, queue) per stage and peer name.
  std::vector<std::map<std::string, std::pair<double, double>>> loads;
  /// Peers joining each stage: (until, expected throughput).
  std::vector<std::vector<std::pair<caf::actor_clock::time_point, double>>> joining;
  /// When a move out of each stage was last granted.
  /// Per stage, when the moves out of it granted during the last period were granted.
  std::vector<std::vector<caf::actor_clock::time_point>> moves;
};

caf::behavior board(caf::stateful_actor<board_state>* self, size_t stages) {
  self->state.stages.resize(stages);
  self->state.loads.resize(stages);
  self->state.moves.resize(stages);
  self->state.joining.resize(stages);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t k = 0; k < st.stages.size(); ++k) {
      auto& s = st.stages[k];
      for (auto i = s.begin(); i != s.end();) {
        if (i->second.address() == dm.source) {
          st.loads[k].erase(i->first);
          i = s.erase(i);
        } else {
          i = std::next(i);
        }
      }
    }
  });
  return {
    [=](put_atom, uint64_t stage, const std::string& name,
        const caf::actor& peer) -> caf::result<void> {
      if (stage >= self->state.stages.size())
        return caf::make_error(caf::sec::invalid_argument, "no stage " + std::to_string(stage));
      self->monitor(peer);
      self->state.stages[stage][name] = peer;
      auto& j = self->state.joining[stage];
      if (!j.empty())
        j.erase(j.begin()); // the joiner announced itself (the oldest one, as far as we know)
      return caf::unit;
    },
    [=](get_atom, uint64_t stage)
      -> caf::result<std::vector<std::string>, std::vector<caf::actor>> {
      if (stage >= self->state.stages.size())
        return caf::make_error(caf::sec::invalid_argument, "no stage " + std::to_string(stage));
      std::vector<std::string> names;
      std::vector<caf::actor> handles;
      for (auto& kv : self->state.stages[stage]) {
        names.push_back(kv.first);
        handles.push_back(kv.second);
      }
      return {std::move(names), std::move(handles)};
    },
    [=](load_atom, uint64_t stage, const std::string& name, double throughput, double queue) {
      auto& st = self->state;
      if (stage >= st.stages.size() || st.stages[stage].count(name) == 0
          || !(throughput > 0) || !std::isfinite(throughput))
        return;
      st.loads[stage][name] = {throughput, queue};
    },
    [=](get_atom, load_atom, const caf::actor& peer)
      -> caf::result<std::vector<double>, std::vector<int64_t>, double> {
      auto& st = self->state;
      std::vector<double> throughput(st.stages.size(), 0.0);
      std::vector<int64_t> peers(st.stages.size(), 0);
      double mine = -1;
      for (size_t k = 0; k < st.stages.size(); ++k) {
        double sum = 0;
        int64_t reported = 0;
        for (auto& [name, handle] : st.stages[k]) {
          auto i = st.loads[k].find(name);
          if (i != st.loads[k].end()) {
            sum += i->second.first;
            ++reported;
            if (peer && handle == peer)
              mine = i->second.first;
          }
        }
        peers[k] = static_cast<int64_t>(st.stages[k].size());
        auto now = self->clock().now();
        auto& j = st.joining[k];
        j.erase(std::remove_if(j.begin(), j.end(), [&](auto& x) { return x.first <= now; }),
                j.end());
        double avg = reported > 0 ? sum / static_cast<double>(reported) : -1;
        if (peers[k] > 0 && reported == 0) {
          throughput[k] = -1;
          continue;
        }
        throughput[k] = avg > 0 ? avg * static_cast<double>(peers[k]) : 0;
        for (auto& x : j) {
          auto tp = x.second > 0 ? x.second : avg;
          if (tp <= 0)
            continue; // nothing to compare with: the joiner is not counted
          throughput[k] += tp;
          peers[k]++;
        }
      }
      return {std::move(throughput), std::move(peers), mine};
    },
    [=](put_atom, load_atom, caf::timespan hold) -> uint64_t {
      // Placement of a new peer: the stage with the least throughput (unknown stages aside),
      // reserved at once so that peers placed at the same instant spread out.
      auto& st = self->state;
      auto now = self->clock().now();
      std::optional<uint64_t> best;
      double best_tp = 0;
      std::vector<double> avgs(st.stages.size(), -1);
      for (size_t k = 0; k < st.stages.size(); ++k) {
        double sum = 0;
        int64_t reported = 0;
        for (auto& [name, handle] : st.stages[k]) {
          auto i = st.loads[k].find(name);
          if (i != st.loads[k].end()) {
            sum += i->second.first;
            ++reported;
          }
        }
        if (!st.stages[k].empty() && reported == 0)
          continue; // unknown
        double avg = reported > 0 ? sum / static_cast<double>(reported) : 0;
        avgs[k] = avg;
        double tp = avg * static_cast<double>(st.stages[k].size());
        auto& j = st.joining[k];
        j.erase(std::remove_if(j.begin(), j.end(), [&](auto& x) { return x.first <= now; }),
                j.end());
        for (auto& x : j)
          tp += x.second > 0 ? x.second : avg;
        if (!best || tp < best_tp) {
          best = k;
          best_tp = tp;
        }
      }
      if (!best)
        return std::numeric_limits<uint64_t>::max(); // nothing known: the caller keeps its stage
      st.joining[*best].emplace_back(now + hold, avgs[*best]);
      return *best;
    },
    [=](put_atom, load_atom, uint64_t stage, double throughput, caf::timespan hold) {
      auto& st = self->state;
      if (stage >= st.stages.size() || !std::isfinite(throughput))
        return;
      st.joining[stage].emplace_back(self->clock().now() + hold, throughput);
    },
    [=](migrate_atom, uint64_t from, caf::timespan period, uint64_t slots) -> bool {
      auto& st = self->state;
      if (from >= st.stages.size() || slots == 0)
        return false;
      auto now = self->clock().now();
      auto& granted = st.moves[from];
      granted.erase(std::remove_if(granted.begin(), granted.end(),
                                   [&](auto t) { return now - t >= period; }),
                    granted.end());
      if (granted.size() >= slots)
        return false;
      granted.push_back(now);
      return true;
    },
    [=](migrate_atom, uint64_t from, caf::timespan period) {
      return self->delegate(caf::actor_cast<caf::actor>(self), migrate_atom::value, from, period,
                            uint64_t{1});
    },
    [=](list_atom) {
      std::vector<uint64_t> counts;
      for (auto& s : self->state.stages)
        counts.push_back(s.size());
      return counts;
    },
  };
}

} // namespace

caf::actor spawn_board(caf::actor_system& sys, size_t stages) {
  return sys.spawn(board, stages);
}

} // namespace starling::actors::stage
