#include "messages/averager.hpp"

namespace starling::messages {

std::string to_string(part_status s) {
  switch (s) {
    case part_status::averaged:
      return "averaged";
    case part_status::own_value_kept:
      return "own_value_kept";
    case part_status::failed:
      return "failed";
  }
  return "unknown";
}

std::string to_string(round_outcome o) {
  switch (o) {
    case round_outcome::complete:
      return "complete";
    case round_outcome::partial:
      return "partial";
    case round_outcome::no_partner:
      return "no_partner";
    case round_outcome::error:
      return "error";
  }
  return "unknown";
}

} // namespace starling::messages
