#include "runtime/node/address.hpp"

#include <fmt/format.h>

#include "runtime/config/config.hpp"

namespace starling::runtime {

std::string peer_address::to_string() const {
  return fmt::format("{}:{}/{}", host, port, name);
}

std::string peer_address::endpoint() const {
  return fmt::format("{}:{}", host, port);
}

result<peer_address> peer_address::parse(const std::string& text) {
  auto slash = text.find('/');
  if (slash == std::string::npos || slash + 1 == text.size())
    return fail(fmt::format("expected HOST:PORT/NAME, got \"{}\"", text));
  auto ep = parse_endpoint(text.substr(0, slash));
  if (!ep)
    return ep.error();
  if (ep->second == 0)
    return fail(fmt::format("expected a port in [1, 65535] in \"{}\"", text));
  return peer_address{ep->first, ep->second, text.substr(slash + 1)};
}

} // namespace starling::runtime
