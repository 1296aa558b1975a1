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

/// A live peer of a stage and its last report.
struct board_entry {
  std::string name;
  caf::actor handle;
  /// Whether `throughput` and `queue` hold a report.
  bool reported = false;
  double throughput = 0;
  double queue = 0;
};

/// A stage's live peers sorted by name: every read walks them all in that order (sums of
/// throughputs keep their order, hence their rounding), and a contiguous walk over 1250 peers
/// costs microseconds where a tree walk with a lookup per peer cost a large run most of its time.
class stage_entries {
public:
  std::vector<board_entry>& all() { return xs_; }
  const std::vector<board_entry>& all() const { return xs_; }
  size_t size() const { return xs_.size(); }
  bool empty() const { return xs_.empty(); }

  /// The entry named `name`, or null.
  board_entry* find(const std::string& name) {
    auto i = lower(name);
    return i != xs_.end() && i->name == name ? &*i : nullptr;
  }

  /// The entry named `name`, made (unreported) if new.
  board_entry& at(const std::string& name) {
    auto i = lower(name);
    if (i == xs_.end() || i->name != name)
      i = xs_.insert(i, board_entry{name, {}, false, 0, 0});
    return *i;
  }

private:
  std::vector<board_entry>::iterator lower(const std::string& name) {
    return std::lower_bound(xs_.begin(), xs_.end(), name,
                            [](const board_entry& e, const std::string& n) { return e.name < n; });
  }

  std::vector<board_entry> xs_;
};

struct board_state {
  /// Per stage, its live peers with their reported (throughput, queue).
  std::vector<stage_entries> stages;
  /// Peers joining each stage: (until, expected throughput).
  std::vector<std::vector<std::pair<caf::actor_clock::time_point, double>>> joining;
  /// When a move out of each stage was last granted.
  /// Per stage, when the moves out of it granted during the last period were granted.
  std::vector<std::vector<caf::actor_clock::time_point>> moves;
};

caf::behavior board(caf::stateful_actor<board_state>* self, size_t stages) {
  self->state.stages.resize(stages);
  self->state.moves.resize(stages);
  self->state.joining.resize(stages);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& s : st.stages) {
      auto& xs = s.all();
      xs.erase(std::remove_if(xs.begin(), xs.end(),
                              [&](const board_entry& e) { return e.handle.address() == dm.source; }),
               xs.end());
    }
  });
  return {
    [=](put_atom, uint64_t stage, const std::string& name,
        const caf::actor& peer) -> caf::result<void> {
      if (stage >= self->state.stages.size())
        return caf::make_error(caf::sec::invalid_argument, "no stage " + std::to_string(stage));
      self->monitor(peer);
      self->state.stages[stage].at(name).handle = peer;
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
      auto& xs = self->state.stages[stage].all();
      names.reserve(xs.size());
      handles.reserve(xs.size());
      for (auto& e : xs) {
        names.push_back(e.name);
        handles.push_back(e.handle);
      }
      return {std::move(names), std::move(handles)};
    },
    [=](load_atom, uint64_t stage, const std::string& name, double throughput, double queue) {
      auto& st = self->state;
      if (stage >= st.stages.size() || !(throughput > 0) || !std::isfinite(throughput))
        return;
      auto e = st.stages[stage].find(name);
      if (!e)
        return;
      e->reported = true;
      e->throughput = throughput;
      e->queue = queue;
    },
    [=](get_atom, load_atom, const caf::actor& peer)
      -> caf::result<std::vector<double>, std::vector<int64_t>, double> {
      auto& st = self->state;
      std::vector<double> throughput(st.stages.size(), 0.0);
      std::vector<int64_t> peers(st.stages.size(), 0);
      double mine = -1;
      // Raw pointers: the same identity as comparing the handles, without a call per peer.
      auto me = peer ? caf::actor_cast<caf::abstract_actor*>(peer) : nullptr;
      for (size_t k = 0; k < st.stages.size(); ++k) {
        double sum = 0;
        int64_t reported = 0;
        for (auto& e : st.stages[k].all()) {
          if (e.reported) {
            sum += e.throughput;
            ++reported;
            if (me && caf::actor_cast<caf::abstract_actor*>(e.handle) == me)
              mine = e.throughput;
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
    [=](put_atom, load_atom, caf::timespan hold) {
      return self->delegate(caf::actor_cast<caf::actor>(self), put_atom::value, load_atom::value,
                            hold, false);
    },
    [=](put_atom, load_atom, caf::timespan hold, bool all_known) -> uint64_t {
      // Placement of a new peer: the stage with the least throughput (unknown stages aside; with
      // `all_known`, none while a stage is unknown or nothing reported yet), reserved at once so
      // that peers placed at the same instant spread out.
      auto& st = self->state;
      auto now = self->clock().now();
      std::optional<uint64_t> best;
      double best_tp = 0;
      std::vector<double> avgs(st.stages.size(), -1);
      bool any_report = false;
      for (auto& stage : st.stages)
        for (auto& e : stage.all())
          any_report = any_report || e.reported;
      if (all_known && !any_report)
        return std::numeric_limits<uint64_t>::max();
      for (size_t k = 0; k < st.stages.size(); ++k) {
        double sum = 0;
        int64_t reported = 0;
        for (auto& e : st.stages[k].all()) {
          if (e.reported) {
            sum += e.throughput;
            ++reported;
          }
        }
        if (!st.stages[k].empty() && reported == 0) {
          if (all_known)
            return std::numeric_limits<uint64_t>::max();
          continue; // unknown
        }
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
