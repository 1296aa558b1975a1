#include "runtime/plot/svg.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

namespace starling::runtime::plot {

namespace {

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// Tick positions: integer decades on a log axis, 1/2/5 steps on a linear one.
std::vector<double> ticks(double lo, double hi, bool log) {
  std::vector<double> out;
  if (log) {
    const auto step = std::max(1.0, std::ceil((hi - lo) / 8.0));
    for (double t = std::ceil(lo / step) * step; t <= hi + 1e-9; t += step)
      out.push_back(t);
    return out;
  }
  const double raw = (hi - lo) / 6.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (f * mag >= raw) {
      step = f * mag;
      break;
    }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(t);
  return out;
}

std::string tick_label(double t, bool log) {
  if (log)
    return fmt::format("1e{}", static_cast<int>(std::lround(t)));
  return fmt::format("{:.3g}", t);
}

const char* const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                               "#9467bd", "#8c564b", "#e377c2", "#17becf"};

} // namespace

result<std::string> render_svg(const line_plot& plot) {
  // Transform to plotted coordinates first, dropping points a log axis cannot show.
  std::vector<std::vector<std::pair<double, double>>> data;
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const auto& s : plot.lines) {
    auto& pts = data.emplace_back();
    for (auto [x, y] : s.points) {
      if ((plot.log_x && !(x > 0)) || (plot.log_y && !(y > 0)) || !std::isfinite(x)
          || !std::isfinite(y))
        continue;
      const double px = plot.log_x ? std::log10(x) : x;
      const double py = plot.log_y ? std::log10(y) : y;
      pts.emplace_back(px, py);
      x_lo = std::min(x_lo, px);
      x_hi = std::max(x_hi, px);
      y_lo = std::min(y_lo, py);
      y_hi = std::max(y_hi, py);
    }
  }
  if (!(x_lo <= x_hi))
    return fail(fmt::format("plot '{}': no drawable point in {} series", plot.title,
                            plot.lines.size()));
  if (x_hi == x_lo)
    x_hi = x_lo + 1;
  if (y_hi == y_lo)
    y_hi = y_lo + 1;
  const double left = 80, right = 200, top = 40, bottom = 60;
  const double pw = plot.width - left - right, ph = plot.height - top - bottom;
  auto sx = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * pw; };
  auto sy = [&](double y) { return top + (1.0 - (y - y_lo) / (y_hi - y_lo)) * ph; };
  std::ostringstream o;
  o << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                   "font-family=\"sans-serif\" font-size=\"12\">\n",
                   plot.width, plot.height);
  o << fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", plot.width, plot.height);
  o << fmt::format("<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">{}</text>\n",
                   left + pw / 2, escape(plot.title));
  o << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                   "stroke=\"black\"/>\n",
                   left, top, pw, ph);
  for (double t : ticks(x_lo, x_hi, plot.log_x)) {
    o << fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                     "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
                     sx(t), top, top + ph, top + ph + 16, tick_label(t, plot.log_x));
  }
  for (double t : ticks(y_lo, y_hi, plot.log_y)) {
    o << fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{3}\" y=\"{0:.1f}\" text-anchor=\"end\" "
                     "dominant-baseline=\"middle\">{4}</text>\n",
                     sy(t), left, left + pw, left - 6, tick_label(t, plot.log_y));
  }
  o << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", left + pw / 2,
                   plot.height - 16, escape(plot.x_label));
  o << fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" "
                   "transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                   top + ph / 2, escape(plot.y_label));
  for (std::size_t i = 0; i < data.size(); ++i) {
    const char* color = palette[i % (sizeof(palette) / sizeof(palette[0]))];
    if (!data[i].empty()) {
      o << "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" << color << "\" points=\"";
      for (auto [x, y] : data[i])
        o << fmt::format("{:.1f},{:.1f} ", sx(x), sy(y));
      o << "\"/>\n";
    }
    const double ly = top + 10 + 20.0 * static_cast<double>(i);
    o << fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" "
                     "stroke-width=\"3\"/><text x=\"{4}\" y=\"{1}\" "
                     "dominant-baseline=\"middle\">{5}</text>\n",
                     left + pw + 10, ly, left + pw + 30, color, left + pw + 36,
                     escape(plot.lines[i].name));
  }
  for (const auto& [mx, label] : plot.markers) {
    const double px = plot.log_x ? (mx > 0 ? std::log10(mx) : x_lo - 1) : mx;
    if (px < x_lo || px > x_hi)
      continue;
    o << fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" "
                     "stroke=\"#888\" stroke-dasharray=\"4 3\"/><text x=\"{0:.1f}\" y=\"{3}\" "
                     "text-anchor=\"middle\" font-size=\"9\" fill=\"#666\">{4}</text>\n",
                     sx(px), top, top + ph, top - 3, escape(label));
  }
  o << "</svg>\n";
  return o.str();
}

status write_svg(const line_plot& plot, const std::string& path) {
  auto svg = render_svg(plot);
  if (!svg)
    return svg.error();
  std::ofstream f{path};
  if (!f)
    return fail(fmt::format("cannot open '{}' for writing", path));
  f << *svg;
  if (!f)
    return fail(fmt::format("writing '{}' failed", path));
  return {};
}

} // namespace starling::runtime::plot
