// A collective's Work discarded at the call: Work is [[nodiscard]], so this must not compile with
// -Werror=unused-result (the buffers would be read before the operation finished).
#include "zerotk/comm/threads.hpp"
void reduce(zerotk::comm::ThreadsCommunicator& c, float* x) {
#ifdef ZEROTK_FAILTEST_CONTROL
  c.all_reduce(x, x, 1, zerotk::DType::fp32, zerotk::comm::ReduceOp::sum).wait();
#else
  c.all_reduce(x, x, 1, zerotk::DType::fp32, zerotk::comm::ReduceOp::sum);
#endif
}
int main() {}
