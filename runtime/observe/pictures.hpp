// The run's pictures on its page (issue 42, item 4 of the page): the SVG plots a run writes into
// its folder (runtime/plot: `loss.svg`, `accuracy.svg`, ... at the end of a dedloc or SWARM
// run) and its PNG images (the text-to-image demo's `grid.png`), served while the endpoint runs,
// and one rendered live from the snapshot's loss curve at a low rate. Names are checked before
// any file is touched: a plain `[A-Za-z0-9_.-]+.svg` or `.png` in the run's folder, no path, no
// dot file; files are read whole up to a bound. The plots are
// self-contained (no scripts, no external fonts or links).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::runtime::observe {

struct snapshot;

/// The name of the picture rendered live from the loss curve.
inline constexpr const char* live_loss_picture = "live-loss.svg";

/// At most this many pictures of the run's folder are listed.
inline constexpr size_t max_pictures = 32;

/// Largest picture file served, in bytes.
inline constexpr size_t max_picture_bytes = 4 << 20;

/// True for a name the endpoint may serve: 1-64 characters of `[A-Za-z0-9_.-]`, ending in
/// `.svg` or `.png`, not starting with a dot.
bool picture_name_ok(const std::string& name);

/// True when `name` ends in `.png` (served as `image/png`; an SVG otherwise).
bool picture_is_png(const std::string& name);

/// The pictures of `dir` (regular files with a name `picture_name_ok` takes), sorted, at most
/// `max_pictures`; none when `dir` is empty or cannot be read.
std::vector<std::string> list_pictures(const std::string& dir);

/// The bytes of picture `name` of `dir`: fails for a name `picture_name_ok` refuses, a file that
/// is missing, not regular, larger than `max_picture_bytes`, or that does not start like an SVG
/// (or, for a `.png` name, with the PNG signature).
result<std::string> read_picture(const std::string& dir, const std::string& name);

/// The loss curve of `s` as an SVG plot (runtime/plot); fails with fewer than two points.
result<std::string> render_loss_picture(const snapshot& s);

/// The live loss picture, rendered again at most every `every` (handlers share it).
class live_picture {
public:
  explicit live_picture(std::chrono::milliseconds every = std::chrono::seconds(5))
      : every_(every) {}
  /// The picture of `s`, or the one rendered less than `every` ago.
  result<std::string> get(const snapshot& s);

private:
  std::mutex mtx_;
  std::chrono::milliseconds every_;
  std::chrono::steady_clock::time_point at_{};
  uint64_t version_ = 0;
  std::string svg_;
};

} // namespace starling::runtime::observe
