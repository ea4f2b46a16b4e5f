// A trainer-like TU for the compiled runtime (docs/comm.md, "Compiled runtime"): run_threads and
// all_reduce of fp32 and bf16 with sum, avg and max. Built against zerotk::runtime, its object must
// define none of the threads back end's functions (check_compiled_runtime.sh); run, it checks the
// results and exits 0.
#include <cstdio>
#include <string_view>
#include <vector>

#include <zerotk/comm/threads.hpp>

namespace {

// Rank r holds r + 1 + i at element i; over W ranks: sum W(W+1)/2 + W i, avg (W+1)/2 + i, max W + i
// (all exact in bf16 for the small values used here).
template <class T>
bool all_reduce_ok(zerotk::comm::ThreadsCommunicator& c, zerotk::DType dt, zerotk::comm::ReduceOp op) {
  constexpr std::size_t n = 8;
  const int w = c.size();
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = T(static_cast<float>(c.rank() + 1) + static_cast<float>(i));
  c.all_reduce(x.data(), x.data(), n, dt, op).wait();
  for (std::size_t i = 0; i < n; ++i) {
    const float fi = static_cast<float>(i);
    const float want = op == zerotk::comm::ReduceOp::sum   ? static_cast<float>(w * (w + 1) / 2) + static_cast<float>(w) * fi
                       : op == zerotk::comm::ReduceOp::avg ? static_cast<float>(w + 1) / 2.0f + fi
                                                           : static_cast<float>(w) + fi;
    if (static_cast<float>(x[i]) != want) {
      const std::string_view name = zerotk::comm::to_string(op);
      std::fprintf(stderr, "rank %d: %.*s element %zu is %g, want %g\n", c.rank(), static_cast<int>(name.size()), name.data(), i,
                   static_cast<double>(static_cast<float>(x[i])), static_cast<double>(want));
      return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  using zerotk::comm::ReduceOp;
  const std::vector<char> ok = zerotk::comm::run_threads(2, [](zerotk::comm::ThreadsCommunicator& c) {
    bool good = true;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      good = all_reduce_ok<float>(c, zerotk::DType::fp32, op) && good;
      good = all_reduce_ok<zerotk::bfloat16>(c, zerotk::DType::bf16, op) && good;
    }
    return static_cast<char>(good);
  });
  for (char good : ok) {
    if (!good) return 1;
  }
  std::puts("runtime_user: all_reduce fp32/bf16 sum/avg/max ok");
  return 0;
}
