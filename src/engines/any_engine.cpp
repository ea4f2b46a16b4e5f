// src/engines/any_engine.cpp: AnyEngine's members (zerotk/any_engine.hpp), compiled once in
// zerotk::engines so that a trainer over AnyEngine compiles only their declarations: each forwards to
// the erased engine (zerotk/erased_engine.hpp).
#include "zerotk/erased_engine.hpp"

namespace zerotk {

AnyEngine::AnyEngine(std::unique_ptr<engine::ErasedEngine> impl) : impl_(std::move(impl)) {
  if (!impl_) throw usage_error("AnyEngine needs an engine", "AnyEngine");
}
AnyEngine::AnyEngine(AnyEngine&&) noexcept = default;
AnyEngine& AnyEngine::operator=(AnyEngine&&) noexcept = default;
AnyEngine::~AnyEngine() = default;

AnyEngine::ModuleId AnyEngine::open_forward(const engine::LayerRef& layer, TimePoint& t0) { return impl_->open_forward(layer, t0); }
AnyEngine::ModuleId AnyEngine::open_backward(const engine::LayerRef& layer) { return impl_->open_backward(layer); }
AnyEngine::ModuleId AnyEngine::open_gather(const engine::LayerRef& module, std::optional<int> modifier_rank) {
  return impl_->open_gather(module, modifier_rank);
}
void AnyEngine::end_forward(ModuleId id, TimePoint t0) { impl_->end_forward(id, t0); }
void AnyEngine::end_backward(ModuleId id, TimePoint t0) { impl_->end_backward(id, t0); }
void AnyEngine::end_gather(ModuleId id, std::optional<int> modifier_rank) { impl_->end_gather(id, modifier_rank); }

double AnyEngine::loss_scale() const { return impl_->loss_scale(); }
StepReport AnyEngine::step(double loss) { return impl_->step(loss); }
void AnyEngine::synchronize() { impl_->synchronize(); }
void AnyEngine::settle() { impl_->settle(); }
bool AnyEngine::at_boundary() const { return impl_->at_boundary(); }
void AnyEngine::broadcast_parameters(int root) { impl_->broadcast_parameters(root); }
void AnyEngine::initialize_master() { impl_->initialize_master(); }
void AnyEngine::set_scheduler(LrScheduler scheduler) { impl_->set_scheduler(std::move(scheduler)); }

int AnyEngine::stage() const { return impl_->stage(); }
DType AnyEngine::storage_dtype() const { return impl_->storage_dtype(); }
std::string_view AnyEngine::optimizer_name() const { return impl_->optimizer_name(); }
std::string AnyEngine::description() const { return impl_->description(); }
int AnyEngine::rank() const { return impl_->rank(); }
int AnyEngine::world_size() const { return impl_->world_size(); }
const engine::GridPlace& AnyEngine::grid_place() const { return impl_->grid_place(); }
const EngineOptions& AnyEngine::options() const { return impl_->options(); }
const MemoryLedger& AnyEngine::memory() const { return impl_->memory(); }
MemoryLedger& AnyEngine::memory() { return impl_->memory(); }
const comm::CommStats& AnyEngine::comm_stats() const { return impl_->comm_stats(); }
comm::AnyCommunicator& AnyEngine::step_communicator() { return impl_->step_communicator(); }
BatchShare AnyEngine::batch_share() const { return impl_->batch_share(); }
double AnyEngine::lr(std::size_t group) const { return impl_->lr(group); }
std::int64_t AnyEngine::global_steps() const { return impl_->global_steps(); }
std::int64_t AnyEngine::skipped_steps() const { return impl_->skipped_steps(); }
std::size_t AnyEngine::pending_gathers() const { return impl_->pending_gathers(); }
std::size_t AnyEngine::parameter_count() const { return impl_->parameter_count(); }
std::size_t AnyEngine::flat_numel() const { return impl_->flat_numel(); }
std::size_t AnyEngine::bucket_count() const { return impl_->bucket_count(); }
std::vector<DType> AnyEngine::stored_dtypes() const { return impl_->stored_dtypes(); }
const comm::Topology& AnyEngine::topology() const { return impl_->topology(); }
const comm::LinkStats* AnyEngine::link_stats() const { return impl_->link_stats(); }
const comm::CommStats* AnyEngine::group_comm_stats() const { return impl_->group_comm_stats(); }
const compress::QuantizedStats* AnyEngine::quantized_weights_stats() const { return impl_->quantized_weights_stats(); }
const compress::QuantizedStats* AnyEngine::quantized_gradients_stats() const { return impl_->quantized_gradients_stats(); }
std::size_t AnyEngine::param_bytes_in_cpu() const { return impl_->param_bytes_in_cpu(); }

EngineState AnyEngine::state() const { return impl_->state(); }
EngineState AnyEngine::scalar_state() const { return impl_->scalar_state(); }
bool AnyEngine::views_state() const { return impl_->views_state(); }
std::vector<EngineGroupView> AnyEngine::state_views() const { return impl_->state_views(); }
void AnyEngine::load_state(const EngineState& s) { impl_->load_state(s); }
engine::ShardTable AnyEngine::shard_table() const { return impl_->shard_table(); }

}  // namespace zerotk
