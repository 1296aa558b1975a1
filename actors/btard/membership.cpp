#include "actors/btard/membership.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "actors/btard/bytes.hpp"

namespace starling::actors::btard {

result<std::vector<part_range>> equal_parts(uint64_t size, size_t n) {
  if (n == 0)
    return fail("cannot cut a vector into zero parts");
  if (n > size)
    return fail(fmt::format("cannot cut {} elements into {} non-empty parts", size, n));
  std::vector<part_range> out;
  out.reserve(n);
  // ⌊i·size/n⌋ in 128 bits: size · n may not fit in 64.
  auto cut = [&](uint64_t i) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(i) * size / n);
  };
  for (uint64_t i = 0; i < n; ++i)
    out.push_back({cut(i), cut(i + 1)});
  return out;
}

std::optional<size_t> step_group::index_of(const std::string& key) const {
  auto it = std::lower_bound(members.begin(), members.end(), key);
  if (it == members.end() || *it != key)
    return std::nullopt;
  return static_cast<size_t>(it - members.begin());
}

std::optional<part_range> step_group::part_of(const std::string& key) const {
  auto i = index_of(key);
  if (!i || *i >= parts.size())
    return std::nullopt;
  return parts[*i];
}

status validate(const membership_options& o) {
  if (o.silences_to_ban == 0)
    return fail("btard.silences_to_ban must be at least 1");
  if (o.silence_window < o.silences_to_ban)
    return fail(fmt::format("btard.silence_window ({}) must be at least btard.silences_to_ban "
                            "({}): silences are counted once per step",
                            o.silence_window, o.silences_to_ban));
  if (o.min_members < 2)
    return fail(fmt::format("btard.min_members must be at least 2, got {}", o.min_members));
  return {};
}

membership::membership(membership_options o) : o_(o) {}

status membership::join(const std::string& key, uint64_t step) {
  if (auto why = ban_reason(key))
    return fail(fmt::format("peer {} is banned ({})", key, *why));
  if (auto c = cool_until_.find(key); c != cool_until_.end() && step < c->second)
    return fail(fmt::format("peer {} was silent and may commit again from step {}, not {}", key,
                            c->second, step));
  active_from_[key] = step;
  return {};
}

bool membership::silent(const std::string& key, uint64_t step) {
  if (banned_.count(key) || !active_from_.count(key))
    return false;
  auto& s = silences_[key];
  s.push_back(step);
  // Keep the silences of the last `silence_window` steps: those with step - t < window.
  s.erase(std::remove_if(s.begin(), s.end(),
                         [&](uint64_t t) { return t > step || step - t >= o_.silence_window; }),
          s.end());
  active_from_.erase(key);
  cool_until_[key] = step + 1 + o_.cool_down;
  if (s.size() >= o_.silences_to_ban) {
    ban(key, fmt::format("silent {} times within {} steps (last at step {})", s.size(),
                         o_.silence_window, step));
    return true;
  }
  return false;
}

bool membership::ban(const std::string& key, const std::string& reason) {
  if (banned_.count(key))
    return false;
  banned_[key] = reason;
  active_from_.erase(key);
  return true;
}

std::optional<std::string> membership::ban_reason(const std::string& key) const {
  auto it = banned_.find(key);
  if (it == banned_.end())
    return std::nullopt;
  return it->second;
}

absence membership::absent(const std::string& key, uint64_t step) const {
  if (banned_.count(key))
    return absence::banned;
  auto a = active_from_.find(key);
  if (a != active_from_.end() && a->second <= step)
    return absence::none;
  if (auto c = cool_until_.find(key); c != cool_until_.end() && step < c->second)
    return absence::cooling_down;
  return absence::not_joined;
}

namespace {

result<step_group> make_group(uint64_t step, std::vector<std::string> members, uint64_t size,
                              size_t min_members) {
  if (members.size() < min_members)
    return fail(fmt::format("step {} has {} peer(s) left, fewer than the {} it needs", step,
                            members.size(), min_members));
  auto parts = equal_parts(size, members.size());
  if (!parts)
    return fail(parts.error().what);
  step_group g;
  g.step = step;
  g.members = std::move(members);
  g.parts = std::move(*parts);
  return g;
}

} // namespace

result<step_group> membership::group(uint64_t step, uint64_t size) const {
  std::vector<std::string> members;
  for (auto& [key, from] : active_from_)
    if (from <= step && !banned_.count(key))
      members.push_back(key);
  return make_group(step, std::move(members), size, o_.min_members);
}

result<step_group> membership::regroup(const step_group& g, const std::set<std::string>& removed,
                                       uint64_t size) const {
  std::vector<std::string> members;
  for (auto& key : g.members)
    if (!removed.count(key) && !banned_.count(key))
      members.push_back(key);
  return make_group(g.step, std::move(members), size, o_.min_members);
}

namespace {

constexpr std::string_view membership_tag = "starling.btard.membership.v1";
constexpr size_t membership_key_bytes = 32;
constexpr uint64_t max_membership_entries = 65536;
constexpr uint64_t max_reason_bytes = 1024;

void put_key(std::string& out, const std::string& key) { out += key; }

bool read_key(detail::reader& in, std::string& key) {
  return in.raw(key, membership_key_bytes);
}

} // namespace

std::string membership::encode() const {
  std::string out(membership_tag);
  detail::put_u64(out, active_from_.size());
  for (auto& [k, from] : active_from_) {
    put_key(out, k);
    detail::put_u64(out, from);
  }
  detail::put_u64(out, cool_until_.size());
  for (auto& [k, until] : cool_until_) {
    put_key(out, k);
    detail::put_u64(out, until);
  }
  detail::put_u64(out, silences_.size());
  for (auto& [k, steps] : silences_) {
    put_key(out, k);
    detail::put_u64(out, steps.size());
    for (auto t : steps)
      detail::put_u64(out, t);
  }
  detail::put_u64(out, banned_.size());
  for (auto& [k, why] : banned_) {
    put_key(out, k);
    auto reason = why.substr(0, max_reason_bytes);
    detail::put_u64(out, reason.size());
    out += reason;
  }
  return out;
}

result<membership> membership::decode(std::string_view bytes, membership_options o) {
  if (bytes.substr(0, membership_tag.size()) != membership_tag)
    return fail("membership state: not a starling membership (wrong tag)");
  detail::reader in(bytes.substr(membership_tag.size()));
  membership m(o);
  auto count = [&](const char* table, uint64_t& n) -> status {
    if (!in.le(n, 8))
      return fail(fmt::format("membership state: truncated before the {} count", table));
    if (n > max_membership_entries)
      return fail(fmt::format("membership state: {} {} entries (at most {})", n, table,
                              max_membership_entries));
    return {};
  };
  auto truncated = [](const char* table) {
    return fail(fmt::format("membership state: truncated in the {} table", table));
  };
  uint64_t n = 0;
  if (auto st = count("joined", n); !st)
    return fail(st.what());
  for (uint64_t i = 0; i < n; ++i) {
    std::string k;
    uint64_t from = 0;
    if (!read_key(in, k) || !in.le(from, 8))
      return truncated("joined");
    m.active_from_[k] = from;
  }
  if (auto st = count("cool-down", n); !st)
    return fail(st.what());
  for (uint64_t i = 0; i < n; ++i) {
    std::string k;
    uint64_t until = 0;
    if (!read_key(in, k) || !in.le(until, 8))
      return truncated("cool-down");
    m.cool_until_[k] = until;
  }
  if (auto st = count("silence", n); !st)
    return fail(st.what());
  for (uint64_t i = 0; i < n; ++i) {
    std::string k;
    uint64_t steps = 0;
    if (!read_key(in, k) || !in.le(steps, 8))
      return truncated("silence");
    if (steps > o.silences_to_ban)
      return fail(fmt::format("membership state: {} silences kept for one peer (a ban comes at "
                              "{})",
                              steps, o.silences_to_ban));
    auto& v = m.silences_[k];
    for (uint64_t j = 0; j < steps; ++j) {
      uint64_t t = 0;
      if (!in.le(t, 8))
        return truncated("silence");
      v.push_back(t);
    }
  }
  if (auto st = count("ban", n); !st)
    return fail(st.what());
  for (uint64_t i = 0; i < n; ++i) {
    std::string k, why;
    uint64_t len = 0;
    if (!read_key(in, k) || !in.le(len, 8))
      return truncated("ban");
    if (len > max_reason_bytes || !in.raw(why, static_cast<size_t>(len)))
      return fail("membership state: a ban's reason is too long or truncated");
    m.banned_[k] = why;
  }
  if (in.left() != 0)
    return fail(fmt::format("membership state: {} trailing bytes", in.left()));
  return m;
}

} // namespace starling::actors::btard
