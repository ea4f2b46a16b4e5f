// A type that lacks step() is not a TrainingEngine: check_training_engine_v names the member in its
// first error line (engine/api.hpp). The control gives it step().
#include "zerotk/engine/api.hpp"

namespace concept_training_engine {

/// Everything of the engine's face but step() (unless the control adds it).
struct AlmostEngine {
  struct Scope {};
  Scope forward(const zerotk::engine::LayerRef&) { return {}; }
  Scope backward(const zerotk::engine::LayerRef&) { return {}; }
  Scope gather(const zerotk::engine::LayerRef&) { return {}; }
  double loss_scale() const { return 1.0; }
#ifdef ZEROTK_FAILTEST_CONTROL
  zerotk::StepReport step(double) { return {}; }
#endif
  void synchronize() {}
  void settle() {}
  bool at_boundary() const { return true; }
  int stage() const { return 2; }
  zerotk::DType storage_dtype() const { return zerotk::DType::bf16; }
  std::string_view optimizer_name() const { return "AdamW"; }
  int rank() const { return 0; }
  int world_size() const { return 1; }
  const zerotk::engine::GridPlace& grid_place() const { return place_; }
  const zerotk::EngineOptions& options() const { return options_; }
  const zerotk::MemoryLedger& memory() const { return ledger_; }
  zerotk::EngineState state() const { return {}; }
  zerotk::EngineState scalar_state() const { return {}; }
  void load_state(const zerotk::EngineState&) {}
  zerotk::engine::ShardTable shard_table() const { return {}; }
  std::size_t parameter_count() const { return 0; }
  std::size_t flat_numel() const { return 0; }
  std::vector<zerotk::DType> stored_dtypes() const { return {}; }
  std::int64_t global_steps() const { return 0; }

  zerotk::engine::GridPlace place_;
  zerotk::EngineOptions options_;
  zerotk::MemoryLedger ledger_;
};

static_assert(zerotk::check_training_engine_v<AlmostEngine>);

}  // namespace concept_training_engine
