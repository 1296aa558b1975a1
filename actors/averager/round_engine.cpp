#include "actors/averager/round_engine.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <sodium.h>
#include <torch/torch.h>

namespace starling::actors::averager {

namespace {

/// A part's received result chunks as segments: in order, adjacent chunks with the same
/// contributors merged.
std::vector<part_segment> merge_pieces(std::vector<part_segment> pieces) {
  std::sort(pieces.begin(), pieces.end(),
            [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::vector<part_segment> out;
  for (auto& p : pieces) {
    std::sort(p.contributors.begin(), p.contributors.end());
    p.contributors.erase(std::unique(p.contributors.begin(), p.contributors.end()),
                         p.contributors.end());
    append_segment(out, std::move(p));
  }
  return out;
}

/// `t` if it is a contiguous fp32 tensor of `n` elements, else a new one.
at::Tensor fit(at::Tensor t, int64_t n) {
  if (t.defined() && t.scalar_type() == torch::kFloat32 && t.dim() == 1 && t.numel() == n
      && t.is_contiguous())
    return t;
  return torch::empty({n}, torch::kFloat32);
}

} // namespace

round_engine::round_engine(uint64_t id, round_plan plan, uint32_t self, at::Tensor flat,
                           double weight, round_engine_options opts, round_sink& sink,
                           at::Tensor out_buffer, at::Tensor reduce_buffer)
  : id_(id), plan_(std::move(plan)), self_(self), flat_(std::move(flat)), weight_(weight),
    opts_(std::move(opts)), sink_(sink) {
  auto n = static_cast<uint32_t>(plan_.num_members());
  opts_.chunk_elems = std::max<int64_t>(1, opts_.chunk_elems);
  aux_ = plan_.members.at(self_).auxiliary;
  if (aux_)
    weight_ = 0;
  // Every part of the result is written before it is ready (averaged values or own ones).
  out_ = fit(std::move(out_buffer), flat_.numel());
  in_place_ = flat_.numel() > 0 && out_.data_ptr() == flat_.data_ptr();
  links_.resize(n);
  gone_.assign(n, false);
  received_.assign(n, -1.0);
  resolved_.assign(n, false);
  result_ranges_.assign(n, {});
  result_pieces_.assign(n, {});
  if (opts_.hash_parts) {
    sent_logs_.resize(n);
    received_logs_.resize(n);
    result_received_logs_.resize(n);
  }
  parts_.resize(n);
  for (uint32_t p = 0; p < n; ++p) {
    auto& pr = parts_[p];
    pr.reducer = p;
    pr.offset = plan_.offsets[p];
    pr.size = plan_.sizes[p];
    if (pr.size == 0) {
      resolved_[p] = true;
      pr.status = part_status::averaged;
      pr.reason = "empty part";
    } else if (aux_) {
      resolve_part(p, part_status::own_value_kept, "auxiliary member keeps its own values");
    }
  }
  auto own = plan_.sizes[self_];
  if (own > 0)
    reducer_ = std::make_unique<part_reducer>(own, plan_.senders(), opts_.reducer,
                                              std::move(reduce_buffer));
  else
    reduced_ = true;
  // Our contributions (descriptors: tensors are sliced when sent) and our own part.
  if (!aux_) {
    for (uint32_t p = 0; p < n; ++p) {
      auto size = plan_.sizes[p];
      if (size == 0)
        continue;
      if (p == self_) {
        auto mine = flat_.narrow(0, plan_.offsets[p], size);
        if (opts_.hash_parts) // cut as a contribution chunk stream would be
          for (int64_t off = 0; off < size; off += opts_.chunk_elems)
            log_chunk(sent_logs_[p], off, mine.narrow(0, off, std::min(opts_.chunk_elems,
                                                                         size - off)));
        if (opts_.hash_parts)
          received_logs_[p] = sent_logs_[p];
        (void) reducer_->add(self_, weight_, 0, mine, opts_.input_finite);
        continue;
      }
      auto& s = streams_[{p, contribution_chunk}];
      for (int64_t off = 0; off < size; off += opts_.chunk_elems) {
        s.queue.push_back({off, std::min(opts_.chunk_elems, size - off)});
        ++contribution_chunks_;
      }
    }
  }
  maybe_reduce(false);
  check_done();
}

void round_engine::open(uint32_t member, uint32_t window) {
  if (member >= links_.size() || member == self_ || gone_[member])
    return;
  links_[member] = link{true, window};
  pump(member, contribution_chunk);
  pump(member, result_chunk);
  check_done();
}

out_chunk_ptr round_engine::make_chunk(uint32_t member, uint8_t kind, const pending_chunk& pc) {
  if (kind == contribution_chunk) {
    auto c = new_chunk(contribution_chunk, member, pc.offset);
    c->meta.weight = weight_;
    c->values = flat_.narrow(0, plan_.offsets[member] + pc.offset, pc.len);
    if (opts_.hash_parts)
      log_chunk(sent_logs_[member], pc.offset, c->values);
    return c;
  }
  auto& shared = result_chunks_[pc.offset];
  if (!shared)
    shared = result_chunk_of(pc.offset, contributors_at(pc.offset),
                             reduce_error_.empty() ? reduced_part_.narrow(0, pc.offset, pc.len)
                                                   : at::Tensor{});
  return shared;
}

std::shared_ptr<out_chunk> round_engine::new_chunk(uint8_t kind, uint32_t part,
                                                   int64_t offset) const {
  auto c = std::make_shared<out_chunk>();
  c->meta.group_id = id_;
  c->meta.kind = kind;
  c->meta.part = part;
  c->meta.from = self_;
  c->meta.offset = offset;
  return c;
}

out_chunk_ptr round_engine::result_chunk_of(int64_t offset, std::vector<uint32_t> contributors,
                                            at::Tensor values) const {
  auto c = new_chunk(result_chunk, self_, offset);
  c->meta.contributors = std::move(contributors);
  c->meta.error = reduce_error_;
  c->values = std::move(values);
  return c;
}

void round_engine::pump(uint32_t member, uint8_t kind) {
  if (gone_[member] || !links_[member].open)
    return;
  auto it = streams_.find({member, kind});
  if (it == streams_.end())
    return;
  auto window = links_[member].window;
  while (!it->second.empty() && (window == 0 || it->second.inflight < window)) {
    auto& s = it->second;
    auto c = make_chunk(member, kind, s.queue[s.next++]);
    if (window != 0)
      ++s.inflight;
    sink_.send(member, c);
    // The sink may not call back into the engine, but keep the iterator honest anyway.
    it = streams_.find({member, kind});
    if (it == streams_.end() || gone_[member])
      return;
  }
}

void round_engine::on_ack(uint32_t member, uint8_t kind) {
  if (member >= links_.size())
    return;
  auto it = streams_.find({member, kind});
  if (it == streams_.end() || it->second.inflight == 0)
    return;
  --it->second.inflight;
  pump(member, kind);
  check_done();
}

void round_engine::on_chunk(const chunk_meta& c, const at::Tensor& in) {
  auto n = plan_.num_members();
  if (c.group_id != id_ || c.from >= n || c.from == self_ || gone_[c.from] || finished_)
    return;
  at::Tensor values;
  if (c.error.empty() && in.defined())
    values = in.reshape({-1});
  if (c.kind == contribution_chunk) {
    if (c.part != self_ || !reducer_ || reduced_)
      return;
    if (values.defined() && reducer_->has(c.from, c.offset, values.numel()))
      return; // a duplicate of what arrived: no harm, and no reason to exclude the sender
    if (opts_.hash_parts && values.defined())
      log_chunk(received_logs_[c.from], c.offset, values);
    // A kept-chunks reducer holds the values until it reduces: its own copy, so that the
    // transport may reuse its buffer.
    if (opts_.reducer && values.defined())
      values = values.clone();
    if (!values.defined() || !reducer_->add(c.from, c.weight, c.offset, values))
      reducer_->exclude(c.from); // a malformed contribution is no contribution
    stream_results();
    maybe_reduce(false);
    check_done();
    return;
  }
  if (c.kind != result_chunk || c.part != c.from || resolved_[c.part] || aux_)
    return;
  auto size = plan_.sizes[c.part];
  if (!c.error.empty()) {
    resolve_part(c.part, part_status::failed, "reducer: " + c.error);
  } else if (!values.defined() || c.offset < 0 || values.numel() > size
             || c.offset > size - values.numel()) {
    resolve_part(c.part, part_status::own_value_kept, "malformed result chunk");
  } else if (result_ranges_[c.part].covers(c.offset, c.offset + values.numel())) {
    return; // a duplicate: counting it again would resolve the part with elements missing
  } else if (auto st = result_ranges_[c.part].insert(c.offset, c.offset + values.numel()); !st) {
    resolve_part(c.part, part_status::own_value_kept, "malformed result chunk: " + st.what());
  } else {
    if (opts_.hash_parts)
      log_chunk(result_received_logs_[c.part], c.offset, values);
    // Straight into the result: a part that ends unaveraged gets the own values back there.
    out_.narrow(0, plan_.offsets[c.part] + c.offset, values.numel())
        .copy_(values.to(torch::kFloat32));
    result_pieces_[c.part].push_back({c.offset, values.numel(), c.contributors});
    if (result_ranges_[c.part].size() == size) {
      auto segments = merge_pieces(std::move(result_pieces_[c.part]));
      result_pieces_[c.part].clear();
      resolve_part(c.part, part_status::averaged, "", common_contributors(segments));
      if (segments.size() > 1)
        parts_[c.part].segments = std::move(segments);
    }
  }
  check_done();
}

std::vector<uint32_t> round_engine::contributors_at(int64_t offset) const {
  for (auto& seg : reduced_segments_)
    if (offset >= seg.offset && offset < seg.offset + seg.size)
      return seg.contributors;
  return {};
}

void round_engine::maybe_reduce(bool deadline) {
  if (reduced_ || !reducer_)
    return;
  if (!deadline && !reducer_->complete())
    return;
  reduced_ = true;
  for (auto p : plan_.senders())
    reducer_->exclude(p); // incomplete ones are cut
  auto out = reducer_->reduce();
  if (out && opts_.finish_part)
    if (auto st = opts_.finish_part(plan_.offsets[self_], out->values); !st)
      out = fail(st.what());
  auto size = plan_.sizes[self_];
  std::vector<uint32_t> common;
  if (out) {
    reduced_part_ = std::move(out->values);
    reduced_segments_ = std::move(out->segments);
    common = common_contributors(reduced_segments_);
    // Who reached the whole part, with what weight: the partners' word on each other's samples
    // (the contribution ledger credits a sender from it, never from the sender's own claim).
    for (auto m : common)
      if (m < received_.size())
        received_[m] = reducer_->weight_of(m);
    if (!aux_) {
      out_.narrow(0, plan_.offsets[self_], size).copy_(reduced_part_);
      resolve_part(self_, part_status::averaged, "", common);
      if (reduced_segments_.size() > 1)
        parts_[self_].segments = reduced_segments_;
    }
  } else {
    reduce_error_ = out.error().what;
    if (!aux_)
      resolve_part(self_, part_status::failed, "reduction failed: " + reduce_error_);
  }
  reducer_.reset(); // free the contributions
  if (aux_) {
    parts_[self_].contributors = common;
    if (reduced_segments_.size() > 1)
      parts_[self_].segments = reduced_segments_;
    parts_[self_].reason = reduce_error_.empty() ? "auxiliary: reduced for the group"
                                                 : "auxiliary: " + reduce_error_;
  }
  for (uint32_t m = 0; m < plan_.num_members(); ++m) {
    if (m == self_ || gone_[m] || plan_.members[m].auxiliary)
      continue;
    auto& s = streams_[{m, result_chunk}];
    if (!reduce_error_.empty())
      s.queue.push_back({0, 0});
    else // what did not go out before the reduction
      for (auto& pc : result_cuts(streamed_end_))
        s.queue.push_back(pc);
    pump(m, result_chunk);
  }
}

void round_engine::stream_results() {
  if (reduced_ || !reducer_ || opts_.reducer || opts_.finish_part)
    return;
  auto size = plan_.sizes[self_];
  auto from = streamed_end_;
  while (streamed_end_ < size) {
    auto lo = streamed_end_;
    auto hi = std::min(size, lo + opts_.chunk_elems);
    auto seg = reducer_->finish_early(lo, hi);
    if (!seg)
      break;
    result_chunks_[lo] =
      result_chunk_of(lo, std::move(seg->contributors), reducer_->early_values(lo, hi));
    streamed_end_ = hi;
  }
  if (streamed_end_ == from)
    return;
  for (uint32_t m = 0; m < plan_.num_members(); ++m) {
    if (m == self_ || gone_[m] || plan_.members[m].auxiliary)
      continue;
    auto& s = streams_[{m, result_chunk}];
    for (int64_t off = from; off < streamed_end_; off += opts_.chunk_elems)
      s.queue.push_back({off, std::min(opts_.chunk_elems, streamed_end_ - off)});
    pump(m, result_chunk);
  }
}

std::vector<round_engine::pending_chunk> round_engine::result_cuts(int64_t from) const {
  std::vector<pending_chunk> out;
  for (auto off = from; off < streamed_end_; off += opts_.chunk_elems)
    out.push_back({off, std::min(opts_.chunk_elems, streamed_end_ - off)});
  // Chunks never straddle a segment: each carries its own contributors.
  for (auto& seg : reduced_segments_) {
    auto end = seg.offset + seg.size;
    for (auto off = std::max({seg.offset, streamed_end_, from}); off < end;
         off += opts_.chunk_elems)
      out.push_back({off, std::min(opts_.chunk_elems, end - off)});
  }
  return out;
}

void round_engine::resolve_part(uint32_t part, part_status st, std::string reason,
                                std::vector<uint32_t> contributors) {
  if (resolved_[part])
    return;
  resolved_[part] = true;
  auto& pr = parts_[part];
  pr.status = st;
  pr.reason = std::move(reason);
  pr.contributors = std::move(contributors);
  if (st == part_status::averaged || pr.size == 0)
    return;
  if (!in_place_) {
    // Own values for the whole part.
    out_.narrow(0, pr.offset, pr.size).copy_(flat_.narrow(0, pr.offset, pr.size));
  } else if (auto arrived = result_ranges_[part].size(); arrived > 0) {
    // In place, the result chunks that arrived already replaced the own values there.
    pr.reason += fmt::format(" ({} of {} elements of its result had arrived and replaced the "
                             "own values in place)",
                             arrived, pr.size);
  }
}

void round_engine::member_gone(uint32_t i, const std::string& why) {
  if (i >= gone_.size() || i == self_ || gone_[i] || finished_)
    return;
  gone_[i] = true;
  streams_.erase({i, contribution_chunk});
  streams_.erase({i, result_chunk});
  if (!resolved_[i])
    resolve_part(i, part_status::own_value_kept,
                 fmt::format("reducer {} {}", plan_.members[i].address, why));
  if (reducer_ && !reduced_) {
    reducer_->exclude(i);
    stream_results();
  }
  maybe_reduce(false);
  check_done();
}

void round_engine::reduce_deadline() {
  if (finished_)
    return;
  maybe_reduce(true);
  check_done();
}

void round_engine::round_deadline() {
  if (finished_)
    return;
  for (uint32_t p = 0; p < plan_.num_members(); ++p)
    if (!resolved_[p])
      resolve_part(p, part_status::own_value_kept, "round deadline passed");
  ready_ = true;
  finished_ = true;
  streams_.clear();
  reducer_.reset();
}

void round_engine::check_done() {
  if (finished_)
    return;
  if (!ready_)
    ready_ = std::all_of(resolved_.begin(), resolved_.end(), [](bool b) { return b; })
             && (!aux_ || reduced_);
  if (!ready_ || !reduced_)
    return;
  // Our parts are settled, so every reducer we still owe data either reduced or is gone: what
  // is left of our contributions is of no use to anybody.
  for (auto it = streams_.begin(); it != streams_.end();)
    it = it->first.second == contribution_chunk ? streams_.erase(it) : std::next(it);
  for (auto& [k, s] : streams_)
    if (!s.empty() || s.inflight > 0)
      return;
  finished_ = true;
}

round_result round_engine::result() const {
  return {out_, parts_, received_};
}

// -- BTARD hooks -------------------------------------------------------------------------------

void round_engine::log_chunk(chunk_log& log, int64_t offset, const at::Tensor& values) {
  auto v = values.to(torch::kFloat32).contiguous();
  digest d{};
  crypto_generichash(d.data(), d.size(), static_cast<const unsigned char*>(v.data_ptr()),
                     static_cast<unsigned long long>(v.numel()) * sizeof(float), nullptr, 0);
  log.emplace_back(offset, v.numel(), d);
}

digest round_engine::finish_log(chunk_log log) {
  digest out{};
  if (log.empty())
    return out;
  std::sort(log.begin(), log.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, out.size());
  for (auto& [off, n, d] : log) {
    uint8_t head[16];
    for (int i = 0; i < 8; ++i) {
      head[i] = static_cast<uint8_t>(static_cast<uint64_t>(off) >> (8 * i));
      head[8 + i] = static_cast<uint8_t>(static_cast<uint64_t>(n) >> (8 * i));
    }
    crypto_generichash_update(&st, head, sizeof head);
    crypto_generichash_update(&st, d.data(), d.size());
  }
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

part_digests round_engine::digests() const {
  part_digests out;
  auto n = plan_.num_members();
  out.sent.resize(n);
  out.received.resize(n);
  out.result_received.resize(n);
  if (!opts_.hash_parts)
    return out;
  for (size_t i = 0; i < n; ++i) {
    out.sent[i] = finish_log(sent_logs_[i]);
    out.received[i] = finish_log(received_logs_[i]);
    out.result_received[i] = finish_log(result_received_logs_[i]);
  }
  // Our reduced part, cut as its result chunks are (`result_cuts`): what every member received
  // from us, and what we took for ourselves.
  if (reduced_part_.defined() && reduce_error_.empty()) {
    chunk_log own;
    for (auto& pc : result_cuts(0))
      log_chunk(own, pc.offset, reduced_part_.narrow(0, pc.offset, pc.len));
    out.result_sent = finish_log(std::move(own));
    if (!aux_)
      out.result_received[self_] = out.result_sent;
  }
  return out;
}

} // namespace starling::actors::averager
