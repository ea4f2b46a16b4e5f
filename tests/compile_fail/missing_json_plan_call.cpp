// zerotk/plan.hpp without ZEROTK_HAS_JSON: the planner compiles; writing its choice as a DeepSpeed
// config says what to define or link.
#include "zerotk/plan.hpp"

inline void plan_config() {
  zerotk::plan::EngineSettings s;
  (void)s;
#ifndef ZEROTK_FAILTEST_CONTROL
  auto c = zerotk::plan::deepspeed_config(1, s, 8, 4);
  (void)c;
#endif
}
