// Must NOT compile: LossScaler has specializations for Dynamic, Static and None only, and the
// primary template says so in words. With -DZEROTK_FAILTEST_CONTROL it compiles (harness check).
#include "zerotk/precision/loss_scaler.hpp"

struct Exponential {};

int main() {
#ifdef ZEROTK_FAILTEST_CONTROL
  zerotk::LossScaler<zerotk::Dynamic> s;
#else
  zerotk::LossScaler<Exponential> s;
#endif
  (void)s;
  return 0;
}
