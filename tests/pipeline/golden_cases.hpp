#pragma once
// The schedules kept as golden files in tests/pipeline/golden (written by make_golden.cpp).
#include <vector>

namespace zt_test {

struct GoldenCase {
  const char* file;
  const char* spec;
  int p, m;
};

inline std::vector<GoldenCase> golden_cases() {
  return {{"gpipe_p2_m3.txt", "gpipe", 2, 3},
          {"1f1b_p3_m4.txt", "1f1b", 3, 4},
          {"interleaved2_p2_m4.txt", "interleaved:2", 2, 4},
          {"zbh1_p3_m4.txt", "zbh1", 3, 4}};
}

}  // namespace zt_test
