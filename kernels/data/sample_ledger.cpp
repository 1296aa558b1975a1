#include "kernels/data/sample_ledger.hpp"

#include "kernels/data/internal/varint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace starling::kernels {

namespace {

constexpr uint8_t ledger_version = 1;
constexpr uint64_t words_per_chunk = sample_ledger::chunk_ids / 64;
/// An array chunk at this size becomes a bitmap: both then take 8 KiB.
constexpr uint32_t array_limit = 4096;

enum chunk_kind : uint8_t { kind_full = 0, kind_array = 1, kind_bitmap = 2 };

/// "none", or the number.
std::string count_or_none(uint64_t n) {
  return n == 0 ? std::string("none") : std::to_string(n);
}

std::string id_list(const std::vector<uint64_t>& ids, uint64_t total) {
  std::string out;
  for (auto id : ids)
    out += (out.empty() ? "" : ", ") + std::to_string(id);
  if (total > ids.size())
    out += ", ...";
  return out;
}

void push_example(std::vector<uint64_t>& v, uint64_t id) {
  if (v.size() < 8)
    v.push_back(id);
}

} // namespace

std::string ledger_summary::describe() const {
  return fmt::format("{} samples trained once, {} twice or more, {} not trained (of {})",
                     count_or_none(once), count_or_none(more), count_or_none(never), samples);
}

std::string ledger_comparison::describe() const {
  std::string out = fmt::format("{} samples trained as expected", exact);
  out += missing == 0
             ? ", none missing"
             : fmt::format(", {} missing (ids {})", missing, id_list(first_missing, missing));
  out += extra == 0 ? ", none extra"
                    : fmt::format(", {} extra (ids {})", extra, id_list(first_extra, extra));
  return out;
}

sample_ledger::sample_ledger(uint64_t samples) : samples_(samples) {}

uint64_t sample_ledger::capacity(uint64_t index) const {
  return std::min(chunk_ids, samples_ - index * chunk_ids);
}

bool sample_ledger::contains(uint64_t index, const chunk& c, uint16_t off) const {
  if (c.is_bitmap())
    return (c.bits[off / 64] >> (off % 64)) & 1;
  if (c.cardinality == capacity(index))
    return true;
  return std::binary_search(c.array.begin(), c.array.end(), off);
}

bool sample_ledger::insert(uint64_t index, uint16_t off) {
  auto& c = chunks_[index];
  const uint64_t cap = capacity(index);
  if (c.is_bitmap()) {
    auto& w = c.bits[off / 64];
    const uint64_t bit = uint64_t{1} << (off % 64);
    if (w & bit)
      return false;
    w |= bit;
  } else {
    if (c.cardinality == cap)
      return false; // full
    auto it = std::lower_bound(c.array.begin(), c.array.end(), off);
    if (it != c.array.end() && *it == off)
      return false;
    c.array.insert(it, off);
    if (c.array.size() >= array_limit && c.array.size() < cap) {
      c.bits.assign(words_per_chunk, 0);
      for (auto o : c.array)
        c.bits[o / 64] |= uint64_t{1} << (o % 64);
      std::vector<uint16_t>().swap(c.array);
    }
  }
  if (++c.cardinality == cap) {
    std::vector<uint16_t>().swap(c.array);
    std::vector<uint64_t>().swap(c.bits);
  }
  return true;
}

void sample_ledger::to_bitmap(uint64_t index, const chunk& c, std::vector<uint64_t>& words) const {
  words.assign(words_per_chunk, 0);
  if (c.is_bitmap()) {
    words = c.bits;
  } else if (c.cardinality == capacity(index)) {
    const uint64_t cap = capacity(index);
    for (uint64_t w = 0; w < cap / 64; ++w)
      words[w] = ~uint64_t{0};
    if (cap % 64 != 0)
      words[cap / 64] = (uint64_t{1} << (cap % 64)) - 1;
  } else {
    for (auto o : c.array)
      words[o / 64] |= uint64_t{1} << (o % 64);
  }
}

void sample_ledger::assign(uint64_t index, const std::vector<uint64_t>& words) {
  uint64_t n = 0;
  for (auto w : words)
    n += static_cast<uint64_t>(__builtin_popcountll(w));
  if (n == 0) {
    chunks_.erase(index);
    return;
  }
  chunk c;
  c.cardinality = static_cast<uint32_t>(n);
  if (n == capacity(index)) {
    // full: nothing stored
  } else if (n < array_limit) {
    c.array.reserve(n);
    for (uint64_t w = 0; w < words_per_chunk; ++w)
      for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1)
        c.array.push_back(static_cast<uint16_t>(w * 64 + __builtin_ctzll(bits)));
  } else {
    c.bits = words;
  }
  chunks_[index] = std::move(c);
}

status sample_ledger::record(uint64_t id, uint64_t times) {
  if (id >= samples_)
    return fail(
        fmt::format("sample ledger: id {} out of range, expected an id below {}", id, samples_));
  if (times == 0)
    return {};
  const bool fresh = insert(id / chunk_ids, static_cast<uint16_t>(id % chunk_ids));
  const uint64_t repeats = times - (fresh ? 1 : 0);
  if (repeats > 0)
    repeats_[id] += repeats;
  return {};
}

status sample_ledger::record(const std::vector<uint64_t>& ids) {
  for (auto id : ids)
    if (auto st = record(id); !st)
      return st;
  return {};
}

status sample_ledger::merge(const sample_ledger& other) {
  if (other.samples_ != samples_)
    return fail(fmt::format("sample ledger: cannot merge a ledger of {} ids into one of {}",
                            other.samples_, samples_));
  if (&other == this) {
    // Merging into itself would read what it writes: merge a snapshot instead.
    const sample_ledger copy = other; // NOLINT(performance-unnecessary-copy-initialization)
    return merge(copy);
  }
  std::vector<uint64_t> mine, theirs;
  for (const auto& [index, c] : other.chunks_) {
    other.to_bitmap(index, c, theirs);
    auto it = chunks_.find(index);
    if (it == chunks_.end()) {
      mine.assign(words_per_chunk, 0);
    } else {
      to_bitmap(index, it->second, mine);
    }
    // An id both have seen is a repeat; the union is what is seen now.
    for (uint64_t w = 0; w < words_per_chunk; ++w) {
      for (uint64_t both = mine[w] & theirs[w]; both != 0; both &= both - 1)
        ++repeats_[index * chunk_ids + w * 64 + __builtin_ctzll(both)];
      mine[w] |= theirs[w];
    }
    assign(index, mine);
  }
  for (const auto& [id, extra] : other.repeats_)
    repeats_[id] += extra;
  return {};
}

uint64_t sample_ledger::count(uint64_t id) const {
  if (id >= samples_)
    return 0;
  auto it = chunks_.find(id / chunk_ids);
  if (it == chunks_.end() ||
      !contains(it->first, it->second, static_cast<uint16_t>(id % chunk_ids)))
    return 0;
  auto r = repeats_.find(id);
  return 1 + (r == repeats_.end() ? 0 : r->second);
}

ledger_summary sample_ledger::summary() const {
  ledger_summary s;
  s.samples = samples_;
  uint64_t seen = 0;
  for (const auto& [index, c] : chunks_)
    seen += c.cardinality;
  s.more = repeats_.size();
  s.once = seen - s.more;
  s.never = samples_ - seen;
  s.records = seen;
  s.max_count = seen > 0 ? 1 : 0;
  for (const auto& [id, extra] : repeats_) {
    s.records += extra;
    s.max_count = std::max(s.max_count, extra + 1);
  }
  return s;
}

uint64_t sample_ledger::memory_bytes() const {
  // std::map nodes: three pointers, a colour and the value; 48 bytes is typical.
  uint64_t bytes = 0;
  for (const auto& [index, c] : chunks_)
    bytes += 48 + sizeof(chunk) + c.array.capacity() * 2 + c.bits.capacity() * 8;
  return bytes + repeats_.size() * 64;
}

std::string sample_ledger::serialize() const {
  std::string out;
  out.push_back(static_cast<char>(ledger_version));
  internal::put_varint(out, samples_);
  internal::put_varint(out, chunks_.size());
  uint64_t prev = 0;
  for (const auto& [index, c] : chunks_) {
    internal::put_varint(out, index - prev);
    prev = index;
    if (c.is_bitmap()) {
      out.push_back(static_cast<char>(kind_bitmap));
      for (auto w : c.bits)
        internal::put_u64(out, w);
    } else if (c.cardinality == capacity(index)) {
      out.push_back(static_cast<char>(kind_full));
    } else {
      out.push_back(static_cast<char>(kind_array));
      internal::put_varint(out, c.array.size());
      uint64_t last = 0;
      for (auto o : c.array) {
        internal::put_varint(out, o - last);
        last = o;
      }
    }
  }
  internal::put_varint(out, repeats_.size());
  prev = 0;
  for (const auto& [id, extra] : repeats_) {
    internal::put_varint(out, id - prev);
    internal::put_varint(out, extra);
    prev = id;
  }
  return out;
}

result<sample_ledger> sample_ledger::parse(std::string_view bytes) {
  internal::byte_reader in(bytes);
  auto bad = [&](const std::string& what) {
    return fail(
        fmt::format("sample ledger: {} (at byte {} of {})", what, in.offset(), bytes.size()));
  };
  uint8_t version = 0;
  if (!in.byte(version))
    return fail("sample ledger: empty, expected the bytes serialize wrote");
  if (version != ledger_version)
    return fail(fmt::format("sample ledger: version {}, expected {}", version, ledger_version));
  uint64_t samples = 0, count = 0;
  if (!in.varint(samples) || !in.varint(count))
    return bad("truncated header");
  sample_ledger l(samples);
  const uint64_t max_chunks = (samples + chunk_ids - 1) / chunk_ids;
  if (count > max_chunks)
    return bad(
        fmt::format("{} chunks, a range of {} ids has at most {}", count, samples, max_chunks));
  std::vector<uint64_t> words;
  uint64_t index = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t delta = 0;
    uint8_t kind = 0;
    if (!in.varint(delta) || !in.byte(kind))
      return bad("truncated chunk header");
    if ((i > 0 && delta == 0) || delta >= max_chunks - index)
      return bad(fmt::format("chunk index delta {} after chunk {}, expected increasing indices "
                             "below {}",
                             delta, index, max_chunks));
    index += delta;
    const uint64_t cap = l.capacity(index);
    words.assign(words_per_chunk, 0);
    if (kind == kind_full) {
      l.to_bitmap(index, chunk{static_cast<uint32_t>(cap), {}, {}}, words);
    } else if (kind == kind_array) {
      uint64_t n = 0;
      if (!in.varint(n) || n == 0 || n > cap)
        return bad(fmt::format("array chunk {}: size missing or not in [1, {}]", index, cap));
      uint64_t off = 0;
      for (uint64_t k = 0; k < n; ++k) {
        uint64_t d = 0;
        if (!in.varint(d))
          return bad(fmt::format("array chunk {}: truncated", index));
        if ((k > 0 && d == 0) || d >= cap - off)
          return bad(fmt::format("array chunk {}: offsets not increasing below {}", index, cap));
        off += d;
        words[off / 64] |= uint64_t{1} << (off % 64);
      }
    } else if (kind == kind_bitmap) {
      for (auto& w : words)
        if (!in.u64(w))
          return bad(fmt::format("bitmap chunk {}: truncated", index));
      if (cap < chunk_ids) {
        for (uint64_t w = cap / 64; w < words_per_chunk; ++w) {
          const uint64_t keep = w == cap / 64 ? (uint64_t{1} << (cap % 64)) - 1 : 0;
          if (words[w] & ~keep)
            return bad(fmt::format("bitmap chunk {}: ids at or above {}", index, samples));
        }
      }
    } else {
      return bad(fmt::format("chunk {}: unknown kind {}, expected 0 (full), 1 (array) or 2 "
                             "(bitmap)",
                             index, kind));
    }
    l.assign(index, words);
    if (l.chunks_.find(index) == l.chunks_.end())
      return bad(fmt::format("chunk {}: empty", index));
  }
  uint64_t repeats = 0;
  if (!in.varint(repeats))
    return bad("truncated repeat count");
  uint64_t id = 0;
  for (uint64_t i = 0; i < repeats; ++i) {
    uint64_t delta = 0, extra = 0;
    if (!in.varint(delta) || !in.varint(extra))
      return bad("truncated repeats");
    if ((i > 0 && delta == 0) || delta >= samples - id)
      return bad(fmt::format("repeat id delta {} after id {}, expected increasing ids below {}",
                             delta, id, samples));
    id += delta;
    if (extra == 0 || l.count(id) == 0)
      return bad(fmt::format("repeat of id {}: {} extra counts of an id {}", id, extra,
                             l.count(id) == 0 ? "never seen" : "seen"));
    l.repeats_[id] = extra;
  }
  if (!in.at_end())
    return bad("bytes follow the ledger");
  return l;
}

ledger_comparison compare(const sample_ledger& trained, const sample_ledger& expected) {
  ledger_comparison out;
  std::set<uint64_t> indices;
  for (const auto& kv : trained.chunks_)
    indices.insert(kv.first);
  for (const auto& kv : expected.chunks_)
    indices.insert(kv.first);
  std::vector<uint64_t> t, e;
  const sample_ledger::chunk none;
  for (auto index : indices) {
    auto ti = trained.chunks_.find(index);
    auto ei = expected.chunks_.find(index);
    if (ti != trained.chunks_.end())
      trained.to_bitmap(index, ti->second, t);
    else
      trained.to_bitmap(index, none, t);
    if (ei != expected.chunks_.end())
      expected.to_bitmap(index, ei->second, e);
    else
      expected.to_bitmap(index, none, e);
    // First as if every count were 0 or 1; ids with repeats are corrected below.
    std::vector<std::pair<uint64_t, bool>> odd; // (id, missing?) in this chunk
    for (uint64_t w = 0; w < words_per_chunk; ++w) {
      out.exact += static_cast<uint64_t>(__builtin_popcountll(t[w] & e[w]));
      for (uint64_t diff = t[w] ^ e[w]; diff != 0; diff &= diff - 1) {
        const uint64_t bit = static_cast<uint64_t>(__builtin_ctzll(diff));
        odd.emplace_back(index * sample_ledger::chunk_ids + w * 64 + bit, (e[w] >> bit) & 1);
      }
    }
    const uint64_t lo = index * sample_ledger::chunk_ids, hi = lo + sample_ledger::chunk_ids;
    std::set<uint64_t> repeated;
    for (auto it = trained.repeats_.lower_bound(lo); it != trained.repeats_.end() && it->first < hi;
         ++it)
      repeated.insert(it->first);
    for (auto it = expected.repeats_.lower_bound(lo);
         it != expected.repeats_.end() && it->first < hi; ++it)
      repeated.insert(it->first);
    for (auto id : repeated) {
      const uint64_t w = (id - lo) / 64, bit = (id - lo) % 64;
      if (((t[w] & e[w]) >> bit & 1) == 0)
        continue; // seen by one side only: the XOR pass classified it already
      const uint64_t tc = trained.count(id), ec = expected.count(id);
      if (tc != ec) {
        --out.exact;
        odd.emplace_back(id, tc < ec);
      }
    }
    std::sort(odd.begin(), odd.end());
    for (const auto& [id, is_missing] : odd) {
      if (is_missing) {
        ++out.missing;
        push_example(out.first_missing, id);
      } else {
        ++out.extra;
        push_example(out.first_extra, id);
      }
    }
  }
  return out;
}

} // namespace starling::kernels
