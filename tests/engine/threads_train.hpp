#pragma once
// One training run of the engine fixture (its Mlp, or a Model with the same interface) on W threads:
// rank 0's result, and whether every rank ended with the same values.
#include <mutex>
#include <utility>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace zt_test {

template <int Stage, class Prec, class Model = Mlp<typename Prec::storage>>
RunResult train(const RunConfig& cfg) {
  RunResult result;
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(cfg.world));
  std::mutex mu;
  zerotk::comm::run_threads(cfg.world, [&](auto& comm) {
    RunResult mine = train_rank<Stage, Prec, zerotk::comm::ThreadsCommunicator, Model>(comm, cfg);
    std::lock_guard lock(mu);
    finals[static_cast<std::size_t>(comm.rank())] = mine.params;
    if (comm.rank() == 0) result = std::move(mine);
  });
  for (const auto& f : finals) result.ranks_agree = result.ranks_agree && f == finals[0];
  return result;
}

}  // namespace zt_test
