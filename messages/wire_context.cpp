#include "messages/wire_context.hpp"

#include <chrono>
#include <limits>

namespace starling::messages {

std::string_view to_string(wire_reason r) {
  switch (r) {
    case wire_reason::malformed:
      return "malformed";
    case wire_reason::too_large:
      return "too_large";
    case wire_reason::version:
      return "version";
    case wire_reason::experiment:
      return "experiment";
    case wire_reason::sender:
      return "sender";
    case wire_reason::stale:
      return "stale";
    case wire_reason::replay:
      return "replay";
    case wire_reason::wrong_payload:
      return "wrong_payload";
    case wire_reason::out_of_range:
      return "out_of_range";
    case wire_reason::unauthorized:
      return "unauthorized";
    case wire_reason::signature:
      return "signature";
  }
  return "unknown";
}

std::string wire_refusal::line() const {
  std::string out = "envelope refused (";
  out += to_string(why);
  out += "): ";
  for (char c : detail)
    out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  return out;
}

namespace {

int64_t system_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

} // namespace

wire_context::wire_context(wire_options opts) : opts_(std::move(opts)), next_seq_(0) {
  if (opts_.replay_window < 64)
    opts_.replay_window = 64;
  opts_.replay_window = (opts_.replay_window + 63) / 64 * 64;
  auto t = now();
  // Starting at the clock keeps a restarted node's numbers above its old ones as long as it
  // sent fewer than 10^9 envelopes per second.
  next_seq_.store(t > 0 ? static_cast<uint64_t>(t) : 1);
}

int64_t wire_context::now() const {
  return opts_.clock ? opts_.clock() : system_now();
}

std::pair<uint64_t, int64_t> wire_context::stamp() {
  return {next_seq_.fetch_add(1), now()};
}

std::string wire_context::sign(std::string_view digest) const {
  return opts_.sign ? opts_.sign(digest) : std::string{};
}

bool wire_context::verify(const envelope_header& h, std::string_view digest,
                          std::string_view signature, wire_refusal& why) const {
  if (signature.empty()) {
    if (!opts_.require_signature)
      return true;
    why = {wire_reason::signature, "an unsigned envelope; this run requires every envelope to be "
                                   "signed by its sender's node key"};
    return false;
  }
  if (!opts_.verify) {
    if (!opts_.require_signature)
      return true; // nothing to check it against: the envelope counts as unsigned
    why = {wire_reason::signature, "this node requires signed envelopes but has no keys to "
                                   "check them with"};
    return false;
  }
  if (h.sender.empty()) {
    why = {wire_reason::signature, "a signed envelope without a sender peer id"};
    return false;
  }
  auto line = opts_.verify(h.sender, digest, signature);
  if (line.empty())
    return true;
  why = {wire_reason::signature, std::move(line)};
  return false;
}

bool wire_context::authorize(const envelope_header& h, std::string_view kind,
                             wire_refusal& why) const {
  if (!opts_.admit)
    return true;
  auto line = opts_.admit(h.sender, kind);
  if (line.empty())
    return true;
  why = {wire_reason::unauthorized, std::move(line)};
  return false;
}

bool wire_context::check(const envelope_header& h, wire_refusal& why) const {
  if (h.experiment != opts_.experiment) {
    why = {wire_reason::experiment,
           "experiment '" + h.experiment + "', this node runs '" + opts_.experiment + "'"};
    return false;
  }
  if (h.sender.empty() && opts_.require_sender) {
    why = {wire_reason::sender, "no sender peer id (this run requires one)"};
    return false;
  }
  if (opts_.max_clock_skew_ns > 0) {
    auto t = now();
    // Differences computed in 128 bits: times are untrusted and may be extreme.
    auto d = static_cast<__int128>(h.time_ns) - static_cast<__int128>(t);
    if (d > opts_.max_clock_skew_ns || -d > opts_.max_clock_skew_ns) {
      why = {wire_reason::stale, "sent at " + std::to_string(h.time_ns) + " ns, this node's clock is "
                                   + std::to_string(t) + " ns (allowed skew "
                                   + std::to_string(opts_.max_clock_skew_ns / 1'000'000'000)
                                   + " s)"};
      return false;
    }
  }
  return true;
}

bool wire_context::record(const envelope_header& h, wire_refusal& why) {
  if (h.sender.empty())
    return true;
  const size_t words = opts_.replay_window / 64;
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = windows_.find(h.sender);
  if (i == windows_.end()) {
    if (windows_.size() >= opts_.max_senders) {
      auto oldest = windows_.begin();
      for (auto j = windows_.begin(); j != windows_.end(); ++j)
        if (j->second.last_heard < oldest->second.last_heard)
          oldest = j;
      windows_.erase(oldest);
    }
    i = windows_.emplace(h.sender, window{}).first;
    i->second.bits.reset(new uint64_t[words]());
  }
  auto& w = i->second;
  w.last_heard = now();
  auto set_bit = [&](uint64_t offset) { w.bits[offset / 64] |= uint64_t{1} << (offset % 64); };
  auto has_bit = [&](uint64_t offset) {
    return (w.bits[offset / 64] >> (offset % 64)) & 1;
  };
  // Bit k stands for sequence number highest - k.
  if (!w.any || h.sequence > w.highest) {
    auto shift = w.any ? h.sequence - w.highest : opts_.replay_window;
    if (shift >= opts_.replay_window) {
      for (size_t k = 0; k < words; ++k)
        w.bits[k] = 0;
    } else {
      // Move every remembered number `shift` places further from the top (bit k -> k + shift).
      auto ws = static_cast<size_t>(shift / 64);
      auto bs = static_cast<unsigned>(shift % 64);
      for (size_t j = words; j-- > 0;) {
        uint64_t v = 0;
        if (j >= ws) {
          v = w.bits[j - ws] << bs;
          if (bs != 0 && j >= ws + 1)
            v |= w.bits[j - ws - 1] >> (64 - bs);
        }
        w.bits[j] = v;
      }
    }
    w.highest = h.sequence;
    w.any = true;
    set_bit(0);
    return true;
  }
  auto offset = w.highest - h.sequence;
  if (offset >= opts_.replay_window) {
    why = {wire_reason::replay, "sequence number " + std::to_string(h.sequence)
                                  + " is below the sender's window (highest "
                                  + std::to_string(w.highest) + ")"};
    return false;
  }
  if (has_bit(offset)) {
    why = {wire_reason::replay, "sequence number " + std::to_string(h.sequence)
                                  + " was seen before from this sender"};
    return false;
  }
  set_bit(offset);
  return true;
}

uint64_t wire_context::refused_total() const {
  uint64_t n = 0;
  for (auto& c : refused_)
    n += c.load();
  return n;
}

std::string wire_context::summary() const {
  std::string out;
  for (size_t i = 0; i < wire_reason_count; ++i) {
    auto n = refused_[i].load();
    if (n == 0)
      continue;
    if (!out.empty())
      out += ' ';
    out += to_string(static_cast<wire_reason>(i));
    out += '=' + std::to_string(n);
  }
  return out;
}

} // namespace starling::messages
