#pragma once
/// \file zerotk/engine/group.hpp
/// FlatGroup: one flat buffer family of the engine (the working precision, or the parameters kept in
/// fp32) as its parts: the bucket layout, the stage's gradient path and parameter path, the state
/// store, the optimizer's segments, and the per-micro-step state of each bucket. The group connects
/// the parts; each part is its own file (zero/grads/, zero/params/, offload/).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/engine/norm_share.hpp"
#include "zerotk/engine/optimizer_comm.hpp"
#include "zerotk/engine/options.hpp"
#include "zerotk/engine/registry.hpp"
#include "zerotk/engine/state.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/delayed_update.hpp"
#include "zerotk/offload/pinned_shard.hpp"
#include "zerotk/offload/store.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/zero/concepts.hpp"
#include "zerotk/zero/grads/compressed_all_reduce.hpp"
#include "zerotk/zero/grads/context.hpp"
#include "zerotk/zero/layout.hpp"
#include "zerotk/zero/params/replicated.hpp"

namespace zerotk::engine {

/// The parameters of one flat group, in its local order.
struct GroupMembers {
  GroupKind kind = GroupKind::main;  ///< which of the engine's groups these form
  std::vector<ParamId> ids;
  std::vector<std::size_t> numels;
  std::vector<std::uint32_t> opt_groups;  ///< optimizer parameter group of each
  /// Stage 3: the fetch unit of each (a bucket never spans two), and whether it stays gathered
  /// (persistent parameters get units of their own). Empty below stage 3.
  std::vector<std::uint32_t> units;
  std::vector<char> persistent;
  /// Whether each is split across the tensor group (ParamEntry::tensor_split): the norm counts it on
  /// every tensor rank.
  std::vector<char> split;
};

namespace detail {
/// The stage's parameter path, with stage 3's shards in the home OffloadParams<Tag> selects
/// (offload::shard_home_t checks it against zero::ShardHome).
template <class Part, class T, class Ops, class ParamTag>
struct ParamsOf {
  using type = typename Part::template params<T, Ops, offload::shard_home_t<ParamTag, T, Ops>>;
};
template <class Part, class T, class Ops>
struct ParamsOf<Part, T, Ops, None> {
  using type = typename Part::template params<T, Ops>;
};
/// The stage's gradient path, or with GradientCompression<Tag> the compressed one (stage 0 only:
/// engine/compat.hpp).
template <class Part, class T, class Ops, class CompressTag>
struct GradsOf {
  using type = zero::CompressedAllReduce<T, Ops, CompressTag>;
};
template <class Part, class T, class Ops>
struct GradsOf<Part, T, Ops, None> {
  using type = typename Part::template grads<T, Ops>;
};
/// The selected paths, checked against their concepts (zero/concepts.hpp) where they are chosen.
template <class G>
struct checked_grads {
  static_assert(zero::check_gradient_path_v<G>);
  using type = G;
};
template <class P>
struct checked_params {
  static_assert(zero::check_param_path_v<P>);
  using type = P;
};
}  // namespace detail

/// `OffloadTag` picks the state store (offload/store.hpp), `ParamOffloadTag` where stage 3's
/// parameter shards live (offload/pinned_shard.hpp), `CompressTag` the gradient codec
/// (GradientCompression); none is branched on.
template <class T, class Part, class Opt, class Ops, class OffloadTag = None, class ParamOffloadTag = None,
          class CompressTag = None>
class FlatGroup {
 public:
  using value_type = T;
  using Grads = typename detail::checked_grads<typename detail::GradsOf<Part, T, Ops, CompressTag>::type>::type;
  using Params = typename detail::checked_params<typename detail::ParamsOf<Part, T, Ops, ParamOffloadTag>::type>::type;
  using Store = offload::store_t<OffloadTag, Opt, Ops, T>;
  /// What this rank owns of the group (zero/ownership.hpp): everything, or its blocks.
  using Own = typename Part::ownership;
  /// The optimizer's own communication (optim/onebit_exchange.hpp): 1-bit Adam's momentum exchange.
  using OptComm = typename OptimizerCommOf<Opt, std::remove_pointer_t<decltype(zero::PathContext<Ops>::comm)>>::type;
  /// Stage 2: the reduced-gradient partition is also the all-gather source of the updated values
  /// (a named alias), so a bucket's next reduction waits for its gather.
  static constexpr bool kSharedGatherSource = zero::SharedGatherSource<Grads, Params>;

  /// The optimizer part exchanges the whole model as one flat vector (1-bit LAMB): the engine may
  /// then have only one group (engine/assemble.hpp).
  static constexpr bool kOneFlatVector = OptComm::kOneFlatVector;
  /// The group exchanges compressed state of its own (a 1-bit optimizer, GradientCompression): over
  /// its data group alone (engine.hpp refuses a grid beyond it).
  static constexpr bool kCompressedExchange =
      !std::is_same_v<OptComm, PlainOptimizerComm> || !std::is_base_of_v<zero::Uncompressed, Grads>;

  /// `ctx.layout` is ignored (the group owns its layout); `bucket_numel` is the bucket capacity;
  /// `store` configures the state store (sub_group_size bounds what an offloading store stages at
  /// once; Offload<Nvme>'s swap file).
  FlatGroup(zero::PathContext<Ops> ctx, GroupMembers m, std::size_t bucket_numel, bool overlap_param_gather,
            const offload::StoreOptions& store, const std::vector<ParamGroup>& groups, const OneBitOptions& onebit = {})
      : kind_(m.kind),
        members_(std::move(m.ids)),
        split_(std::move(m.split)),
        layout_(m.numels, m.opt_groups, ctx.world(), bucket_numel, m.units),
        ctx_(with_layout(ctx, &layout_, &local_)),
        grads_(ctx_),
        params_(ctx_, param_options(overlap_param_gather, m.persistent, store)),
        store_(*ctx.ops, ctx.ledger, Own::numel(layout_), groups, m.numels.size(), store),
        opened_(layout_.buckets().size(), 0),
        launched_(layout_.buckets().size(), 0),
        ready_(layout_.buckets().size(), 0) {
    if constexpr (kSharedGatherSource) params_.set_partition_source(grads_.gather_source());
    build_segments();
    opt_comm_.emplace(store_.optimizer(), *ctx_.comm, segments_, ctx_.ledger, &local_, onebit);
  }
  FlatGroup(const FlatGroup&) = delete;
  FlatGroup& operator=(const FlatGroup&) = delete;

  const zero::BucketLayout& layout() const noexcept { return layout_; }
  /// Which of the engine's groups this is (the working precision's, the fp32-kept, the experts').
  GroupKind kind() const noexcept { return kind_; }
  int rank() const { return ctx_.rank(); }
  /// The group's data communicator (the data group's, or the experts' expert-data group's).
  device::OrderedCommunicator<Ops>& comm() noexcept { return *ctx_.comm; }
  ParamId member(std::uint32_t local) const noexcept { return members_[local]; }
  Params& params() noexcept { return params_; }
  const Params& params() const noexcept { return params_; }
  std::size_t pending_publications() const noexcept { return params_.pending(); }
  Grads& grads() noexcept { return grads_; }
  Store& store() noexcept { return store_; }
  const Store& store() const noexcept { return store_; }
  std::span<const kernels::Segment> segments() const noexcept { return segments_; }

  // ---- one micro-step ----------------------------------------------------------------------------

  bool opened(std::size_t k) const noexcept { return opened_[k] != 0; }
  bool launched(std::size_t k) const noexcept { return launched_[k] != 0; }

  /// First touch of bucket k in this micro-step.
  void open(std::size_t k, bool first_micro_step) {
    opened_[k] = 1;
    grads_.open(k, first_micro_step);
  }

  T* bucket_grads(std::size_t k) { return grads_.bucket_grads(k); }

  /// `n` more elements of bucket k have their final gradient; a complete bucket is handed to the
  /// gradient path (which may start reducing it while backward goes on).
  void add_ready(std::size_t k, std::size_t n) {
    ready_[k] += n;
    if (ready_[k] == layout_.buckets()[k].used) launch(k);
  }

  /// Ends the micro-step: buckets nobody touched get zero gradients, every bucket is handed over, the
  /// gradient path reduces what is left and waits.
  void end_micro_step(bool boundary, bool first_micro_step) {
    for (std::size_t k = layout_.buckets().size(); k-- > 0;) {
      if (!opened_[k]) open(k, first_micro_step);
      launch(k);
    }
    grads_.end_micro_step(boundary);
    std::fill(opened_.begin(), opened_.end(), 0);
    std::fill(launched_.begin(), launched_.end(), 0);
    std::fill(ready_.begin(), ready_.end(), 0);
  }

  // ---- the boundary --------------------------------------------------------------------------------

  /// What this rank adds to the global norm (engine/norm_share.hpp): every element it owns, or only
  /// those of parameters split across the tensor group.
  void set_norm_share(const NormShare& share) noexcept { share_ = share; }
  /// Elements of this group that this rank's model shard counts in the norm: the whole flat buffer,
  /// its padding included (a bound is all the norm's grid needs: kernels/host/reduce.hpp), or the
  /// parameters split across the tensor group.
  std::size_t counted_numel() const noexcept {
    if (share_.whole()) return layout_.flat_numel();
    std::size_t n = 0;
    for (std::size_t i = 0; i < split_.size(); ++i) n += share_.counts(split_[i] != 0) ? layout_.param(i).numel : 0;
    return n;
  }

  /// Calls f(std::span<const kernels::TensorRef<const E>>) with this rank's share of the gradients, block
  /// by block (E: the owned gradients' element type). `counted`: only what this rank adds to the norm
  /// (over all ranks of the grid every element once: a tensor rank other than the counting one leaves
  /// out the parameters every tensor rank holds whole); otherwise everything it owns (the overflow check).
  /// While the gradients are local (gradients_local()) a rank's share is its whole flat buffer: the
  /// norm is then this rank's own, as DeepSpeed clips each rank's local gradients in 1-bit Adam's
  /// compressed phase.
  template <class F>
  void with_norm_blocks(F&& f, bool counted = false) const {
    const zero::OwnedGrads<T> owned = grads_.owned();
    const int rank = ctx_.rank();
    const bool only_split = counted && !share_.whole();
    owned.visit([&](const auto* base) {
      using E = std::remove_cv_t<std::remove_pointer_t<decltype(base)>>;
      std::vector<kernels::TensorRef<const E>> blocks;
      blocks.reserve(layout_.buckets().size());
      for (std::size_t k = layout_.buckets().size(); k-- > 0;) {
        const zero::Bucket& b = layout_.buckets()[k];
        if (only_split) {
          add_split_blocks(blocks, base, k, rank, owned.owned_shaped);
        } else if (local_.on) {  // stage 0, owned = the whole flat buffer: all of bucket k
          blocks.emplace_back(base + b.flat_offset, b.numel);
        } else {
          blocks.emplace_back(base + Own::norm_offset(layout_, k, rank, owned.owned_shaped), b.block);
        }
      }
      f(std::span<const kernels::TensorRef<const E>>(blocks));
    });
  }

  /// The optimizer step over this rank's owned elements, then the owned gradients are cleared;
  /// publication (all-gather) is separate: publish(). In two phases, so that the engine's groups
  /// (the working-precision one and the fp32-kept one) take it together or not at all. prepare_update() runs everything that can fail
  /// (a swapped store's and a swapped shard's I/O) and leaves nothing current: Offload<Nvme> holds
  /// the new state in its other slot, Offload<Cpu> and Offload<None> with OffloadParams<Nvme> have
  /// written the values and not yet stepped, the shard holds its new blocks in their other slots. A failure inside it takes this
  /// group back itself. commit_update() makes the step current and does no I/O; abort_update()
  /// takes a prepared group back when a later group's preparation failed. Stores writing memory
  /// (Offload<None> and Offload<Cpu> without a parameter file) step in place in prepare_update():
  /// they do no I/O, and their groups are never the ones that fail.
  void prepare_update(float grad_scale) {
    params_.synchronize();  // a gather still in flight reads the blocks this update writes
    OutputScope scope(params_);  // a failure aborts the shard's transaction
    const auto out = params_.optimizer_out();
    auto reduce = reduce_tensor_sums();
    grads_.owned().visit([&](const auto* g) {
      for (std::size_t i = 0; i < store_.sub_groups(); ++i) store_.step(i, segments_, g, out.base, grad_scale, reduce);
    });
    scope.keep();
    prepared_scale_ = grad_scale;
  }
  void commit_update() {
    // Offload<Nvme>: its other slot becomes current; Offload<Cpu> / <None> after a step through a
    // writer: pass 2; otherwise nothing.
    auto reduce = reduce_tensor_sums();
    const auto out = params_.optimizer_out();
    grads_.owned().visit([&](const auto* g) { store_.commit_step(segments_, g, out.base, prepared_scale_, reduce); });
    params_.commit_update();
    grads_.clear_accumulated();
    opt_comm_->sync(store_.optimizer());
  }
  void abort_update() {
    store_.abort_step(segments_, params_.optimizer_out().base);
    params_.abort_update();
  }

  // ---- the delayed parameter update (offload/delayed_update.hpp) ----------------------------------

  /// Whether the store can step from host memory off the training thread (Offload<Cpu>).
  static constexpr bool kCanDelayUpdate = Store::kCanDelayUpdate;

  /// From now on, update_delayed() runs the optimizer off the training thread (the engine calls it
  /// once, at construction, when the option is set).
  void enable_delayed_update()
    requires kCanDelayUpdate
  {
    delayed_.emplace(ctx_.ledger, store_.owned_numel());
  }
  /// An update started and its values not yet published (or superseded).
  bool update_pending() const noexcept { return delayed_ && delayed_->pending(); }
  /// Its worker may still be running: the store's optimizer must not be touched.
  bool update_running() const noexcept { return delayed_ && delayed_->running(); }

  /// A boundary with the delayed update: the previous boundary's update is waited for, this step's
  /// gradients are taken, the finished update's values are written and published, and (unless
  /// `grad_scale` is empty: a skipped step) this step's update starts on the worker thread.
  template <class OnBucket>
  void update_delayed(std::optional<float> grad_scale, OnBucket&& on_bucket)
    requires kCanDelayUpdate
  {
    const bool finished = delayed_->finish();  // usually already waited for (finish_update)
    if (grad_scale) {  // before the values: at stage 2 they are written over the gradient partition
      grads_.owned().visit([&](const auto* g) {
        using G = std::remove_cv_t<std::remove_pointer_t<decltype(g)>>;
        G* snap = delayed_->template grads<G>();
        for (const kernels::Segment& s : segments_) ctx_.ops->copy_to_host(g + s.grad_at(), snap + s.offset, s.numel);
      });
    }
    if (finished) put_delayed_values(on_bucket);
    grads_.clear_accumulated();
    if (!grad_scale) return;
    grads_.owned().visit([&](const auto* g) {
      using G = std::remove_cv_t<std::remove_pointer_t<decltype(g)>>;
      delayed_->start([this, scale = *grad_scale] {
        const G* grads = delayed_->template grads<G>();
        T* out = delayed_->template out<T>();
        for (std::size_t i = 0; i < store_.sub_groups(); ++i) store_.step_in_host(i, segments_, grads, out, scale);
      });
    });
  }

  /// Waits for the update in flight and publishes its values. A no-op when none is.
  template <class OnBucket>
  void settle(OnBucket&& on_bucket) {
    if (delayed_ && delayed_->finish()) put_delayed_values(on_bucket);
  }
  /// Waits for the update in flight; its values stay pending.
  void finish_update() {
    if (delayed_) delayed_->finish();
  }
  /// Waits for the update in flight, whose values are then superseded (new initial values, a loaded
  /// state): the optimizer's state keeps the step, as after an immediate update.
  void supersede_update() {
    if (delayed_ && delayed_->finish()) delayed_->take();
  }

  /// After the optimizer's state was replaced (Engine::load_state): the rank-local state comes from
  /// `local`, or starts from zero when `local` is empty (DeepSpeed's rule on every load), and the
  /// gradient switch follows the restored step count. `local` has rank_local_size() or is empty
  /// (checked before: Engine::load_state).
  void after_state_loaded(const RankLocalState& local) {
    grads_.reset();
    opt_comm_->reset();
    if (!local.empty()) {
      RankLocalReader in(local);
      grads_.load_error_feedback(in.values(grads_.error_feedback().size()));
      opt_comm_->load_rank_local(in);
    }
    opt_comm_->sync(store_.optimizer());
  }

  /// What this rank alone carries from step to step (engine/state.hpp): the gradient path's error
  /// feedback (GradientCompression; none for the others), then the optimizer part's share
  /// (optimizer_comm.hpp).
  RankLocalSize rank_local_size() const {
    RankLocalSize n;
    n.values += grads_.error_feedback().size();
    n += opt_comm_->rank_local_size();
    return n;
  }
  RankLocalState rank_local() const {
    RankLocalState out;
    const RankLocalSize n = rank_local_size();
    out.values.reserve(n.values);
    out.scalars.reserve(n.scalars);
    const std::span<const float> e = grads_.error_feedback();
    out.values.insert(out.values.end(), e.begin(), e.end());
    opt_comm_->save_rank_local(out);
    return out;
  }

  /// Whether the next step's gradients stay on their rank (1-bit Adam's compressed phase).
  bool gradients_local() const noexcept { return local_.on; }
  /// Bytes of dense gradient all-reduces that were replaced (skipped while the gradients were local,
  /// or compressed), and what was sent instead (the optimizer's own exchanges, the compressed
  /// gradient frames); both since construction.
  std::uint64_t replaced_dense_bytes() const noexcept { return local_.skipped_wire_bytes + grads_.dense_bytes(); }
  std::uint64_t replacement_wire_bytes() const noexcept { return opt_comm_->wire_bytes() + grads_.wire_bytes(); }

  /// A skipped update: the accumulated (non-finite) gradients are dropped.
  void skip() { grads_.clear_accumulated(); }

  /// Makes the updated values every rank's; `on_bucket(k)` runs once bucket k's values are in place.
  template <class OnBucket>
  void publish(OnBucket&& on_bucket) {
    params_.publish(std::forward<OnBucket>(on_bucket));
  }

  /// fp32 master := this rank's owned parameter values.
  void init_master() {
    Own::for_each_block(layout_, [&](std::size_t k, std::size_t at, std::size_t n) {
      params_.read_owned(k, [&](const T* owned) { store_.master_from(owned, at, n); });
    });
  }

  /// This rank's owned parameters := T(master), then published (a restored state).
  template <class OnBucket>
  void restore_params_from_master(OnBucket&& on_bucket) {
    params_.synchronize();
    OutputScope scope(params_);
    const auto out = params_.optimizer_out();
    std::vector<T> host;
    for (const kernels::Segment& s : segments_) {
      if constexpr (zero::OutputWriter<std::remove_pointer_t<decltype(out.base)>>) {  // through host memory
        host.resize(s.numel);
        store_.master_into_host(s.offset, host.data(), s.numel);
        out.base->write(s.out_at(), host.data(), s.numel);
      } else {
        store_.master_into(s.offset, out.base + s.out_at(), s.numel);
      }
    }
    scope.commit();
    publish(std::forward<OnBucket>(on_bucket));
  }

  void drain_quietly() noexcept {
    grads_.drain_quietly();
    params_.drain_quietly();
  }

 private:
  /// The optimizer's reduction of per-tensor sums (LAMB's norms) over the ranks that share a tensor.
  auto reduce_tensor_sums() {
    return [this](double* sums, std::size_t n) { Own::reduce_tensor_sums(*ctx_.comm, sums, n); };
  }

  /// The optimizer's output into the parameter path, committed (a swapped shard's blocks become
  /// current) or, when the scope is left by an exception, abandoned (they stay as they were).
  class OutputScope {
   public:
    explicit OutputScope(Params& p) noexcept : p_(&p) {}
    OutputScope(const OutputScope&) = delete;
    OutputScope& operator=(const OutputScope&) = delete;
    ~OutputScope() {
      if (p_ != nullptr) p_->abort_update();
    }
    void commit() {
      p_->commit_update();
      p_ = nullptr;
    }
    /// Leaves the transaction open for commit_update() or abort_update().
    void keep() noexcept { p_ = nullptr; }

   private:
    Params* p_;
  };

  /// The finished delayed update's values into the parameter path, then published.
  template <class OnBucket>
  void put_delayed_values(OnBucket& on_bucket) {
    params_.synchronize();
    OutputScope scope(params_);
    const auto out = params_.optimizer_out();
    const T* values = delayed_->template out<T>();
    for (const kernels::Segment& s : segments_) zero::put_out(*ctx_.ops, out.base, s.out_at(), values + s.offset, s.numel);
    zero::end_sub_group(out.base);
    scope.commit();
    delayed_->take();
    opt_comm_->sync(store_.optimizer());
    publish(on_bucket);
  }

  static zero::PathContext<Ops> with_layout(zero::PathContext<Ops> c, const zero::BucketLayout* l,
                                           zero::LocalGradients* local) {
    c.layout = l;
    c.local_gradients = local;
    return c;
  }
  typename Params::Options param_options(bool overlap_param_gather, const std::vector<char>& persistent,
                                         const offload::StoreOptions& store) const {
    typename Params::Options o;
    o.overlap_param_gather = overlap_param_gather;
    o.home = offload::home_options<typename Params::Options::home_options>(store);
    if (!persistent.empty()) {
      for (const zero::Bucket& b : layout_.buckets()) o.persistent.push_back(persistent[b.params.front()]);
    }
    return o;
  }

  /// The optimizer's pieces: owned-shaped offsets (master, m, v), and where its gradients are read
  /// and its 16-bit output written when those live in the flat buffer instead (stage 1, in place).
  void build_segments() {
    segments_ = Own::segments(layout_, ctx_.rank(),
                              {!grads_.owned().owned_shaped, !params_.optimizer_out().owned_shaped});
  }

  void launch(std::size_t k) {
    if (launched_[k]) return;
    launched_[k] = 1;
    if constexpr (kSharedGatherSource) params_.wait(k);  // the named alias: reduction output = gather source
    grads_.ready(k);
  }

  // The pieces of split parameters in what this rank owns of bucket k (with_norm_blocks' share).
  template <class E>
  void add_split_blocks(std::vector<kernels::TensorRef<const E>>& blocks, const E* base, std::size_t k, int rank,
                        bool owned_shaped) const {
    const zero::Bucket& b = layout_.buckets()[k];
    if (local_.on) {
      for (std::uint32_t i : b.params) {
        if (share_.counts(split_[i] != 0)) blocks.emplace_back(base + layout_.param(i).flat_offset, layout_.param(i).numel);
      }
      return;
    }
    const std::size_t start = Own::norm_offset(layout_, k, rank, owned_shaped), lo = layout_.block_flat_offset(k, rank);
    for (const zero::PartitionSegment& s : layout_.block_segments(k, rank, false)) {
      if (share_.counts(split_[s.tensor] != 0)) blocks.emplace_back(base + start + (s.offset - lo), s.numel);
    }
  }

  GroupKind kind_;
  std::vector<ParamId> members_;
  std::vector<char> split_;          // per local parameter: split across the tensor group (share_ reads it)
  NormShare share_;                  // what this rank adds to the global norm
  zero::BucketLayout layout_;
  zero::LocalGradients local_;  // the paths' switch of the gradient reduction (1-bit Adam)
  zero::PathContext<Ops> ctx_;
  Grads grads_;
  Params params_;
  Store store_;
  std::vector<kernels::Segment> segments_;
  float prepared_scale_ = 1.0f;      // prepare_update()'s gradient scale, for commit_update()
  std::optional<OptComm> opt_comm_;  // made once the segments are known
  // the delayed parameter update; last, so its worker is joined before anything it uses goes
  std::optional<offload::DelayedUpdate> delayed_;
  // per bucket, this micro-step
  std::vector<char> opened_, launched_;
  std::vector<std::size_t> ready_;
};

}  // namespace zerotk::engine
