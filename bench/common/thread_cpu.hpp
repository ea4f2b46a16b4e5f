#pragma once
// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), for benches that run W rank threads on
// fewer cores: wall time minus this is time the rank spent waiting (for the link model, a peer, or a
// core).
#include <time.h>

namespace zerotk::bench {

/// CPU time of the calling thread so far, ms.
inline double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

}  // namespace zerotk::bench
