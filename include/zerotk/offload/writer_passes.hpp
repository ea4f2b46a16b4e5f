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
///   pass 1 (prepare, sub-group i = 0 .. n-1)   the values of the step (Run::values: the fused
///                                              kernel reading master, m and v and writing only the
///                                              working copy) go through the writer. The state and
///                                              the step count are untouched; a failure rethrows
///                                              (the writer's owner aborts its transaction).
///   pass 2 (commit, once every group is ready) step the state in place with the same constants
///                                              and gradients and no output: no I/O, the same bits.
///   abort (another group failed)               nothing to undo.
///
/// The price is a second read of master, m, v and the gradients (the step's traffic goes from 28 to
/// 42 bytes per element with 16-bit values; bench/offload/bench_writer_passes.cpp), and no memory:
/// pass 1 writes nothing but the values. Sub-group by sub-group gives the bits of one fused step
/// only for elementwise optimizers (Adam, AdamW, which have Run::values); engine/compat.hpp refuses
/// LAMB here.

#include <cstddef>
#include <span>
#include <utility>

#include "zerotk/core/error.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/offload/sub_group_steps.hpp"

namespace zerotk::offload {

class WriterPasses {
 public:
  /// Pass 1 over sub-group i of `steps` (null: the store has no sub-group loop, as Offload<None>'s
  /// built without StoreOptions::output_writer): `master`, `m`, `v` point at the state's first
  /// element, which is only read. `where` names the store in the error of one without the loop.
  template <class Ops, class Opt, class G, class W>
  void prepare(SubGroupSteps<Ops>* steps, const Opt& opt, std::size_t i, std::span<const kernels::Segment> segments,
               const G* grads, W* out, float grad_scale, const float* master, const float* m, const float* v,
               const char* where) {
    if (steps == nullptr) {
      throw usage_error("a parameter home written through a writer needs the store built with "
                        "StoreOptions::output_writer (its sub-group loop)",
                        where);
    }
    if (i == 0) prepared_ = false;  // a new step: an earlier pass 1 that failed is over
    const std::size_t lo = steps->begin(i);
    steps->values(opt, i, segments, grads, out, grad_scale, master + lo, m + lo, v + lo);
    if (i + 1 == steps->count()) prepared_ = true;  // every value is written: commit() steps the state
  }

  /// Pass 2 after a complete pass 1: the state (`master`, `m`, `v` of the whole owned range) steps
  /// in place with the same constants and gradients, writing nothing. A no-op otherwise. `P` is
  /// pass 1's output type.
  template <class P, class Ops, class Opt, class G, class Reduce>
  void commit(SubGroupSteps<Ops>& steps, Opt& opt, std::span<const kernels::Segment> segments, const G* grads,
              float grad_scale, Reduce& reduce, float* master, float* m, float* v) {
    if (!std::exchange(prepared_, false)) return;
    for (std::size_t j = 0; j < steps.count(); ++j) {
      const std::size_t at = steps.begin(j);
      steps.step(opt, j, segments, grads, static_cast<zero::out_element_t<P>*>(nullptr), grad_scale, reduce,
                 master + at, m + at, v + at);
    }
  }

  /// Instead of commit() (another group's step failed): the state and the step count never changed.
  void abort() noexcept { prepared_ = false; }

 private:
  bool prepared_ = false;  // pass 1 is complete; commit() runs pass 2
};

}  // namespace zerotk::offload
