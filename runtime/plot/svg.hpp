// A tiny SVG line-plot writer: title, axis labels, optional log-scale y, several named series,
// a legend. Enough for experiment reports without a plotting dependency.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/result.hpp"

namespace starling::runtime::plot {

/// One named polyline.
struct series {
  /// Legend entry.
  std::string name;
  /// (x, y) points in data coordinates, drawn in order.
  std::vector<std::pair<double, double>> points;
};

/// A line plot and its look.
struct line_plot {
  /// Title above the plot.
  std::string title;
  /// Label under the x axis.
  std::string x_label;
  /// Label beside the y axis.
  std::string y_label;
  /// Plot log10(y) (non-positive y values are skipped).
  bool log_y = false;
  /// Plot log10(x) (non-positive x values are skipped).
  bool log_x = false;
  /// Image size in pixels.
  int width = 800;
  /// Image size in pixels.
  int height = 500;
  /// The data.
  std::vector<series> lines;
  /// Vertical dashed lines at x positions (data coordinates) with a short label, e.g. faults.
  std::vector<std::pair<double, std::string>> markers;
};

/// Renders the plot as an SVG document; fails when no series has a drawable point.
result<std::string> render_svg(const line_plot& plot);

/// Renders and writes to `path`; fails when rendering fails or the file cannot be written.
status write_svg(const line_plot& plot, const std::string& path);

} // namespace starling::runtime::plot
