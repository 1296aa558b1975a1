#include "actors/auth/refusal.hpp"

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

} // namespace starling::actors::auth
