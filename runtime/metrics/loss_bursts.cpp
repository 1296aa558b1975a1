#include "runtime/metrics/loss_bursts.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace starling::runtime {

burst_detector::burst_detector(options o) : opts_(o) {
  opts_.window = std::max<size_t>(1, opts_.window);
  opts_.min_history = std::clamp<size_t>(opts_.min_history, 1, opts_.window);
}

double burst_detector::reference() const {
  std::vector<double> v(recent_.begin(), recent_.end());
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1)
    return *mid;
  auto lower = *std::max_element(v.begin(), mid);
  return (lower + *mid) / 2;
}

bool burst_detector::add(double t, double loss) {
  bool flag = false;
  double ref = 0, excess = 0;
  if (!std::isfinite(loss)) {
    flag = true;
    excess = std::numeric_limits<double>::infinity();
    ref = recent_.empty() ? 0.0 : reference();
  } else if (recent_.size() >= opts_.min_history) {
    ref = reference();
    excess = loss - ref;
    largest_ = std::max(largest_, excess);
    flag = excess > opts_.margin;
  }
  if (!flag) {
    in_burst_ = false;
    if (std::isfinite(loss)) {
      recent_.push_back(loss);
      if (recent_.size() > opts_.window)
        recent_.pop_front();
    }
    return false;
  }
  flagged_++;
  largest_ = std::max(largest_, excess);
  if (!in_burst_) {
    in_burst_ = true;
    loss_burst b;
    b.start_t = t;
    b.reference = ref;
    bursts_.push_back(b);
  }
  auto& b = bursts_.back();
  b.end_t = t;
  b.batches++;
  if (b.batches == 1 || loss > b.peak_loss || !std::isfinite(loss)) {
    b.peak_loss = loss;
    b.peak_excess = excess;
  }
  return true;
}

} // namespace starling::runtime
