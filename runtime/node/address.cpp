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

std::optional<instance_address> instance_address::parse(const std::string& text) {
  if (text.size() < 4 || text[0] != '@')
    return std::nullopt;
  auto slash = text.find('/');
  if (slash == std::string::npos || slash == 1 || slash + 1 == text.size())
    return std::nullopt;
  auto head = text.substr(1, slash - 1);
  instance_address out;
  out.name = text.substr(slash + 1);
  if (head == "open") {
    out.node = -1;
    return out;
  }
  if (head.size() > 9)
    return std::nullopt;
  long v = 0;
  for (char c : head) {
    if (c < '0' || c > '9')
      return std::nullopt;
    v = v * 10 + (c - '0');
  }
  out.node = v;
  return out;
}

} // namespace starling::runtime
