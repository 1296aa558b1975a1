// The run's pictures on its page (runtime/observe/pictures.hpp): only plain `*.svg` and `*.png`
// names of the run's folder are listed and served (a PNG only with the PNG signature) (no traversal, no links, no other files), the loss curve is
// drawn live once it has two points, and the endpoint answers a bad name with a 404.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "runtime/observe/http_server.hpp"
#include "runtime/observe/pictures.hpp"
#include "runtime/observe/snapshot.hpp"
#include "support/http_client.hpp"
#include "support/scratch.hpp"

namespace starling::test::runtime_observe_pictures_test {

using namespace starling::runtime::observe;
using namespace std::chrono_literals;

namespace {

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream{p} << text;
}

} // namespace

TEST_CASE("only plain svg and png names of the run's folder are listed and served") {
  CHECK(picture_name_ok("loss.svg"));
  CHECK(picture_name_ok("accuracy_bytes-2.svg"));
  CHECK(picture_name_ok("grid.png"));
  for (auto* bad : {"", ".svg", ".png", ".hidden.svg", "../x.svg", "a/b.svg", "x.jpg",
                    "x.svg.txt", "x y.svg", "%2e%2e.svg", "x.PNG"})
    CHECK_MESSAGE(!picture_name_ok(bad), bad);
  CHECK_FALSE(picture_name_ok(std::string(70, 'a') + ".svg"));

  testing::scratch dir{"starling-pictures"};
  write(dir.path / "loss.svg", "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>\n");
  write(dir.path / "accuracy.svg", "<svg xmlns=\"http://www.w3.org/2000/svg\"></svg>\n");
  write(dir.path / "notes.txt", "not a picture");
  write(dir.path / "fake.svg", "#!/bin/sh\n");
  write(dir.path / "grid.png", std::string("\x89PNG\r\n\x1a\n", 8) + "rest of the image");
  write(dir.path / "fake.png", "<svg></svg>");
  write(dir.path.parent_path() / "starling-pictures-outside.svg", "<svg></svg>");
  std::filesystem::create_symlink(dir.path.parent_path() / "starling-pictures-outside.svg",
                                  dir.path / "link.svg");
  std::filesystem::create_directory(dir.path / "dir.svg");
  auto names = list_pictures(dir.path.string());
  CHECK(names == std::vector<std::string>{"accuracy.svg", "fake.png", "fake.svg", "grid.png",
                                          "loss.svg"});
  CHECK(read_picture(dir.path.string(), "loss.svg").ok());
  CHECK(read_picture(dir.path.string(), "grid.png").ok());
  CHECK_FALSE(read_picture(dir.path.string(), "fake.png").ok()); // not a PNG
  CHECK_FALSE(read_picture(dir.path.string(), "fake.svg").ok()); // not an SVG
  CHECK_FALSE(read_picture(dir.path.string(), "link.svg").ok()); // a link out of the folder
  CHECK_FALSE(read_picture(dir.path.string(), "dir.svg").ok());  // not a file
  CHECK_FALSE(read_picture(dir.path.string(), "../starling-pictures-outside.svg").ok());
  CHECK_FALSE(read_picture(dir.path.string(), "missing.svg").ok());
  CHECK_FALSE(read_picture("", "loss.svg").ok());
  CHECK(list_pictures("").empty());
  std::filesystem::remove(dir.path.parent_path() / "starling-pictures-outside.svg");

  // Served: the list, each picture, and the live loss once the curve has two points.
  run_description r;
  r.experiment = "pictures";
  r.mode = "local";
  r.pictures_dir = dir.path.string();
  snapshot_builder b{r};
  std::string src = "trainer.0", kind = "microbatch";
  b.add({1, 0, src, kind, {{"samples", 4}, {"loss", 2.5}}, {}});
  auto store = std::make_shared<snapshot_store>();
  store->publish(b.make());
  auto srv = http_server::start(store, http_options{});
  REQUIRE(srv.ok());
  auto port = (*srv)->port();
  auto list = testing::http_get(port, "/pictures");
  REQUIRE(list);
  CHECK(list->body ==
        "[\"accuracy.svg\",\"fake.png\",\"fake.svg\",\"grid.png\",\"loss.svg\"]");
  auto grid = testing::http_get(port, "/pictures/grid.png");
  REQUIRE(grid);
  CHECK(grid->status == 200);
  CHECK(grid->head.find("Content-Type: image/png") != std::string::npos);
  CHECK(grid->body.rfind("\x89PNG", 0) == 0);
  auto loss = testing::http_get(port, "/pictures/loss.svg?r=3");
  REQUIRE(loss);
  CHECK(loss->status == 200);
  CHECK(loss->head.find("image/svg+xml") != std::string::npos);
  CHECK(loss->head.find("Content-Security-Policy: default-src 'none'") != std::string::npos);
  for (auto* bad : {"/pictures/..%2fstarling-pictures-outside.svg", "/pictures/notes.txt",
                    "/pictures/link.svg", "/pictures/live-loss.svg", "/pictures/fake.png"}) {
    auto reply = testing::http_get(port, bad);
    REQUIRE_MESSAGE(reply, bad);
    CHECK_MESSAGE(reply->status == 404, bad);
  }
  b.add({2, 0, src, kind, {{"samples", 4}, {"loss", 2.0}}, {}});
  store->publish(b.make());
  list = testing::http_get(port, "/pictures");
  REQUIRE(list);
  CHECK(list->body.rfind("[\"live-loss.svg\",", 0) == 0);
  auto live = testing::http_get(port, "/pictures/live-loss.svg");
  REQUIRE(live);
  CHECK(live->status == 200);
  CHECK(live->body.rfind("<svg", 0) == 0);
  CHECK(live->body.find("training loss (live)") != std::string::npos);
  // Self-contained: nothing it would load.
  CHECK(live->body.find("href") == std::string::npos);
  CHECK(live->body.find("<script") == std::string::npos);
}

} // namespace starling::test::runtime_observe_pictures_test
