#include <doctest/doctest.h>

#include "runtime/plot/svg.hpp"

namespace starling::test::runtime_svg_test {

using namespace starling::runtime::plot;

TEST_CASE("the SVG writer draws every series with a legend and skips points a log axis cannot show") {
  line_plot p;
  p.title = "error <vs> bits";
  p.x_label = "bits";
  p.y_label = "relative error";
  p.log_y = true;
  p.lines = {{"eg", {{0, 1}, {10, 1e-3}, {20, 1e-6}}}, {"masha", {{0, 1}, {5, 0.0}, {8, 1e-6}}}};
  auto svg = render_svg(p);
  REQUIRE(svg.ok());
  CHECK(svg->find("<svg") == 0);
  CHECK(svg->find("error &lt;vs&gt; bits") != std::string::npos);
  CHECK(svg->find(">eg<") != std::string::npos);
  CHECK(svg->find(">masha<") != std::string::npos);
  CHECK(svg->find("1e-6") != std::string::npos);
  // Two polylines: the zero of the second series is dropped, not drawn at -infinity.
  std::size_t lines = 0;
  for (auto pos = svg->find("<polyline"); pos != std::string::npos;
       pos = svg->find("<polyline", pos + 1))
    ++lines;
  CHECK(lines == 2);
  CHECK(svg->find("inf") == std::string::npos);
  line_plot empty;
  empty.log_y = true;
  empty.lines = {{"none", {{1, 0.0}}}};
  CHECK_FALSE(render_svg(empty).ok());
}

} // namespace starling::test::runtime_svg_test
