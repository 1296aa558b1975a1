#include "actors/dht/lookup.hpp"

#include <algorithm>

namespace starling::actors::dht {

lookup::lookup(node_id target, node_id self, lookup_options opts)
    : target_(target), self_(self), opts_(opts) {}

void lookup::add(const node_id& id, const std::string& address, uint32_t depth) {
  if (id == self_ || !seen_.insert(id).second)
    return;
  candidate c{id, address, candidate::state::fresh, depth};
  auto pos = std::lower_bound(
      cands_.begin(), cands_.end(), c,
      [&](const candidate& a, const candidate& b) { return closer(target_, a.id, b.id); });
  cands_.insert(pos, std::move(c));
}

candidate* lookup::get(const node_id& id) {
  for (auto& c : cands_)
    if (c.id == id)
      return &c;
  return nullptr;
}

const candidate* lookup::find(const node_id& id) const {
  for (auto& c : cands_)
    if (c.id == id)
      return &c;
  return nullptr;
}

std::vector<candidate> lookup::next() {
  std::vector<candidate> out;
  if (stopped_)
    return out;
  size_t live = 0;
  for (auto& c : cands_) {
    if (live >= opts_.k || in_flight_ >= opts_.alpha)
      break;
    if (c.st == candidate::state::failed)
      continue;
    ++live;
    if (c.st == candidate::state::fresh) {
      c.st = candidate::state::in_flight;
      ++in_flight_;
      out.push_back(c);
    }
  }
  return out;
}

void lookup::on_response(const node_id& from,
                         const std::vector<std::pair<node_id, std::string>>& closer_peers) {
  auto c = get(from);
  if (c == nullptr || c->st != candidate::state::in_flight)
    return;
  c->st = candidate::state::responded;
  --in_flight_;
  auto depth = c->depth + 1;
  for (auto& [id, addr] : closer_peers)
    add(id, addr, depth);
}

void lookup::on_failure(const node_id& from) {
  auto c = get(from);
  if (c == nullptr || c->st != candidate::state::in_flight)
    return;
  c->st = candidate::state::failed;
  --in_flight_;
}

bool lookup::has_work() const {
  size_t live = 0;
  for (auto& c : cands_) {
    if (live >= opts_.k)
      break;
    if (c.st == candidate::state::failed)
      continue;
    ++live;
    if (c.st == candidate::state::fresh)
      return true;
  }
  return false;
}

bool lookup::done() const {
  return in_flight_ == 0 && (stopped_ || !has_work());
}

std::vector<candidate> lookup::closest_responded(size_t n) const {
  std::vector<candidate> out;
  for (auto& c : cands_) {
    if (out.size() >= n)
      break;
    if (c.st == candidate::state::responded)
      out.push_back(c);
  }
  return out;
}

uint32_t lookup::hops() const {
  uint32_t h = 0;
  for (auto& c : cands_)
    if (c.st == candidate::state::responded)
      h = std::max(h, c.depth);
  return h;
}

} // namespace starling::actors::dht
