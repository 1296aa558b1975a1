#include "runtime/node/listener_probe.hpp"

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <caf/binary_deserializer.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp/message_type.hpp>
#include <caf/io/basp/version.hpp>

#include "actors/auth/certificates.hpp"

namespace starling::runtime {

namespace {

using clock_type = std::chrono::steady_clock;

/// The last OpenSSL error in words (or `fallback` when its queue is empty).
std::string ssl_error(const char* fallback) {
  auto code = ERR_get_error();
  ERR_clear_error();
  if (code == 0)
    return fallback;
  char buf[256];
  ERR_error_string_n(code, buf, sizeof buf);
  return buf;
}

struct ssl_ctx_free {
  void operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
};
struct ssl_free {
  void operator()(SSL* p) const { SSL_free(p); }
};
struct x509_free {
  void operator()(X509* p) const { X509_free(p); }
};
struct bio_free {
  void operator()(BIO* p) const { BIO_free(p); }
};

/// One probe's connection: a non-blocking socket, maybe a TLS session on it, and a deadline
/// every wait respects.
class connection {
public:
  explicit connection(clock_type::time_point deadline) : deadline_(deadline) {}
  ~connection() {
    // One close_notify after a completed handshake, not waited for (see the header on why a
    // handshake is never left half done).
    if (ssl_ && SSL_is_init_finished(ssl_.get()))
      SSL_shutdown(ssl_.get());
    ssl_.reset();
    ERR_clear_error(); // this thread's queue, whatever the probe left there
    if (fd_ >= 0)
      ::close(fd_);
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  /// Connects to the first address of `host:port` that accepts before the deadline.
  status open(const std::string& host, uint16_t port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    auto service = std::to_string(port);
    if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
      return fail("cannot resolve " + host + ": " + ::gai_strerror(rc));
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard{found, ::freeaddrinfo};
    std::string why = "no address";
    for (auto* ai = found; ai != nullptr; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        ai->ai_protocol);
      if (fd < 0) {
        why = std::string{"socket: "} + std::strerror(errno);
        continue;
      }
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) {
        fd_ = fd;
        if (!wait(POLLOUT)) {
          why = "no connection within the probe's time";
        } else {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          if (err == 0)
            return {};
          why = std::string{"connect: "} + std::strerror(err);
        }
        fd_ = -1;
      } else {
        why = std::string{"connect: "} + std::strerror(errno);
      }
      ::close(fd);
    }
    return fail(why);
  }

  /// Runs a TLS client handshake with `ctx`; the peer's certificate must chain to its CA.
  status start_tls(SSL_CTX* ctx) {
    ssl_.reset(SSL_new(ctx));
    if (!ssl_ || SSL_set_fd(ssl_.get(), fd_) != 1)
      return fail("TLS: " + ssl_error("cannot create a session"));
    for (;;) {
      int r = SSL_connect(ssl_.get());
      if (r == 1)
        break;
      auto e = SSL_get_error(ssl_.get(), r);
      if (e == SSL_ERROR_WANT_READ && wait(POLLIN))
        continue;
      if (e == SSL_ERROR_WANT_WRITE && wait(POLLOUT))
        continue;
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return fail("TLS: no handshake within the probe's time");
      return fail("TLS handshake: " + ssl_error("refused or closed by the listener"));
    }
    if (SSL_get_verify_result(ssl_.get()) != X509_V_OK)
      return fail("TLS: the listener's certificate is not the run's");
    return {};
  }

  /// The listener's certificate (PEM), after `start_tls`.
  result<std::string> peer_certificate() {
    std::unique_ptr<X509, x509_free> cert{SSL_get1_peer_certificate(ssl_.get())};
    if (!cert)
      return fail("TLS: the listener showed no certificate");
    std::unique_ptr<BIO, bio_free> bio{BIO_new(BIO_s_mem())};
    if (!bio || PEM_write_bio_X509(bio.get(), cert.get()) != 1)
      return fail("TLS: " + ssl_error("cannot encode the listener's certificate"));
    char* data = nullptr;
    auto n = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  }

  /// Moves the deadline of every later wait to `t`.
  void set_deadline(clock_type::time_point t) { deadline_ = t; }

  /// Reads exactly `n` bytes before the deadline.
  status read(char* out, size_t n) {
    while (n > 0) {
      if (ssl_) {
        int r = SSL_read(ssl_.get(), out, static_cast<int>(n));
        if (r > 0) {
          out += r;
          n -= static_cast<size_t>(r);
          continue;
        }
        auto e = SSL_get_error(ssl_.get(), r);
        if ((e == SSL_ERROR_WANT_READ && wait(POLLIN))
            || (e == SSL_ERROR_WANT_WRITE && wait(POLLOUT)))
          continue;
        if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
          return fail("no BASP handshake within the probe's time");
        return fail("the listener closed before its BASP handshake");
      }
      auto r = ::recv(fd_, out, n, 0);
      if (r > 0) {
        out += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      if (r == 0)
        return fail("the listener closed before its BASP handshake");
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return fail(std::string{"recv: "} + std::strerror(errno));
      if (!wait(POLLIN))
        return fail("no BASP handshake within the probe's time");
    }
    return {};
  }

private:
  /// Waits for `events` on the socket until the deadline: false when it passed.
  bool wait(short events) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_
                                                                        - clock_type::now());
      if (left.count() <= 0)
        return false;
      pollfd p{fd_, events, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r > 0)
        return true;
      if (r < 0 && errno != EINTR)
        return false;
    }
  }

  clock_type::time_point deadline_;
  int fd_ = -1;
  std::unique_ptr<SSL, ssl_free> ssl_;
};

/// A TLS client context like caf_openssl's: this node's certificate and key, peers verified
/// against the run's CA, CAF's cipher list.
result<std::unique_ptr<SSL_CTX, ssl_ctx_free>> client_context(const probe_options& opts) {
  std::unique_ptr<SSL_CTX, ssl_ctx_free> ctx{SSL_CTX_new(TLS_client_method())};
  if (!ctx)
    return fail("TLS: " + ssl_error("cannot create a context"));
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), opts.certificate.c_str()) != 1)
    return fail("TLS: cannot load " + opts.certificate + ": " + ssl_error("?"));
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), opts.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return fail("TLS: cannot load " + opts.key + ": " + ssl_error("?"));
  if (SSL_CTX_load_verify_locations(ctx.get(), opts.cafile.c_str(), nullptr) != 1)
    return fail("TLS: cannot load " + opts.cafile + ": " + ssl_error("?"));
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_set_cipher_list(ctx.get(), "HIGH:!aNULL:!MD5") != 1)
    return fail("TLS: " + ssl_error("cannot set the cipher list"));
  return ctx;
}

} // namespace

result<listener_identity> probe_listener(const std::string& host, uint16_t port,
                                         const probe_options& opts) {
  namespace basp = caf::io::basp;
  listener_identity out;
  std::unique_ptr<SSL_CTX, ssl_ctx_free> ctx;
  if (opts.tls()) {
    auto made = client_context(opts);
    if (!made)
      return made.error();
    ctx = std::move(*made);
  }
  // Under TLS, a connection once made is not left before its handshake is done, even past the
  // probe's time (see probe_options::tls_grace): a TCP connect that completes in the kernel
  // while the probe gives up on it is an accepted connection to the listener too.
  auto deadline = clock_type::now() + opts.timeout;
  connection conn{ctx ? deadline + opts.tls_grace : deadline};
  if (auto st = conn.open(host, port); !st)
    return fail(st.what());
  if (ctx) {
    if (auto st = conn.start_tls(ctx.get()); !st)
      return fail(st.what());
    if (clock_type::now() > deadline)
      return fail("TLS: no handshake within the probe's time");
    conn.set_deadline(deadline);
    auto pem = conn.peer_certificate();
    if (!pem)
      return pem.error();
    auto key = actors::auth::certified_key(*pem);
    if (!key)
      return fail("TLS: the listener's certificate: " + key.error().what);
    out.certified_key = std::move(*key);
  }
  // The listening node speaks first: a BASP header, then its payload (node id, application
  // identifiers, published actor and interface). Only the node id is read.
  std::vector<char> buf(basp::header_size);
  if (auto st = conn.read(buf.data(), buf.size()); !st)
    return fail(st.what());
  basp::header hdr;
  {
    caf::binary_deserializer source{static_cast<caf::execution_unit*>(nullptr), buf.data(),
                                    buf.size()};
    if (auto err = source(hdr))
      return fail("not a BASP header");
  }
  if (hdr.operation != basp::message_type::server_handshake)
    return fail("the listener did not open with a BASP server handshake");
  if (hdr.operation_data != basp::version)
    return fail("BASP version " + std::to_string(hdr.operation_data) + ", expected "
                + std::to_string(basp::version));
  if (hdr.payload_len == 0 || hdr.payload_len > opts.max_payload)
    return fail("a BASP server handshake of " + std::to_string(hdr.payload_len) + " bytes");
  buf.resize(hdr.payload_len);
  if (auto st = conn.read(buf.data(), buf.size()); !st)
    return fail(st.what());
  caf::binary_deserializer source{static_cast<caf::execution_unit*>(nullptr), buf.data(),
                                  buf.size()};
  if (auto err = source(out.node); err || out.node == caf::none)
    return fail("no node id in the BASP server handshake");
  return out;
}

} // namespace starling::runtime
