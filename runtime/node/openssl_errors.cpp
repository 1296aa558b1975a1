#include "runtime/node/openssl_errors.hpp"

#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

namespace {

/// libssl's definition of `name` (the next one after this executable's).
template <class F>
F next_definition(const char* name) {
  auto* p = ::dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "starling: libssl has no %s\n", name);
    std::abort();
  }
  return reinterpret_cast<F>(p);
}

} // namespace

// Each: clear this thread's error queue, then call libssl's (see the header).
#define STARLING_CLEAN_SSL_CALL(name, params, args)                                          \
  extern "C" int name params {                                                               \
    static auto real = next_definition<int(*) params>(#name);                                \
    ERR_clear_error();                                                                        \
    return real args;                                                                         \
  }

STARLING_CLEAN_SSL_CALL(SSL_read, (SSL * s, void* buf, int num), (s, buf, num))
STARLING_CLEAN_SSL_CALL(SSL_peek, (SSL * s, void* buf, int num), (s, buf, num))
STARLING_CLEAN_SSL_CALL(SSL_write, (SSL * s, const void* buf, int num), (s, buf, num))
STARLING_CLEAN_SSL_CALL(SSL_accept, (SSL * s), (s))
STARLING_CLEAN_SSL_CALL(SSL_connect, (SSL * s), (s))
STARLING_CLEAN_SSL_CALL(SSL_do_handshake, (SSL * s), (s))
STARLING_CLEAN_SSL_CALL(SSL_shutdown, (SSL * s), (s))

#undef STARLING_CLEAN_SSL_CALL

namespace starling::runtime {

bool openssl_errors_guarded() {
  return ::dlsym(RTLD_DEFAULT, "SSL_read") == reinterpret_cast<void*>(&SSL_read)
         && ::dlsym(RTLD_DEFAULT, "SSL_accept") == reinterpret_cast<void*>(&SSL_accept);
}

} // namespace starling::runtime
