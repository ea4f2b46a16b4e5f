#pragma once
// Shared by the checkpoint tests: a scratch directory per test, exact comparison of engine states,
// and the engine types used. The model, data and training loop are the engine tests' (tests/engine).
#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "../engine/engine_fixture.hpp"
#include "zerotk/checkpoint.hpp"
#include "zerotk/engine.hpp"

namespace zt_test {

/// A fresh, empty directory under the build tree, removed when the object goes away.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::path(ZEROTK_TEST_BINARY_DIR) / "scratch" /
            (name + "." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Every field of two engine states (the rank-local part included), floats compared bit for bit.
inline bool same_state(const zerotk::EngineState& a, const zerotk::EngineState& b) {
  if (a.micro_steps != b.micro_steps || a.global_steps != b.global_steps || a.skipped_steps != b.skipped_steps) return false;
  if (!(a.scaler == b.scaler) || a.scheduler != b.scheduler || a.groups.size() != b.groups.size()) return false;
  for (std::size_t g = 0; g < a.groups.size(); ++g) {
    const auto &x = a.groups[g], &y = b.groups[g];
    if (x.optimizer.step != y.optimizer.step || !same_bits(x.master, y.master) || !same_bits(x.optimizer.m, y.optimizer.m) ||
        !same_bits(x.optimizer.v, y.optimizer.v) || !same_bits(x.optimizer.v_fresh, y.optimizer.v_fresh) ||
        x.optimizer.tensor_scalars.size() != y.optimizer.tensor_scalars.size() ||
        (!x.optimizer.tensor_scalars.empty() &&
         std::memcmp(x.optimizer.tensor_scalars.data(), y.optimizer.tensor_scalars.data(),
                     x.optimizer.tensor_scalars.size() * sizeof(double)) != 0)) {
      return false;
    }
    const zerotk::RankLocalState &lx = x.rank_local, &ly = y.rank_local;
    if (!same_bits(lx.values, ly.values) || lx.scalars.size() != ly.scalars.size() ||
        (!lx.scalars.empty() && std::memcmp(lx.scalars.data(), ly.scalars.data(), lx.scalars.size() * sizeof(double)) != 0)) {
      return false;
    }
  }
  return true;
}

/// A warm-up over 8 steps: mid-warm-up for every save point of these tests.
inline zerotk::LrScheduler warmup_schedule() {
  zerotk::optim::WarmupLROptions wo;
  wo.warmup_min_lr = 0.0;
  wo.warmup_max_lr = 1e-2;
  wo.warmup_num_steps = 8;
  wo.warmup_type = zerotk::optim::WarmupType::linear;
  return zerotk::optim::WarmupLR(wo, 1e-2);
}

inline std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}
inline std::string text_of(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace zt_test
