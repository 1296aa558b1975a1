// The one translation unit that includes httplib.h (its Cflags come from pkg-config through the
// runtime library's object targets only: CMakeLists.txt).
#include "runtime/observe/http_server.hpp"

#include <atomic>
#include <thread>

#include <sys/socket.h>

#include <fmt/format.h>
#include <httplib.h>

#include "runtime/observe/exposition.hpp"
#include "runtime/observe/ledger.hpp"
#include "runtime/observe/page.hpp"
#include "runtime/observe/pictures.hpp"
#include "runtime/observe/snapshot.hpp"
#include "runtime/observe/status.hpp"

namespace starling::runtime::observe {

struct http_server::impl {
  httplib::Server server;
  std::shared_ptr<const snapshot_store> store;
  std::string host;
  uint16_t port = 0;
  std::thread listener;
  /// Set when the accept loop returned.
  std::atomic<bool> listener_done{false};
  bool stopped = false;
  /// The loss picture rendered live (at most every 5 s).
  live_picture live;
};

namespace {

const char* reason_of(int status) {
  switch (status) {
  case 400:
    return "Bad Request";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 413:
    return "Payload Too Large";
  case 414:
    return "URI Too Long";
  case 431:
    return "Request Header Fields Too Large";
  case 500:
    return "Internal Server Error";
  default:
    return status >= 500 ? "Server Error" : "Client Error";
  }
}

void no_store(httplib::Response& res) {
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Content-Type-Options", "nosniff");
}

} // namespace

result<std::unique_ptr<http_server>> http_server::start(std::shared_ptr<const snapshot_store> store,
                                                        const http_options& opts) {
  if (!store)
    return fail("no snapshot store to serve");
  if (opts.threads < 1 || opts.threads > 2)
    return fail(fmt::format("expected 1 or 2 threads, got {}", opts.threads));
  if (opts.host.empty())
    return fail("expected a host to bind, got an empty one");
  if (opts.read_timeout.count() <= 0 || opts.write_timeout.count() <= 0)
    return fail("expected positive read and write timeouts");
  auto p = std::make_unique<impl>();
  p->store = std::move(store);
  p->host = opts.host;
  auto& svr = p->server;
  auto threads = opts.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // One request per connection, dropped after ~10 ms if it sends nothing (httplib's keep-alive
  // wait, whole seconds: 0 means one 10 ms poll), and after `read_timeout` if it stalls.
  svr.set_keep_alive_max_count(1);
  svr.set_keep_alive_timeout(0);
  auto us = [](std::chrono::milliseconds d) { return static_cast<time_t>(d.count()) * 1000; };
  svr.set_read_timeout(us(opts.read_timeout) / 1000000, us(opts.read_timeout) % 1000000);
  svr.set_write_timeout(us(opts.write_timeout) / 1000000, us(opts.write_timeout) % 1000000);
  svr.set_payload_max_length(4096);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half of the connections: only SO_REUSEADDR here, so a port in use fails.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  auto* st = p->store.get();
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    no_store(res);
    res.set_content(status_page(), "text/html; charset=utf-8");
  });
  svr.Get("/metrics", [st](const httplib::Request&, httplib::Response& res) {
    auto snap = st->current();
    no_store(res);
    res.set_content(render_metrics(*snap), exposition_content_type);
  });
  svr.Get("/status", [st](const httplib::Request&, httplib::Response& res) {
    auto snap = st->current();
    no_store(res);
    res.set_content(render_status(*snap), "application/json");
  });
  svr.Get("/ledger.csv", [st](const httplib::Request&, httplib::Response& res) {
    auto snap = st->current();
    no_store(res);
    res.set_header("Content-Disposition", "inline; filename=\"ledger.csv\"");
    res.set_content(render_ledger_csv(snap->ledger), "text/csv; charset=utf-8");
  });
  // The run's pictures: `/pictures` lists them (JSON), `/pictures/NAME.svg` (or `.png`) serves
  // one.
  svr.Get("/pictures", [st](const httplib::Request&, httplib::Response& res) {
    auto snap = st->current();
    std::string list = "[";
    auto names = list_pictures(snap->run.pictures_dir);
    if (snap->loss_curve.size() >= 2)
      names.insert(names.begin(), live_loss_picture);
    for (size_t i = 0; i < names.size(); ++i)
      list += fmt::format("{}\"{}\"", i ? "," : "", names[i]); // checked names: no escapes
    no_store(res);
    res.set_content(list + "]", "application/json");
  });
  auto* live = &p->live;
  svr.Get(R"(/pictures/([^/]{1,128}))", [st, live](const httplib::Request& req,
                                                  httplib::Response& res) {
    auto snap = st->current();
    auto name = req.matches[1].str();
    auto svg = name == live_loss_picture ? live->get(*snap)
                                         : read_picture(snap->run.pictures_dir, name);
    no_store(res);
    if (!svg) {
      res.status = 404;
      res.set_content("404 Not Found\n", "text/plain; charset=utf-8");
      return;
    }
    // A picture is an image: nothing in it runs or loads anything.
    res.set_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'");
    res.set_content(std::move(*svg), picture_is_png(name) ? "image/png" : "image/svg+xml");
  });
  svr.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    no_store(res);
    res.set_content(fmt::format("{} {}\n", res.status, reason_of(res.status)),
                    "text/plain; charset=utf-8");
  });
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        res.status = 500;
        res.set_content("500 internal error\n", "text/plain; charset=utf-8");
      });
  if (opts.port == 0) {
    auto port = svr.bind_to_any_port(opts.host);
    if (port <= 0)
      return fail(
          fmt::format("cannot bind {}:0 (is the host an address of this machine?)", opts.host));
    p->port = static_cast<uint16_t>(port);
  } else {
    if (!svr.bind_to_port(opts.host, opts.port))
      return fail(fmt::format("cannot bind {}:{} (in use, or not an address of this "
                              "machine)",
                              opts.host, opts.port));
    p->port = opts.port;
  }
  // Connections that arrive before the loop runs wait in the listen backlog.
  p->listener = std::thread([q = p.get()] {
    q->server.listen_after_bind();
    q->listener_done = true;
  });
  return std::unique_ptr<http_server>(new http_server(std::move(p)));
}

http_server::http_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {
  // nop
}

http_server::~http_server() {
  stop();
}

uint16_t http_server::port() const {
  return impl_->port;
}

std::string http_server::url() const {
  auto& h = impl_->host;
  return fmt::format("http://{}:{}/", h.find(':') != std::string::npos ? "[" + h + "]" : h,
                     impl_->port);
}

void http_server::stop() {
  if (impl_->stopped)
    return;
  impl_->stopped = true;
  // httplib's stop() does nothing before its accept loop runs (and the join would then wait
  // forever): wait for the loop first.
  while (!impl_->server.is_running() && !impl_->listener_done)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  impl_->server.stop();
  if (impl_->listener.joinable())
    impl_->listener.join();
}

} // namespace starling::runtime::observe
