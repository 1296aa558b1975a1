// A volunteer's progress line counts its own work: from when it took its slot (a slot's earlier
// holders are in the same ledger row), with its own step reports as they happen, and never more
// accepted than computed.
#include <doctest/doctest.h>

#include <cmath>

#include "runtime/experiment/contribution.hpp"

namespace starling::test::runtime_contribution_test {

using starling::runtime::contribution_count;

TEST_CASE("a slot's next holder counts from the row as it found it, not its predecessor's "
          "numbers") {
  contribution_count c;
  CHECK_FALSE(c.has_baseline());
  // The predecessor computed 900 samples and was credited 640.
  c.ledger_read(900, 640);
  CHECK(c.has_baseline());
  CHECK(c.samples() == 0);
  CHECK(c.accepted() == 0);
  // Its own steps: 256 samples; its partners credit 128 of them.
  c.own_samples(128);
  c.own_samples(128);
  c.ledger_read(900 + 128, 640 + 128);
  CHECK(c.samples() == 256);
  CHECK(c.accepted() == 128);
}

TEST_CASE("accepted never exceeds samples, whichever source is ahead") {
  contribution_count c;
  c.ledger_read(0, 0);
  // A partner's credit for the first round is read before this node's own report of the step.
  c.ledger_read(0, 128);
  CHECK(c.samples() == 0);
  CHECK(c.accepted() == 0);
  c.own_samples(128);
  CHECK(c.samples() == 128);
  CHECK(c.accepted() == 128);
  // The summary's word ahead of the reports seen here (a drop reported later): the larger.
  c.ledger_read(300, 200);
  CHECK(c.samples() == 300);
  CHECK(c.accepted() == 200);
  // A partner credit published late for the previous holder: held back at the samples.
  c.ledger_read(300, 450);
  CHECK(c.accepted() == 300);
}

TEST_CASE("a slot nobody held starts at zero; bad numbers are ignored") {
  contribution_count c;
  c.own_samples(-5);
  c.own_samples(std::nan(""));
  c.own_samples(INFINITY);
  c.ledger_read(std::nan(""), 3);
  CHECK_FALSE(c.has_baseline());
  c.ledger_read(0, 0);
  c.own_samples(64);
  CHECK(c.samples() == 64);
  CHECK(c.accepted() == 0);
}

} // namespace starling::test::runtime_contribution_test
