#pragma once
// zerotk/comm/detail/stream_store_impl.hpp (internal)
// Definitions of stream_store.hpp's non-template functions: included by it in header-only mode,
// compiled once in zerotk::runtime with ZEROTK_COMPILED_RUNTIME=1 (zerotk/core/runtime.hpp).

#include <cstddef>
#include <fstream>
#include <string>

#include <unistd.h>

#include "zerotk/comm/detail/stream_store.hpp"

namespace zerotk::comm::detail {

// Size of a cache as sysfs writes it ("32768K", "1M", "512"), 0 if unreadable.
ZEROTK_RUNTIME_INLINE std::size_t parse_cache_size(const std::string& s) {
  std::size_t value = 0, i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) value = value * 10 + static_cast<std::size_t>(s[i] - '0');
  if (i == 0) return 0;
  if (i < s.size() && (s[i] == 'K' || s[i] == 'k')) return value << 10;
  if (i < s.size() && (s[i] == 'M' || s[i] == 'm')) return value << 20;
  if (i < s.size() && (s[i] == 'G' || s[i] == 'g')) return value << 30;
  return value;
}

// Bytes of the largest data or unified cache of CPU 0. sysfs comes first: it reports what the
// kernel read from the CPU, where glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) can be far off in a VM
// (256 MiB on a 32 MiB EPYC guest). Then sysconf, then 32 MiB.
ZEROTK_RUNTIME_INLINE std::size_t last_level_cache_bytes_uncached() {
  std::size_t best = 0;
  int best_level = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) continue;
    if (type == "Instruction") continue;
    const std::size_t bytes = parse_cache_size(size);
    if (bytes > 0 && level >= best_level) best = bytes, best_level = level;
  }
  if (best > 0) return best;
#if defined(_SC_LEVEL3_CACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = ::sysconf(name);
    if (v > 0) return static_cast<std::size_t>(v);
  }
#endif
  return std::size_t{32} << 20;
}

}  // namespace zerotk::comm::detail
