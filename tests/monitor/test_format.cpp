// Numbers are written as Python's str() writes them: checked against Python's own repr() of
// 3000+ doubles (golden/python_repr.txt, made by golden/make_python_repr.py).
#include "common.hpp"

#include <bit>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "zerotk/monitor/format.hpp"

using zerotk::monitor::MetricValue;
using zerotk::monitor::python_repr;

TEST_CASE("python_repr matches Python's repr() bit pattern by bit pattern") {
  std::ifstream in(zerotk_test::golden_dir() / "python_repr.txt");
  REQUIRE(in);
  std::string line;
  int n = 0, mismatches = 0;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string hex, expected;
    ss >> hex >> expected;
    const double v = std::bit_cast<double>(static_cast<std::uint64_t>(std::stoull(hex, nullptr, 16)));
    const std::string got = python_repr(v);
    if (got != expected && ++mismatches <= 10) CHECK_MESSAGE(got == expected, "bits " << hex);
    ++n;
  }
  CHECK(n > 3000);
  CHECK(mismatches == 0);
}

TEST_CASE("python_repr of the layouts DeepSpeed's logs show") {
  CHECK(python_repr(0.0001) == "0.0001");
  CHECK(python_repr(1e-5) == "1e-05");
  CHECK(python_repr(7.500000000000001e-05) == "7.500000000000001e-05");
  CHECK(python_repr(65536.0) == "65536.0");
  CHECK(python_repr(1e16) == "1e+16");
  CHECK(python_repr(1e15) == "1000000000000000.0");
  CHECK(python_repr(-0.0) == "-0.0");
  CHECK(python_repr(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(python_repr(-std::numeric_limits<double>::infinity()) == "-inf");
  CHECK(python_repr(std::numeric_limits<double>::quiet_NaN()) == "nan");
  CHECK(python_repr(static_cast<double>(2.3025851f)) == "2.3025851249694824");  // float32 loss, as torch's .item()
}

TEST_CASE("MetricValue keeps Python's int/float distinction") {
  CHECK(MetricValue(65536).str() == "65536");
  CHECK(MetricValue(std::int64_t{-3}).str() == "-3");
  CHECK(MetricValue(65536.0).str() == "65536.0");
  CHECK(MetricValue(0.5f).str() == "0.5");
  CHECK(MetricValue(7).is_integer());
  CHECK_FALSE(MetricValue(7.0).is_integer());
  CHECK(MetricValue(7).as_double() == 7.0);
}
