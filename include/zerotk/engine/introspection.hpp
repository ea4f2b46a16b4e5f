#pragma once
/// \file zerotk/engine/introspection.hpp
/// What an engine tells about itself besides training: its memory ledger, byte counters, place in
/// the grid, counters, options and layout, the shard table, and what its offload parts report.
/// Engine<Policies...> derives from Introspection<Engine> (CRTP), which reads the engine's parts
/// as its friend, so engine.hpp keeps to wiring.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/engine/comms.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/io/swap_file.hpp"

namespace zerotk::engine {

template <class E>
class Introspection {
 public:
  /// Where every parameter's master and optimizer state live on every rank of the data group
  /// (engine/shards.hpp): the same on every rank of it, computed from the layouts without
  /// communication. On a grid, a split parameter's entry says which tensor rank's shard it is.
  ShardTable shard_table() const;

  const MemoryLedger& memory() const noexcept { return e().ledger_; }
  /// The ledger, to record memory the trainer owns (its activations: activation::Meter).
  MemoryLedger& memory() noexcept { return m().ledger_; }
  /// The byte counters of the data group's communicator.
  const comm::CommStats& comm_stats() const { return e().comms_.data().stats(); }
  /// Stage 3 with hpZ (`Stage3Options::reshard_after_forward` = group(g), g > 1): the byte counters
  /// of this rank's group communicator, which carries the backward's gathers; null without hpZ.
  const comm::CommStats* group_comm_stats() const { return e().comms_.hpz() ? &e().comms_.hpz()->stats() : nullptr; }
  /// The data group's topology (`communication.topology`; flat by default).
  const comm::Topology& topology() const noexcept { return e().comms_.topology(); }
  /// What the data group's hierarchical collectives sent per link level since construction (ring
  /// convention, docs/comm.md); null when the topology is flat.
  const comm::LinkStats* link_stats() const noexcept { return e().comms_.link_stats(); }
  /// This rank's part of the data group's next micro-batch (monitor/slow_ranks.hpp): which samples
  /// to process and the weight of each sample's loss. Equal parts unless the slow-rank detector
  /// rebalanced (communication.slow_node_action "rebalance"); needs
  /// `communication.slow_ranks.micro_batch_size` (else samples 0, weight 1: keep your own batch).
  BatchShare batch_share() const { return e().slow_.share(); }
  /// ZeRO++ qwZ / qgZ: what the quantized gathers and reduce-scatters sent, per link level of the
  /// data group's topology (qgZ) or in all (qwZ: its gathers also show in comm_stats() and, on a
  /// topology, link_stats()); null when off.
  const compress::QuantizedStats* quantized_weights_stats() const noexcept { return e().comms_.quantized_weights_stats(); }
  const compress::QuantizedStats* quantized_gradients_stats() const noexcept { return e().comms_.quantized_grads_stats(); }
  /// Where this rank sits in the process grid (a plain communicator: one data group).
  const GridPlace& grid_place() const noexcept { return e().comms_.place(); }
  /// OffloadParams<Nvme>: fetches whose block was read ahead, fetches that read it themselves and
  /// fetches served from the blocks kept in host memory (max_in_cpu), over both groups since
  /// construction (a high second count asks for a larger `offload_param.buffer_count`;
  /// docs/offload.md).
  auto param_read_stats() const
    requires requires(const typename E::Home& p) { p.home().stats(); }
  {
    std::remove_cvref_t<decltype(std::declval<const typename E::Home&>().home().stats())> s{};
    e().groups_.each([&](const auto& g) { s += g.params().home().stats(); });
    return s;
  }
  /// OffloadParams<Nvme>: host bytes of the shard's blocks kept in memory instead of the file
  /// (max_in_cpu; two copies of each). Also in memory()'s pinned host params16.
  std::size_t param_bytes_in_cpu() const
    requires requires(const typename E::Home& p) { p.home().held_bytes(); }
  {
    std::size_t n = 0;
    e().groups_.each([&](const auto& g) { n += g.params().home().held_bytes(); });
    return n;
  }
  /// Every rank the boundary's reductions span (the process grid's world, or the plain
  /// communicator), type-erased and unfenced: for a trainer's own small collectives that must reach
  /// all of them, e.g. agreeing on a failure before step() (interop/torch.hpp). Collectives on it
  /// are ordered with the engine's by call order, on every rank alike. Host memory on Device<Host>.
  comm::AnyCommunicator& step_communicator() noexcept { return m().comms_.norm().unordered(); }
  /// This rank's rank and size in the data group (a plain communicator's own).
  int rank() const { return e().comms_.data().rank(); }
  int world_size() const { return e().comms_.data().size(); }
  std::int64_t global_steps() const noexcept { return e().counters_.global_steps; }
  std::int64_t skipped_steps() const noexcept { return e().counters_.skipped_steps; }
  const auto& scaler() const noexcept { return e().scaler_; }
  auto& scaler() noexcept { return m().scaler_; }
  const EngineOptions& options() const noexcept { return e().options_; }
  /// Parameter all-gathers (buckets) still in flight; non-zero only with overlap_param_gather.
  std::size_t pending_gathers() const noexcept { return e().groups_.pending_publications(); }
  /// Total parameter elements of the model (Psi), padding excluded.
  std::size_t parameter_count() const noexcept { return e().registry_.parameter_count(); }
  /// The element type the engine keeps each parameter in, in the model's visiting order: the
  /// training precision's storage type, or fp32 for parameters kept in fp32 (a float Param over
  /// 16-bit storage reports the 16-bit type).
  std::vector<DType> stored_dtypes() const {
    std::vector<DType> out;
    for (const ParamEntry& p : e().registry_.entries()) {
      out.push_back(p.group == GroupKind::fp32 ? DType::fp32 : dtype_of_v<typename E::storage_type>);
    }
    return out;
  }
  /// Padded element counts of the flat buffers (main precision, the fp32-kept group, the experts').
  std::size_t flat_numel() const noexcept { return e().groups_.flat_numel(); }
  std::size_t bucket_count() const noexcept { return e().groups_.bucket_count(); }
  /// Learning rate of parameter group `g` for the next update.
  double lr(std::size_t g = 0) const { return e().schedule_.lr(g); }
  /// The fp32 master copy this rank owns (stage 0: everything, flat layout; 1/2: its partition), of
  /// the working-precision group. Host memory only.
  std::span<const float> master() const noexcept
    requires E::ops_type::Space::host_accessible && E::kStateInHostMemory
  {
    const auto* g = e().groups_.main();
    return g ? std::span<const float>(g->store().master(), g->store().owned_numel()) : std::span<const float>();
  }
  /// Offload<Nvme>: how each group's swap file is read and written (its path, O_DIRECT or buffered,
  /// io_uring or the pread/pwrite pool), the working-precision group first.
  std::vector<io::SwapFileInfo> swap_files() const
    requires requires(const typename E::Store& st) { st.swap_file().info(); }
  {
    std::vector<io::SwapFileInfo> out;
    e().groups_.each([&](const auto& g) { out.push_back(g.store().swap_file().info()); });
    return out;
  }


 private:
  const E& e() const noexcept { return static_cast<const E&>(*this); }
  E& m() noexcept { return static_cast<E&>(*this); }
};

// Out of class, so that `extern template class Introspection<BasicEngine<...>>;` (zerotk/engines.hpp)
// keeps it out of a trainer's translation unit.
template <class E>
ShardTable Introspection<E>::shard_table() const {
  const GridPlace& place = e().comms_.place();
  return make_shard_table(e().groups_, e().registry_, world_size(), place.tensor_index, place.tensor_size);
}

}  // namespace zerotk::engine
