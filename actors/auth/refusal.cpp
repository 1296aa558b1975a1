#include "actors/auth/refusal.hpp"

#include <utility>

namespace starling::actors::auth {

std::string_view to_string(reason r) {
  switch (r) {
    case reason::malformed:
      return "malformed";
    case reason::forged:
      return "forged";
    case reason::wrong_authority:
      return "wrong_authority";
    case reason::foreign_experiment:
      return "foreign_experiment";
    case reason::expired:
      return "expired";
    case reason::not_yet_valid:
      return "not_yet_valid";
    case reason::wrong_key:
      return "wrong_key";
    case reason::revoked:
      return "revoked";
    case reason::banned:
      return "banned";
    case reason::no_hello:
      return "no_hello";
    case reason::version_mismatch:
      return "version_mismatch";
    case reason::wrong_challenge:
      return "wrong_challenge";
    case reason::stale:
      return "stale";
    case reason::no_token:
      return "no_token";
    case reason::role_denied:
      return "role_denied";
    case reason::protocol_violation:
      return "protocol_violation";
  }
  return "unknown";
}

std::string refusal::line() const {
  std::string out = "refused (";
  out += to_string(why);
  out += "): ";
  // One line: a detail never carries a line break to the peer or the log.
  for (char c : detail)
    out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  return out;
}

uint64_t refusal_counts::total() const {
  uint64_t n = 0;
  for (auto c : counts_)
    n += c;
  return n;
}

std::string refusal_counts::summary() const {
  std::string out;
  for (size_t i = 0; i < reason_count; ++i) {
    if (counts_[i] == 0)
      continue;
    if (!out.empty())
      out += ' ';
    out += to_string(static_cast<reason>(i));
    out += '=';
    out += std::to_string(counts_[i]);
  }
  return out;
}

peer_refusal_tally::peer_refusal_tally(size_t max_peers)
  : max_peers_(max_peers == 0 ? 1 : max_peers) {
  // nop
}

void peer_refusal_tally::add(std::string_view peer_id, std::string_view peer_key,
                             const refusal& r) {
  auto i = peers_.find(peer_id);
  if (i == peers_.end()) {
    if (peers_.size() >= max_peers_) {
      // The fewest refusals go first; a party with a ban reason only after every other.
      auto fewest = peers_.begin();
      for (auto j = peers_.begin(); j != peers_.end(); ++j) {
        auto key = [](const peer_refusals& p) {
          return std::make_pair(!p.ban_reason.empty(), p.counts.total());
        };
        if (key(j->second) < key(fewest->second))
          fewest = j;
      }
      other_.merge(fewest->second.counts);
      peers_.erase(fewest);
    }
    i = peers_.emplace(std::string{peer_id}, peer_refusals{}).first;
  }
  auto& p = i->second;
  if (!peer_key.empty())
    p.peer_key = std::string{peer_key};
  p.counts.add(r.why);
  if (r.why == reason::banned || r.why == reason::revoked) {
    p.ban_reason.clear();
    for (char c : r.detail.substr(0, max_reason_bytes))
      p.ban_reason.push_back(c == '\n' || c == '\r' ? ' ' : c);
  }
}

} // namespace starling::actors::auth
