#pragma once
/// \file zerotk/offload/writer_passes.hpp
/// WriterPasses: the two-pass step of a store whose state sits in host memory and is stepped in
/// place (offload/host_pinned.hpp; offload/resident.hpp on a host compute space), when the new
/// working-precision values go through a writer (OffloadParams<Nvme>: `out` is a
/// zero::OutputWriter that writes the shard file, zero/params/optimizer_out.hpp).
///
/// A write can fail, and a failed step must change nothing. Stepping the state in place while the
/// values go out would leave it stepped when a later write fails, so:
///
///   pass 1 (prepare, sub-group i = 0 .. n-1)   copy i's master, m and v into a scratch, a part of
///                                              at most kWriterPassChunk elements at a time; step
///                                              the copy; its values go through the writer (one
///                                              writer sub-group per sub-group). The state is
///                                              untouched; a failure rewinds the step count and
///                                              rethrows (the writer's owner aborts its transaction).
///   pass 2 (commit, once every group is ready) step the state in place with the same constants
///                                              and gradients and no output: no I/O, the same bits.
///   abort (another group failed)               the step count goes back; nothing else changed.
///
/// The price is the step's compute twice and 3 x min(owned, sub_group_size, kWriterPassChunk) fp32
/// of scratch (pinned host memory, ledger category `other`; 3 MiB at most). Sub-group by sub-group
/// and part by part gives the bits of one fused step only for elementwise optimizers (Adam, AdamW);
/// engine/compat.hpp refuses LAMB here.

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>

#include "zerotk/core/error.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/core/pinned_host_space.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/options.hpp"
#include "zerotk/offload/sub_group_steps.hpp"

namespace zerotk::offload {

class WriterPasses {
 public:
  /// `enabled`: the store was built for a writer (StoreOptions::output_writer); else no scratch.
  WriterPasses(bool enabled, std::size_t owned_numel, std::size_t sub_group_numel, MemoryLedger* ledger)
      : scratch_(enabled ? 3 * std::min({owned_numel, sub_group_numel, kWriterPassChunk}) : 0, MemoryCategory::other,
                 ledger),
        enabled_(enabled) {}

  /// Pass 1 over sub-group i of `steps` (null: the store has no sub-group loop): `master`, `m`, `v`
  /// point at the state's first element, which is only read. `where` names the store in the error
  /// of one built without scratch.
  template <class Ops, class Opt, class G, class W, class Reduce>
  void prepare(SubGroupSteps<Ops>* steps, Opt& opt, std::size_t i, std::span<const kernels::Segment> segments,
               const G* grads, W* out, float grad_scale, Reduce& reduce, const float* master, const float* m,
               const float* v, const char* where) {
    if (!enabled_ || steps == nullptr) {
      throw usage_error("a parameter home written through a writer needs the store built with "
                        "StoreOptions::output_writer (its scratch)",
                        where);
    }
    const std::size_t first = steps->begin(i), n = steps->numel(i), C = scratch_.size() / 3;
    float* sm = scratch_.data();
    float* sa = sm + C;
    float* sv = sa + C;
    try {
      std::size_t lo = 0;
      do {  // at least once: an empty sub-group still counts the step
        const std::size_t hi = std::min(n, lo + C);
        std::copy(master + first + lo, master + first + hi, sm);
        std::copy(m + first + lo, m + first + hi, sa);
        std::copy(v + first + lo, v + first + hi, sv);
        steps->step_part(opt, i, lo, hi, segments, grads, out, grad_scale, reduce, sm, sa, sv);
        lo = hi;
      } while (lo < n);
    } catch (...) {
      opt.set_step_count(steps->step_before());  // the state never changed; the writer's owner aborts it
      throw;
    }
    if (i + 1 == steps->count()) prepared_ = true;  // every value is written: commit() steps the state
  }

  /// Pass 2 after a complete pass 1: the state (`master`, `m`, `v` of the whole owned range) steps
  /// in place with the same constants and gradients, writing nothing. A no-op otherwise. `P` is
  /// pass 1's output type (the same kernel instantiation).
  template <class P, class Ops, class Opt, class G, class Reduce>
  void commit(SubGroupSteps<Ops>& steps, Opt& opt, std::span<const kernels::Segment> segments, const G* grads,
              float grad_scale, Reduce& reduce, float* master, float* m, float* v) {
    if (!std::exchange(prepared_, false)) return;
    opt.set_step_count(steps.step_before());
    for (std::size_t j = 0; j < steps.count(); ++j) {
      const std::size_t at = steps.begin(j);
      steps.step(opt, j, segments, grads, static_cast<P*>(nullptr), grad_scale, reduce, master + at, m + at, v + at);
    }
  }

  /// Instead of commit() (another group's step failed): the step count goes back.
  template <class Ops, class Opt>
  void abort(const SubGroupSteps<Ops>& steps, Opt& opt) noexcept {
    if (std::exchange(prepared_, false)) opt.set_step_count(steps.step_before());
  }

 private:
  PinnedTrackedBuffer<float> scratch_;  // [3][min(owned, S, chunk)] when enabled: a part's copy
  bool enabled_;
  bool prepared_ = false;               // pass 1 is complete; commit() runs pass 2
};

}  // namespace zerotk::offload
