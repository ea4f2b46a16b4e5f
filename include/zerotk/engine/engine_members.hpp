#pragma once
/// \file zerotk/engine/engine_members.hpp
/// The members of BasicEngine (what `Engine<Policies...>` names) that carry the weight (construction,
/// the scopes, step and the set-up helpers), defined out of class so that an explicit instantiation
/// declaration (`extern template class zerotk::BasicEngine<...>;`, zerotk/engines.hpp) keeps a trainer's translation
/// unit from instantiating them: the compiled engine set instantiates them once. The members left
/// in the class are one-line forwards from the user's types to these (engine/model_view.hpp).
/// Included by zerotk/engine.hpp after the class; not a header of its own.

#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <utility>

namespace zerotk {

template <class Pack>
BasicEngine<Pack>::BasicEngine(engine::EngineInputs<ops_type> in, EngineOptions options)
    : options_(engine::checked_options(std::move(options), facts())),
      ops_(in.make_ops(in.comm, options_.stream)),
      comms_(in.place(in.comm, options_.communication.topology), ops_, options_.communication.topology),
      scaler_(options_.loss_scaler),
      registry_(std::move(in.model), registry_rules()),
      schedule_(options_.groups) {
  build();
}

template <class Pack>
void BasicEngine<Pack>::build() {
  comms_.set_expert_params(registry_.has_experts());
  const engine::GridPlace& place = comms_.place();
  engine::check_on_place(options_, facts(), place);  // the checker's rows that read the place (engine/checks.hpp)
  engine::NormShare::check_splits(comms_.norm(), registry_, place);
  comms_.make_hpz(Fetch::hpz_group_size(options_.stage3));
  comms_.make_quantized(options_.stage3.quantized_weights, options_.stage3.quantized_gradients);
  groups_ = engine::assemble_groups<MainGroup, Fp32Group, Fetch>(
      options_, registry_, ops_, comms_, ledger_, options_.bucket_numel(bucketer::bytes, sizeof(S)), facts().shard_file);
  groups_.each([&](auto& g) { g.set_norm_share(comms_.norm_share()); });
  bindings_.emplace(registry_, groups_, ops_, &ledger_);
  bindings_->adopt_and_bind(options_.adopt_initial_values);
  groups_.init_master();
  if constexpr (MainGroup::kCanDelayUpdate) {
    if (options_.delayed_param_update) groups_.each([](auto& g) { g.enable_delayed_update(); });
  }
  fetch_.emplace(FetchCtx{&*bindings_, &registry_, &groups_, &comms_.data(), options_.stage3});
  sparse_.build(groups_, registry_, options_.sparsity, &ledger_, [this](double* v, std::size_t n) {
    comms_.norm().all_reduce_host(v, v, n, comm::ReduceOp::max);  // every rank of the grid
  });
  boundary_.emplace(groups_, scaler_, comms_, ops_, schedule_, sparse_,
                    engine::BoundarySettings{options_.gradient_accumulation_steps, options_.gradient_clipping,
                                             options_.delayed_param_update, options_.delayed_param_update_start},
                    comms_.agree_norm_count(groups_.counted_numel(false), groups_.counted_numel(true)));
  slow_ = engine::SlowRankMonitor<Comm>(options_.communication.slow_ranks, comms_.norm(), place);
}

template <class Pack>
void BasicEngine<Pack>::refuse_experts_apart(const char* where, int root) const {
  if (!groups_.expert() || !comms_.experts_apart()) return;
  throw usage_error("rank root's values cannot become every rank's when expert parameters live on an expert-data group "
                    "apart from the data group (each expert rank holds other experts): write the values inside "
                    "gather(module, 0) (data rank 0's dense values and each expert group's first expert-data rank's "
                    "expert values are kept), or initialise every rank alike before the engine adopts them",
                    where, std::to_string(root));
}

template <class Pack>
BasicEngine<Pack>::~BasicEngine() {
  groups_.drain_quietly();
}

template <class Pack>
engine::ModuleId BasicEngine<Pack>::open_forward(const engine::LayerRef& layer, detail::Clock::time_point& t0) {
  const auto busy = slow_.busy(engine::ComputePhase::forward);
  t0 = detail::Clock::now();  // waiting for parameters counts as forward time
  const engine::ModuleId id = registry_.module(layer);
  fetch_->before(registry_.module_entry(id), engine::Phase::forward);
  return id;
}

template <class Pack>
engine::ModuleId BasicEngine<Pack>::open_gather(const engine::LayerRef& module, std::optional<int> modifier_rank) {
  if (modifier_rank && (*modifier_rank < 0 || *modifier_rank >= this->world_size())) {
    throw usage_error("modifier_rank must be a rank of the communicator", "Engine::gather",
                      std::to_string(*modifier_rank) + " of " + std::to_string(this->world_size()));
  }
  require_boundary("gather");
  // Experts apart: data rank 0 is the first expert-data rank of its expert group, and every expert
  // group keeps its first rank's writes; another root has no such counterpart.
  if (modifier_rank && *modifier_rank != 0) refuse_experts_apart("Engine::gather(module, modifier_rank)", *modifier_rank);
  synchronize();
  const engine::ModuleId id = registry_.module(module);
  fetch_->hold(registry_.module_entry(id));
  return id;
}

template <class Pack>
void BasicEngine<Pack>::synchronize() {
  groups_.synchronize();
}

template <class Pack>
engine::ModuleId BasicEngine<Pack>::open_backward(const engine::LayerRef& layer) {
  const auto busy = slow_.busy(engine::ComputePhase::backward);
  const engine::ModuleId id = registry_.module(layer);
  const engine::ModuleEntry& m = registry_.module_entry(id);
  fetch_->before(m, engine::Phase::backward);
  bindings_->begin_backward(m.own, counters_.micro_in_accum == 0);
  bindings_->begin_backward(m.external, counters_.micro_in_accum == 0);
  return id;
}

template <class Pack>
StepReport BasicEngine<Pack>::step(double loss) {
  const auto busy = slow_.busy(engine::ComputePhase::other);
  engine::StepCounters& c = counters_;
  bindings_->check_every_parameter_had_backward(c.micro_steps + 1);
  const bool first = c.micro_in_accum == 0;
  const bool boundary = c.micro_in_accum + 1 == options_.gradient_accumulation_steps;
  const auto t0 = detail::Clock::now();
  try {
    fetch_->end_micro_step(c.micro_steps + 1);
    groups_.end_micro_step(boundary, first);
  } catch (const comm_error& e) {
    fetch_->rethrow_with_order(e);
  }
  c.loss_sum += loss;
  ++c.micro_in_accum;
  ++c.micro_steps;
  slow_.end_micro_step();
  bindings_->end_micro_step();
  timings_.backward_allreduce_ms += detail::ms_since(t0);

  StepReport r;
  r.micro_steps = c.micro_steps;
  const engine::GridPlace& place = comms_.place();
  r.groups = {place.data_size, place.tensor_size, place.pipeline_size};
  if (boundary) {
    const auto ts = detail::Clock::now();
    try {
      boundary_->run(c, r, [this](auto& g, std::size_t k) { bindings_->on_bucket_published(g, k); });
    } catch (...) {  // an abandoned update (the boundary put the state back): the next step starts afresh
      c.end_accumulation();
      throw;
    }
    timings_.step_ms += detail::ms_since(ts);
    r.timings = std::exchange(timings_, StepTimings{});
    r.timings_measured = true;
    traffic_.report(r, comms_.wire_bytes() + slow_.wire_bytes(), groups_.saved_wire_bytes());
    c.end_accumulation();
    slow_.at_boundary(r, c.global_steps);  // abort: slow_rank_error here, on every rank
  }
  r.global_steps = c.global_steps;
  r.skipped_steps = c.skipped_steps;
  r.loss_scale = scaler_.scale();
  fetch_->ready_next();
  return r;
}

template <class Pack>
void BasicEngine<Pack>::broadcast_parameters(int root) {
  refuse_experts_apart("Engine::broadcast_parameters", root);
  synchronize();
  groups_.supersede_update();
  bindings_->take_user_values();
  bindings_->broadcast(comms_.data(), root);
}

template <class Pack>
void BasicEngine<Pack>::initialize_master() {
  synchronize();
  groups_.supersede_update();
  bindings_->take_user_values();
  groups_.init_master();
}

template <class Pack>
void BasicEngine<Pack>::settle() {
  require_boundary("settle");
  groups_.each([this](auto& g) { g.settle([this, &g](std::size_t k) { bindings_->on_bucket_published(g, k); }); });
}

template <class Pack>
void BasicEngine<Pack>::set_scheduler(LrScheduler scheduler) {
  schedule_.set(std::move(scheduler));
  schedule_.apply(groups_);
}

template <class Pack>
void BasicEngine<Pack>::end_forward(engine::ModuleId id, detail::Clock::time_point t0) {
  const auto busy = slow_.busy(engine::ComputePhase::other);
  close_scope(id, engine::Phase::forward);
  timings_.forward_ms += detail::ms_since(t0);
}

template <class Pack>
void BasicEngine<Pack>::end_backward(engine::ModuleId id, detail::Clock::time_point t0) {
  const auto busy = slow_.busy(engine::ComputePhase::other);
  timings_.backward_inner_ms += detail::ms_since(t0);
  if (std::uncaught_exceptions() == 0) bindings_->end_backward(registry_.module_entry(id).own);
  close_scope(id, engine::Phase::backward);
  timings_.backward_ms += detail::ms_since(t0);
}

template <class Pack>
void BasicEngine<Pack>::end_gather(engine::ModuleId id, std::optional<int> modifier_rank) {
  const engine::ModuleEntry& m = registry_.module_entry(id);
  if (std::uncaught_exceptions() > 0) {
    try {
      fetch_->unhold(m);
    } catch (...) {
    }
    return;
  }
  if (modifier_rank) {
    bindings_->keep_writes(m, comms_.data(), *modifier_rank, comms_.expert_data(), comms_.experts_apart() ? 0 : *modifier_rank);
  }
  fetch_->unhold(m);
}

}  // namespace zerotk
