#include "actors/trainer/ready_list.hpp"

#include <algorithm>

namespace starling::actors::trainer {

namespace {

/// (a_load, a_id) < (b_load, b_id) exactly as std::pair's operator< compares.
bool less(double a_load, const std::string& a_id, double b_load, const std::string& b_id) {
  if (a_load < b_load)
    return true;
  if (b_load < a_load)
    return false;
  return a_id < b_id;
}

} // namespace

std::vector<ready_list::entry>::const_iterator ready_list::lower(double load,
                                                                 const std::string& id) const {
  return std::lower_bound(xs_.begin(), xs_.end(), load,
                          [&](const entry& e, double l) { return less(e.load, *e.id, l, id); });
}

size_t ready_list::index_of(double load, const std::string& id) const {
  auto i = lower(load, id);
  if (i == xs_.end() || less(load, id, i->load, *i->id))
    return xs_.size();
  return static_cast<size_t>(i - xs_.begin());
}

void ready_list::insert(double load, const std::string& id, bool has_value, double value) {
  auto i = lower(load, id);
  if (i != xs_.end() && !less(load, id, i->load, *i->id))
    return;
  xs_.insert(i, entry{load, &id, has_value, value});
}

bool ready_list::erase(double load, const std::string& id) {
  auto k = index_of(load, id);
  if (k == xs_.size())
    return false;
  xs_.erase(xs_.begin() + static_cast<std::ptrdiff_t>(k));
  return true;
}

bool ready_list::reload(double load, const std::string& id, double new_load) {
  auto k = index_of(load, id);
  if (k == xs_.size())
    return false;
  auto e = xs_[k];
  e.load = new_load;
  auto at = xs_.begin() + static_cast<std::ptrdiff_t>(k);
  auto key_less = [&](const entry& x, double) { return less(x.load, *x.id, new_load, *e.id); };
  if (less(load, *e.id, new_load, *e.id)) {
    // Moves up: its place is the first entry after it that is not less than the new key.
    auto to = std::lower_bound(at + 1, xs_.end(), new_load, key_less);
    std::rotate(at, at + 1, to);
    *(to - 1) = e;
  } else {
    // Moves down (or stays): the first entry before it that is not less than the new key.
    auto to = std::lower_bound(xs_.begin(), at, new_load, key_less);
    std::rotate(to, at, at + 1);
    *to = e;
  }
  return true;
}

bool ready_list::set_value(double load, const std::string& id, bool has_value, double value) {
  auto k = index_of(load, id);
  if (k == xs_.size())
    return false;
  xs_[k].has_value = has_value;
  xs_[k].value = value;
  return true;
}

bool ready_list::contains(double load, const std::string& id) const {
  return index_of(load, id) < xs_.size();
}

} // namespace starling::actors::trainer
