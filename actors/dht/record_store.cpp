#include "actors/dht/record_store.hpp"

#include <algorithm>

#include "actors/dht/signing.hpp"

namespace starling::actors::dht {

record_store::record_store(store_limits limits) : limits_(limits) {}

int64_t record_store::entry::max_expiration() const {
  if (!is_dict)
    return plain.expiration_ns;
  int64_t m = INT64_MIN;
  for (auto& kv : subs)
    m = std::max(m, kv.second.expiration_ns);
  return m;
}

bool record_store::purge_entry(entry& e, int64_t now_ns) {
  if (!e.is_dict) {
    if (e.plain.expiration_ns > now_ns)
      return true;
    --count_;
    return false;
  }
  for (auto it = e.subs.begin(); it != e.subs.end();) {
    if (it->second.expiration_ns <= now_ns) {
      it = e.subs.erase(it);
      --count_;
    } else {
      ++it;
    }
  }
  return !e.subs.empty();
}

void record_store::purge(int64_t now_ns) {
  for (auto it = entries_.begin(); it != entries_.end();)
    it = purge_entry(it->second, now_ns) ? std::next(it) : entries_.erase(it);
}

bool record_store::make_room(int64_t now_ns) {
  if (count_ < limits_.max_records)
    return true;
  purge(now_ns);
  return count_ < limits_.max_records;
}

store_status record_store::put(const messages::dht_record& r, int64_t now_ns) {
  if (r.expiration_ns <= now_ns) {
    ++counters_.expired;
    return store_status::expired;
  }
  if (r.key.size() + r.subkey.size() + r.value.size() > limits_.max_record_bytes) {
    ++counters_.too_large;
    return store_status::too_large;
  }
  if (!verify(r)) {
    ++counters_.bad_signature;
    return store_status::bad_signature;
  }
  if (signer_banned(r)) {
    ++counters_.banned;
    return store_status::banned;
  }
  auto it = entries_.find(r.key);
  if (it != entries_.end() && !purge_entry(it->second, now_ns)) {
    entries_.erase(it);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    if (!make_room(now_ns)) {
      ++counters_.full;
      return store_status::full;
    }
    entry e;
    e.is_dict = r.has_subkey;
    if (r.has_subkey)
      e.subs.emplace(r.subkey, r);
    else
      e.plain = r;
    entries_.emplace(r.key, std::move(e));
    ++count_;
    return store_status::accepted;
  }
  auto& e = it->second;
  if (!r.has_subkey || !e.is_dict) {
    // A plain value against anything, or a sub-key against a plain value: the later
    // expiration wins and replaces the whole entry.
    if (r.expiration_ns < e.max_expiration()) {
      ++counters_.older;
      return store_status::older;
    }
    count_ -= e.is_dict ? e.subs.size() : 1;
    e.subs.clear();
    e.is_dict = r.has_subkey;
    if (r.has_subkey)
      e.subs.emplace(r.subkey, r);
    else
      e.plain = r;
    ++count_;
    return store_status::accepted;
  }
  auto sit = e.subs.find(r.subkey);
  if (sit != e.subs.end()) {
    if (r.expiration_ns < sit->second.expiration_ns) {
      ++counters_.older;
      return store_status::older;
    }
    sit->second = r;
    return store_status::accepted;
  }
  if (!make_room(now_ns)) {
    ++counters_.full;
    return store_status::full;
  }
  // make_room may have purged this very entry's last sub-key.
  auto& e2 = entries_[r.key];
  e2.is_dict = true;
  e2.subs.emplace(r.subkey, r);
  ++count_;
  return store_status::accepted;
}

std::vector<messages::dht_record> record_store::get(const std::string& key, int64_t now_ns) const {
  std::vector<messages::dht_record> out;
  auto it = entries_.find(key);
  if (it == entries_.end())
    return out;
  auto& e = it->second;
  if (!e.is_dict) {
    if (e.plain.expiration_ns > now_ns)
      out.push_back(e.plain);
    return out;
  }
  for (auto& kv : e.subs)
    if (kv.second.expiration_ns > now_ns)
      out.push_back(kv.second);
  return out;
}

bool record_store::signer_banned(const messages::dht_record& r) const {
  if (banned_.empty())
    return false;
  auto who = required_signer(r);
  return who && banned_.count(*who) != 0;
}

size_t record_store::ban_signer(const std::string& public_key) {
  if (!banned_.insert(public_key).second)
    return 0;
  size_t dropped = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& e = it->second;
    if (!e.is_dict) {
      if (signer_banned(e.plain)) {
        ++dropped;
        --count_;
        it = entries_.erase(it);
        continue;
      }
    } else {
      for (auto s = e.subs.begin(); s != e.subs.end();)
        if (signer_banned(s->second)) {
          ++dropped;
          --count_;
          s = e.subs.erase(s);
        } else {
          ++s;
        }
      if (e.subs.empty()) {
        it = entries_.erase(it);
        continue;
      }
    }
    ++it;
  }
  return dropped;
}

} // namespace starling::actors::dht
