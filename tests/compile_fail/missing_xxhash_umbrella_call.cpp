// zerotk/zerotk.hpp without ZEROTK_HAS_XXHASH leaves the checkpoint layer out; a checkpoint call then
// says what to define or link instead of "'save' is not a member of 'zerotk::checkpoint'".
#include "zerotk/zerotk.hpp"

inline void save_checkpoint(int& engine, int& comm) {
  (void)engine;
  (void)comm;
#ifndef ZEROTK_FAILTEST_CONTROL
  zerotk::checkpoint::save(engine, comm, "ckpt");
#endif
}
