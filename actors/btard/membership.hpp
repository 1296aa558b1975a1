// Who takes part in a BTARD step, and how the vector is cut (issue 41, item 1): the fixed-group
// ButterflyClip has no leader and no matchmaking. Step t's group is every peer of the run that
// is neither banned nor removed, ordered by key; the vector is cut into equal parts, one per
// member in that order, and member i aggregates part i. Every honest peer derives the same group
// from the same public facts (joins, bans, silences), so they agree on who aggregates what
// without a message. Everything is keyed by peer key, never by index: a ban changes n, the
// parts and who aggregates which part.
//
// Silence. A peer that misses a deadline of the step (no commitment, no part, no reveal: a crash
// is the common case) is removed for the rest of the step, as in the paper, and the step's
// aggregation is redone without it on the same gradients before anyone applies anything. It may
// come back through the ordinary path (download the state, then commit afresh) once
// `cool_down` steps have passed. Silence `silences_to_ban` times within `silence_window`
// steps is a ban: a peer cannot be told from a Byzantine one that withholds on purpose.
//
// The slowdown a withholding Byzantine peer can cause: each silence costs the step one deadline
// (the wait for the missing message) and one redo of the aggregation without the peer. A peer
// that withholds every time it is allowed back is silent at most `silences_to_ban` times per
// `silence_window` steps before its ban, and it sits out `cool_down` steps after each silence;
// so b Byzantine peers cost at most b × silences_to_ban extra deadlines and redos in any window
// of `silence_window` steps, and at most b × silences_to_ban in the whole run, since a ban is
// final. With the defaults (3 silences in 100 steps, cool-down 5) and b = 7, that is 21
// deadlines over the run. No CAF, no LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::btard {

/// One part of the vector: [begin, end).
struct part_range {
  /// The first element.
  uint64_t begin = 0;
  /// One past the last element.
  uint64_t end = 0;
  /// Its size.
  uint64_t size() const { return end - begin; }
  /// Equality.
  bool operator==(const part_range& o) const { return begin == o.begin && end == o.end; }
};

/// `size` elements cut into `n` parts as equal as integers allow: part i is
/// [⌊i·size/n⌋, ⌊(i+1)·size/n⌋), so sizes differ by at most one and the cut depends only on
/// (size, n). An error for n = 0 or n > size.
result<std::vector<part_range>> equal_parts(uint64_t size, size_t n);

/// A step's group: members in key order, member i aggregating part i.
struct step_group {
  /// The step.
  uint64_t step = 0;
  /// The members' keys, ascending.
  std::vector<std::string> members;
  /// Part i's range, aggregated by members[i].
  std::vector<part_range> parts;

  /// The index of `key` among the members, if it is one.
  std::optional<size_t> index_of(const std::string& key) const;
  /// The part `key` aggregates, if it is a member.
  std::optional<part_range> part_of(const std::string& key) const;
};

/// The rules for silence and rejoining.
struct membership_options {
  /// Steps a removed peer sits out before it may commit again.
  uint64_t cool_down = 5;
  /// The window, in steps, over which silences are counted.
  uint64_t silence_window = 100;
  /// Silences within the window that make a ban (>= 1).
  uint64_t silences_to_ban = 3;
  /// The fewest members a step may have: below it the step does not run (CenteredClip with two
  /// inputs tolerates no attacker).
  size_t min_members = 2;
};

/// Checks `o`: silences_to_ban >= 1, silence_window >= silences_to_ban, min_members >= 2.
status validate(const membership_options& o);

/// Why a peer is not in a step's group.
enum class absence { none, banned, cooling_down, not_joined };

/// The run's membership as every honest peer tracks it from public facts.
class membership {
public:
  /// Empty, with the rules `o` (validated by the caller).
  explicit membership(membership_options o = {});

  /// `key` commits from step `step` on (a newcomer, or a removed peer back through the state
  /// download). An error for a banned key, or one still cooling down at `step`.
  status join(const std::string& key, uint64_t step);

  /// `key` was silent in step `step`: removed for the rest of it and cooling down; banned when
  /// this is its `silences_to_ban`-th silence within the window. Returns whether it is banned
  /// now. Silences of a banned or absent key change nothing.
  bool silent(const std::string& key, uint64_t step);

  /// `key` is banned for good (a verdict). Returns false when it already was.
  bool ban(const std::string& key, const std::string& reason);

  /// Whether `key` is banned, and why.
  std::optional<std::string> ban_reason(const std::string& key) const;

  /// Why `key` would not be in step `step`'s group (absence::none: it would be).
  absence absent(const std::string& key, uint64_t step) const;

  /// Step `step`'s group for a vector of `size` elements: every joined key neither banned nor
  /// cooling down, in key order. An error when fewer than min_members remain or the vector has
  /// fewer elements than members.
  result<step_group> group(uint64_t step, uint64_t size) const;

  /// The same step's group without `removed` (the redo after a silence or a removal within the
  /// step: the same gradients, new parts).
  result<step_group> regroup(const step_group& g, const std::set<std::string>& removed,
                             uint64_t size) const;

  /// Every banned key with its reason.
  const std::map<std::string, std::string>& banned() const { return banned_; }

  /// The whole state (joins, cool-downs, silences, bans) as bytes, for a peer that comes back
  /// into a running group (peer_core::export_state); the rules are not included.
  std::string encode() const;
  /// The state `encode` wrote, under the rules `o` (untrusted bytes: every field is checked;
  /// keys are 32 bytes, reasons at most 1 KiB, at most 65,536 entries per table).
  static result<membership> decode(std::string_view bytes, membership_options o);

private:
  membership_options o_;
  /// Joined keys with the step they may commit from.
  std::map<std::string, uint64_t> active_from_;
  /// Removed keys with the first step they may commit again from.
  std::map<std::string, uint64_t> cool_until_;
  /// Each key's silences (steps), oldest first, pruned to the window.
  std::map<std::string, std::vector<uint64_t>> silences_;
  std::map<std::string, std::string> banned_;
};

} // namespace starling::actors::btard
