// examples/02_gpt/sparse_engine.cpp: the example's sparse engines (sparse_engine.hpp), compiled here
// once, apart from the trainer, since the compiled set does not hold them.
#include "sparse_engine.hpp"

#include <string>
#include <type_traits>
#include <utility>

#include "zerotk/core/error.hpp"
#include "zerotk/engine_config.hpp"
#include "zerotk/policies.hpp"

namespace gpt_demo {
namespace {

template <int S>
using Sparse = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::AdamW>,
                              zerotk::Precision<zerotk::bf16>, zerotk::Sparsity<zerotk::NofM<2, 4>>>;

/// f(std::type_identity<E>) for the engine E `cfg` asks for; a usage_error when the example has none.
/// Two engine types (each about 30 s of compile at -O3): the demo's bf16 at stages 2 and 3.
template <class F>
decltype(auto) with_sparse_engine(const zerotk::config::Config& cfg, F&& f) {
  const int stage = cfg.zero_optimization.stage;
  const zerotk::DType precision = cfg.precision();
  const bool offload = cfg.zero_optimization.offload_optimizer.device != zerotk::config::OffloadDevice::none ||
                       cfg.zero_optimization.offload_param.device != zerotk::config::OffloadDevice::none;
  if (!offload && (stage == 2 || stage == 3) && precision == zerotk::DType::bf16) {
    if (stage == 2) return f(std::type_identity<Sparse<2>>{});
    return f(std::type_identity<Sparse<3>>{});
  }
  throw zerotk::usage_error("the example compiles sparse engines for AdamW in bf16 at ZeRO stages 2 and 3 without "
                            "offload (examples/02_gpt/sparse_engine.cpp; add the type you need there)",
                            "--sparsity 2:4",
                            "stage " + std::to_string(stage) + ", " + std::string(zerotk::to_string(precision)) +
                                (offload ? ", offload" : ""));
}

}  // namespace

std::string sparse_engine_for(const zerotk::config::Config& cfg) {
  return with_sparse_engine(cfg, []<class E>(std::type_identity<E>) { return zerotk::config::describe<E>(); });
}

zerotk::AnyEngine make_sparse_engine(const zerotk::config::Config& cfg, zerotk::engine::ErasedInputs inputs,
                                     const zerotk::EngineOptionsEdit& edit) {
  return with_sparse_engine(cfg, [&]<class E>(std::type_identity<E>) {
    return zerotk::make_engine_of<E>(cfg, std::move(inputs), edit);
  });
}

}  // namespace gpt_demo
