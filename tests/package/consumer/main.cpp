// Proves a consumer sees the headers, the version and the feature macros of the components it linked.
#include <cstdio>
#include <vector>

#include <zerotk/zerotk.hpp>

int main() {
  zerotk::Param<float> w{"w", {2, 2}};
  std::vector<float> data{1, 2, 3, 4}, grad(4);
  w.bind(data.data(), grad.data());
  std::printf("zerotk %s (%d) numel=%zu mpi=%d eigen=%d\n", zerotk::kVersionString, ZEROTK_VERSION, w.numel(),
              ZEROTK_HAS_MPI, ZEROTK_HAS_EIGEN);
  return (w.numel() == 4 && ZEROTK_VERSION == zerotk::kVersion) ? 0 : 1;
}
