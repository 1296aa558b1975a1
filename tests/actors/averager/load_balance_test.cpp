#include "actors/averager/load_balance.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace starling::test::actors_load_balance_test {

using namespace starling::actors::averager;

namespace {

/// Continuous cost of fractions, as `communication_time` but before rounding.
double fraction_cost(const std::vector<double>& b, const std::vector<double>& w) {
  double worst = 0, c = std::max(0.0, static_cast<double>(b.size()) - 2.0);
  for (size_t i = 0; i < b.size(); ++i)
    if (b[i] > 0)
      worst = std::max(worst, (1 + c * w[i]) / b[i]);
  return worst;
}

std::vector<double> uniform_over_servers(const std::vector<double>& b) {
  auto servers = std::count_if(b.begin(), b.end(), [](double x) { return x > 0; });
  std::vector<double> w(b.size(), 0.0);
  for (size_t i = 0; i < b.size(); ++i)
    if (b[i] > 0)
      w[i] = 1.0 / static_cast<double>(servers);
  return w;
}

} // namespace

TEST_CASE("bandwidths 0.55, 0.44, 0.40 split 60 elements with a minimum part of 10") {
  auto parts = balance_parts({0.55, 0.44, 0.40}, 60, 10);
  REQUIRE(parts.ok());
  CHECK(std::accumulate(parts->begin(), parts->end(), int64_t{0}) == 60);
  CHECK((*parts)[0] > (*parts)[1]);
  CHECK((*parts)[0] > (*parts)[2]);
  for (auto p : *parts)
    CHECK((p == 0 || p >= 10));
  // Without the minimum the slowest peer keeps a (small) part.
  auto free = balance_parts({0.55, 0.44, 0.40}, 60, 1);
  REQUIRE(free.ok());
  CHECK((*free)[2] > 0);
  CHECK((*free)[2] < 10);
}

TEST_CASE("all-zero bandwidths are an error, negative ones too") {
  CHECK_FALSE(balance_parts({0.0, 0.0, 0.0}, 60, 1).ok());
  CHECK_FALSE(balance_parts({}, 60, 1).ok());
  CHECK_FALSE(balance_parts({1.0, -1.0}, 60, 1).ok());
  CHECK_FALSE(balance_parts({1.0, 2.0}, -1, 1).ok());
}

TEST_CASE("client-mode peers get no part and a lone server gets everything") {
  auto parts = balance_parts({0.0, 2.0, 0.0, 0.0}, 1000, 1);
  REQUIRE(parts.ok());
  CHECK((*parts == std::vector<int64_t>{0, 1000, 0, 0}));
}

TEST_CASE("equal bandwidths give equal parts") {
  auto parts = balance_parts({3.0, 3.0, 3.0, 3.0}, 400, 1);
  REQUIRE(parts.ok());
  CHECK((*parts == std::vector<int64_t>{100, 100, 100, 100}));
}

TEST_CASE("optimal fractions equalize the time of every peer with a part") {
  std::vector<double> b{5.0, 1.0, 0.3, 0.0, 2.0, 0.05};
  auto w = optimal_fractions(b);
  REQUIRE(w.ok());
  CHECK(std::accumulate(w->begin(), w->end(), 0.0) == doctest::Approx(1.0));
  CHECK((*w)[3] == 0.0);
  // Peers with a part all finish at the same time xi (else moving load would help) ...
  double xi = (1 + 4 * (*w)[0]) / b[0];
  int with_part = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if ((*w)[i] > 0) {
      ++with_part;
      CHECK((1 + 4 * (*w)[i]) / b[i] == doctest::Approx(xi).epsilon(1e-9));
    } else if (b[i] > 0) {
      // ... and a server without a part is too slow for any part: xi b_i <= 1.
      CHECK(xi * b[i] <= 1.0 + 1e-9);
    }
  }
  // xi = (4 + 2) / (5 + 2): only the two fastest peers get parts.
  CHECK(with_part == 2);
  CHECK(xi == doctest::Approx(6.0 / 7.0));
}

TEST_CASE("fuzz: sizes are non-negative, sum to the vector, respect the minimum, beat uniform") {
  std::mt19937_64 gen(12345);
  std::uniform_int_distribution<int> peers_dist(1, 256);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::lognormal_distribution<double> bw(0.0, 1.0);
  std::uniform_int_distribution<int64_t> size_dist(0, 200000);
  std::uniform_int_distribution<int64_t> min_dist(1, 3000);
  int errors = 0;
  for (int trial = 0; trial < 400; ++trial) {
    CAPTURE(trial);
    auto n = static_cast<size_t>(peers_dist(gen));
    auto client_share = unit(gen);
    std::vector<double> b(n);
    for (auto& x : b)
      x = unit(gen) < client_share ? 0.0 : bw(gen);
    auto size = size_dist(gen);
    auto min_part = trial % 4 == 0 ? 1 : min_dist(gen);
    auto parts = balance_parts(b, size, min_part);
    if (std::all_of(b.begin(), b.end(), [](double x) { return x == 0; })) {
      CHECK_FALSE(parts.ok());
      ++errors;
      continue;
    }
    REQUIRE(parts.ok());
    REQUIRE(parts->size() == n);
    CHECK(std::accumulate(parts->begin(), parts->end(), int64_t{0}) == size);
    int nonempty = 0;
    for (size_t i = 0; i < n; ++i) {
      CHECK((*parts)[i] >= 0);
      if (b[i] == 0)
        CHECK((*parts)[i] == 0);
      nonempty += (*parts)[i] > 0;
    }
    if (nonempty > 1)
      for (auto p : *parts)
        CHECK((p == 0 || p >= min_part));

    auto w = optimal_fractions(b);
    REQUIRE(w.ok());
    auto opt = fraction_cost(b, *w);
    CHECK(opt <= fraction_cost(b, uniform_over_servers(b)) * (1 + 1e-12));
    // No random feasible split does better than the optimum.
    std::vector<double> r(n, 0.0);
    double total = 0;
    for (size_t i = 0; i < n; ++i)
      if (b[i] > 0)
        total += r[i] = -std::log(unit(gen) + 1e-300);
    for (auto& x : r)
      x /= total;
    CHECK(opt <= fraction_cost(b, r) * (1 + 1e-12));
    if (min_part == 1 && size > 0) {
      // Rounded parts cost at most one element more than the uniform split's rounded parts.
      auto uniform = largest_remainder(uniform_over_servers(b), size);
      double slack = 0;
      for (size_t i = 0; i < n; ++i)
        if (b[i] > 0)
          slack = std::max(slack, std::max(0.0, n - 2.0) / (static_cast<double>(size) * b[i]));
      CHECK(communication_time(b, *parts, size) <=
            communication_time(b, uniform, size) + slack + 1e-12);
    }
  }
  CHECK(errors < 10); // most trials have a server; the error branch is still exercised below
  CHECK_FALSE(balance_parts(std::vector<double>(256, 0.0), 100, 1).ok());
}

} // namespace starling::test::actors_load_balance_test
