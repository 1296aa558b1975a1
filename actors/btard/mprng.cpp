#include "actors/btard/mprng.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "actors/btard/bytes.hpp"
#include "kernels/seeded_hash.hpp"

namespace starling::actors::btard {

namespace {

constexpr size_t mprng_key_bytes = 32;

/// The first 8 bytes of a digest, little-endian.
uint64_t seed_of(const digest& d) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(d[i]) << (8 * i);
  return v;
}

/// BLAKE2b-256 of tag | r_t | extra, as a 64-bit seed.
uint64_t derived_seed(std::string_view tag, const digest& r_t, std::string_view extra) {
  std::string in{tag};
  in += digest_string(r_t);
  in += extra;
  return seed_of(hash_bytes(in));
}

} // namespace

digest mprng_commitment(uint64_t step, uint32_t attempt, std::string_view key, const digest& r) {
  std::string in = "starling.btard.mprng.commit.v1";
  detail::put_u64(in, step);
  detail::put_le(in, attempt, 4);
  in += key;
  in += digest_string(r);
  return hash_bytes(in);
}

digest mprng_value(uint64_t step, uint32_t attempt, const std::map<std::string, digest>& reveals) {
  std::string in = "starling.btard.mprng.value.v1";
  detail::put_u64(in, step);
  detail::put_le(in, attempt, 4);
  detail::put_u64(in, reveals.size());
  for (const auto& [key, r] : reveals) {
    in += key;
    in += digest_string(r);
  }
  return hash_bytes(in);
}

result<mprng_round> mprng_round::start(uint64_t step, uint32_t attempt,
                                       std::vector<std::string> participants) {
  if (participants.empty())
    return fail("mprng: a round needs at least one participant");
  for (const auto& k : participants)
    if (k.size() != mprng_key_bytes)
      return fail(fmt::format("mprng: a participant key is {} bytes, expected {}", k.size(),
                              mprng_key_bytes));
  std::sort(participants.begin(), participants.end());
  if (std::adjacent_find(participants.begin(), participants.end()) != participants.end())
    return fail("mprng: a participant is listed twice");
  return mprng_round{step, attempt, std::move(participants)};
}

bool mprng_round::participant(std::string_view key) const {
  return std::binary_search(participants_.begin(), participants_.end(), key);
}

status mprng_round::add_commit(std::string_view key, const digest& commitment) {
  if (!participant(key))
    return fail("mprng: a commitment from a key that is not a participant of the round");
  if (phase_ != mprng_phase::commits)
    return fail("mprng: a commitment after the commitments closed");
  auto it = commits_.find(key);
  if (it != commits_.end()) {
    if (it->second != commitment)
      return fail("mprng: a second, different commitment from one key (the first stays)");
    return {};
  }
  commits_.emplace(std::string(key), commitment);
  return {};
}

void mprng_round::close_commits() {
  if (phase_ == mprng_phase::commits)
    phase_ = mprng_phase::reveals;
}

status mprng_round::add_reveal(std::string_view key, const digest& r) {
  if (phase_ == mprng_phase::finished)
    return fail("mprng: a reveal after the round finished");
  auto it = commits_.find(key);
  if (it == commits_.end())
    return fail("mprng: a reveal from a key without a commitment");
  if (cheated_.count(key) != 0)
    return fail("mprng: a reveal from a key whose earlier reveal did not open its commitment");
  if (mprng_commitment(step_, attempt_, key, r) != it->second) {
    reveals_.erase(std::string(key));
    cheated_.emplace(key);
    return fail("mprng: the reveal does not open the key's commitment");
  }
  reveals_.emplace(std::string(key), r);
  return {};
}

bool mprng_round::complete() const {
  return commits_.size() == participants_.size() && reveals_.size() == commits_.size();
}

mprng_outcome mprng_round::finish() {
  close_commits();
  phase_ = mprng_phase::finished;
  mprng_outcome out;
  out.next_attempt = attempt_ + 1;
  for (const auto& k : participants_) {
    if (commits_.count(k) == 0)
      out.silent.push_back(k);
    else if (reveals_.count(k) == 0)
      out.withholders.push_back(k);
    else
      out.next_participants.push_back(k);
  }
  if (out.withholders.empty() && !reveals_.empty())
    out.value = mprng_value(step_, attempt_, reveals_);
  return out;
}

uint64_t direction_seed(const digest& r_t, uint64_t part) {
  std::string extra;
  detail::put_u64(extra, part);
  return derived_seed("starling.btard.direction.v1", r_t, extra);
}

uint64_t batch_seed(const digest& r_t, std::string_view key) {
  return derived_seed("starling.btard.batch.v1", r_t, key);
}

result<std::vector<validation>> draw_validators(const digest& r_t,
                                                const std::vector<std::string>& peers,
                                                const std::set<std::string>& banned,
                                                const validator_options& options) {
  std::vector<std::string> eligible;
  for (const auto& k : peers) {
    if (k.size() != mprng_key_bytes)
      return fail(fmt::format("draw_validators: a peer key is {} bytes, expected {}", k.size(),
                              mprng_key_bytes));
    if (banned.count(k) == 0)
      eligible.push_back(k);
  }
  std::sort(eligible.begin(), eligible.end());
  if (std::adjacent_find(eligible.begin(), eligible.end()) != eligible.end())
    return fail("draw_validators: a peer is listed twice");
  const auto n = eligible.size();
  const auto m = options.count;
  std::vector<validation> out;
  if (m == 0)
    return out;
  if (n < 2)
    return fail(fmt::format("draw_validators: {} peer(s) not banned; validation needs 2", n));
  if (options.targets_exclude_validators ? m >= n : m > n)
    return fail(fmt::format("draw_validators: {} validators among {} peers leave no target{}", m, n,
                            options.targets_exclude_validators ? " outside the validators" : ""));
  kernels::splitmix64_stream rng{derived_seed("starling.btard.validators.v1", r_t, {})};
  // Partial Fisher-Yates: positions [0, m) become the validators, in draw order.
  for (size_t i = 0; i < m; ++i) {
    auto j = i + static_cast<size_t>(rng.below(n - i));
    std::swap(eligible[i], eligible[j]);
  }
  for (size_t i = 0; i < m; ++i) {
    validation v;
    v.validator = eligible[i];
    if (options.targets_exclude_validators) {
      v.target = eligible[m + static_cast<size_t>(rng.below(n - m))];
    } else {
      // Uniform among the n - 1 others: skip the validator's own position.
      auto k = static_cast<size_t>(rng.below(n - 1));
      v.target = eligible[k >= i ? k + 1 : k];
    }
    out.push_back(std::move(v));
  }
  return out;
}

} // namespace starling::actors::btard
