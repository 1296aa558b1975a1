// The periodic throughput report a stage peer (real or modeled) sends its board for rebalancing.
#pragma once

#include <caf/all.hpp>

#include "messages/rebalance_atoms.hpp"

namespace starling::actors::stage {

/// Handles the peer's `(load_atom)` tick: schedules the next one after `report_every` and, once
/// the peer serves, sends `(load_atom, stage, name, throughput, queue)` to its board with the
/// smoothed throughput of its `meter` (nothing when the last period measured nothing). `Self`'s
/// state has `opts`, `ready`, `meter` and `board`.
template <class Self>
void report_load(Self* self, double queue) {
  auto& s = self->state;
  self->delayed_send(self, s.opts.report_every, load_atom::value);
  if (!s.ready)
    return;
  if (auto throughput = s.meter.close())
    self->send(s.board, load_atom::value, s.opts.stage, s.opts.name, *throughput, queue);
}

} // namespace starling::actors::stage
