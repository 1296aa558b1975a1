#include "runtime/observe/pictures.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "runtime/observe/snapshot.hpp"
#include "runtime/plot/svg.hpp"

namespace starling::runtime::observe {

bool picture_is_png(const std::string& name) {
  return name.size() >= 4 && name.compare(name.size() - 4, 4, ".png") == 0;
}

bool picture_name_ok(const std::string& name) {
  if (name.size() < 5 || name.size() > 64 || name[0] == '.')
    return false;
  if (!picture_is_png(name) && name.compare(name.size() - 4, 4, ".svg") != 0)
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

std::vector<std::string> list_pictures(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  if (dir.empty())
    return out;
  std::error_code ec;
  fs::directory_iterator it{dir, ec};
  // A folder holding thousands of files is not read to its end: the first entries only.
  for (size_t seen = 0; !ec && it != fs::directory_iterator{} && seen < 4096;
       it.increment(ec), ++seen) {
    auto name = it->path().filename().string();
    std::error_code fec;
    // The folder's own entries: a link is not listed (nor served), whatever it points to.
    if (picture_name_ok(name) && name != live_loss_picture &&
        fs::is_regular_file(it->symlink_status(fec)))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  if (out.size() > max_pictures)
    out.resize(max_pictures);
  return out;
}

result<std::string> read_picture(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  if (!picture_name_ok(name))
    return fail("not a picture name: expected [A-Za-z0-9_.-]+.svg or .png");
  if (dir.empty())
    return fail("the run writes no pictures");
  auto path = fs::path{dir} / name;
  std::error_code ec;
  // The folder's own entry, not what a link points to.
  auto st = fs::symlink_status(path, ec);
  if (ec || !fs::is_regular_file(st))
    return fail("no such picture");
  auto size = fs::file_size(path, ec);
  if (ec || size > max_picture_bytes)
    return fail("picture too large or unreadable");
  std::ifstream in{path, std::ios::binary};
  std::string bytes(static_cast<size_t>(size), '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size)))
    return fail("picture unreadable");
  if (picture_is_png(name)) {
    // The PNG signature; the browser decodes the rest as an image, nothing in it runs.
    if (bytes.rfind(std::string("\x89PNG\r\n\x1a\n", 8), 0) != 0)
      return fail("not a PNG file");
  } else if (bytes.rfind("<svg", 0) != 0 && bytes.rfind("<?xml", 0) != 0) {
    return fail("not an SVG file");
  }
  return bytes;
}

result<std::string> render_loss_picture(const snapshot& s) {
  if (s.loss_curve.size() < 2)
    return fail("fewer than two loss reports so far");
  plot::line_plot p;
  p.title = "training loss (live)";
  p.x_label = s.run.mode == "sim" ? "virtual run time (s)" : "run time (s)";
  p.y_label = "loss";
  p.width = 640;
  p.height = 360;
  p.lines.push_back({"loss reports", s.loss_curve});
  return plot::render_svg(p);
}

result<std::string> live_picture::get(const snapshot& s) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto now = std::chrono::steady_clock::now();
  if (!svg_.empty() && (s.version == version_ || now - at_ < every_))
    return svg_;
  auto r = render_loss_picture(s);
  if (!r)
    return r;
  svg_ = std::move(*r);
  version_ = s.version;
  at_ = now;
  return svg_;
}

} // namespace starling::runtime::observe
