#include "actors/collab/settle.hpp"

#include <fmt/format.h>

#include "messages/averager.hpp"

namespace starling::actors::collab {

averaging_input::averaging_input(at::Tensor own) : own_(own.defined() ? own.reshape({-1}) : own) {}

at::Tensor averaging_input::for_averager() const {
  return own_.defined() ? own_.clone() : own_;
}

settled_round settle(const messages::average_result& res, const averaging_input& input,
                     size_t min_members) {
  using messages::part_status;
  using messages::round_outcome;
  settled_round out;
  auto own = input.own();
  out.values = own;
  auto no_average = [&](std::string why) {
    out.kind = settled_kind::own;
    out.values = own;
    out.parts_averaged = 0;
    out.parts_own = 0;
    out.why = std::move(why);
    return out;
  };
  if (!own.defined())
    return no_average("no own values");
  auto& r = res.report;
  if (r.outcome != round_outcome::complete && r.outcome != round_outcome::partial)
    return no_average(fmt::format("round {}{}{}", messages::to_string(r.outcome),
                                  r.detail.empty() ? "" : ": ", r.detail));
  if (r.members.size() < min_members)
    return no_average(fmt::format("a group of {} (at least {} wanted)", r.members.size(),
                                  min_members));
  if (res.tensors.size() != 1 || !res.tensors[0].ok() || !res.tensors[0].tensor.defined())
    return no_average("the answer holds no one decoded tensor");
  auto n = own.numel();
  auto& t = res.tensors[0].tensor;
  if (t.numel() != n)
    return no_average(fmt::format("the answer has {} elements, the request {}", t.numel(), n));
  // The parts must tile the vector: each in range, together covering every element once.
  int64_t covered = 0;
  std::string first_reason;
  for (auto& p : r.parts) {
    if (p.offset < 0 || p.size < 0 || p.offset > n - p.size)
      return no_average(fmt::format("a part [{}, +{}) outside the vector of {}", p.offset, p.size,
                                    n));
    covered += p.size;
    if (p.size == 0)
      continue;
    if (p.status == part_status::averaged) {
      out.parts_averaged++;
    } else {
      out.parts_own++;
      if (first_reason.empty())
        first_reason = p.reason.empty() ? messages::to_string(p.status) : p.reason;
    }
  }
  if (covered != n)
    return no_average(fmt::format("the parts cover {} of {} elements", covered, n));
  if (out.parts_averaged == 0 && n > 0)
    return no_average(first_reason.empty() ? "no part averaged" : first_reason);
  auto result = t.reshape({-1});
  if (result.scalar_type() != own.scalar_type())
    result = result.to(own.scalar_type());
  if (out.parts_own == 0) {
    out.kind = settled_kind::averaged;
    out.values = result;
    return out;
  }
  // Whole parts: averaged ones from the result, the others from the kept own values (not the
  // averager's buffer, which holds whatever of their result had arrived).
  out.kind = settled_kind::partial;
  out.values = own.clone();
  for (auto& p : r.parts)
    if (p.size > 0 && p.status == part_status::averaged)
      out.values.narrow(0, p.offset, p.size).copy_(result.narrow(0, p.offset, p.size));
  out.why = fmt::format("{} of {} parts kept own values: {}", out.parts_own,
                        out.parts_own + out.parts_averaged, first_reason);
  return out;
}

} // namespace starling::actors::collab
