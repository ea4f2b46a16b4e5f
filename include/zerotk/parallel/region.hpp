#pragma once
/// \file zerotk/parallel/region.hpp
/// The communication operators around a tensor-parallel region (Megatron-LM's conjugate pairs),
/// each a forward and a backward over the user's own buffers, talking over the tensor group only:
///
/// | operator | forward | backward |
/// |---|---|---|
/// | CopyToRegion ("f") | identity | all-reduce (sum) |
/// | ReduceFromRegion ("g") | all-reduce (sum) | identity |
/// | SplitLastDim | keep this rank's columns | all-gather along the last dim |
/// | GatherLastDim | all-gather along the last dim | keep this rank's columns |
/// | GatherFirstDim (sequence parallel) | all-gather along dim 0 | reduce-scatter along dim 0 |
/// | ReduceScatterFirstDim (sequence parallel) | reduce-scatter along dim 0 | all-gather along dim 0 |
///
/// Activations are row-major [rows, cols] (tokens x features). Sums are the communicator's: the
/// threads back end adds in rank order 0..T-1 (((p0 + p1) + p2) + ...), so a sum across the tensor
/// group is bitwise reproducible and equals a serial reference that adds the ranks' parts in that
/// order. Every call waits for its collective (the caller's next step needs the result).
///
///   parallel::CopyToRegion::backward(tp, dx);                    // dx: [n, d], summed over tensor ranks
///   parallel::GatherLastDim::forward<float>(tp, y_local, n, y);  // [n, d/T] on each rank -> [n, d]

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/parallel/elementwise.hpp"
#include "zerotk/parallel/split.hpp"

namespace zerotk::parallel {

namespace detail {
inline void expect(bool ok, const char* fn, std::string what) {
  if (!ok) throw usage_error("buffer sizes do not match", fn, std::move(what));
}
}  // namespace detail

/// "f": entering a region whose ranks each use the whole input (e.g. before a column-parallel linear).
struct CopyToRegion {
  /// Identity: every tensor rank already holds the input.
  template <comm::Communicator C, class T>
  static void forward(C&, std::span<T>) noexcept {}
  /// The input's gradient is the sum of every rank's contribution.
  template <comm::Communicator C, class T>
  static void backward(C& tp, std::span<T> grad) {
    comm::all_reduce(tp, grad, comm::ReduceOp::sum).wait();
  }
};

/// "g": leaving a region whose ranks each hold a partial sum (e.g. after a row-parallel linear).
struct ReduceFromRegion {
  template <comm::Communicator C, class T>
  static void forward(C& tp, std::span<T> out) {
    comm::all_reduce(tp, out, comm::ReduceOp::sum).wait();
  }
  /// Identity: the output's gradient is the same on every tensor rank.
  template <comm::Communicator C, class T>
  static void backward(C&, std::span<T>) noexcept {}
};

/// The last dimension (features) split across the tensor group: [rows, cols] <-> [rows, cols / T].
struct SplitLastDim {
  /// `local` = this rank's columns of `full` (no communication).
  template <comm::Communicator C, class T>
  static void forward(C& tp, std::span<const T> full, std::size_t rows, std::span<T> local) {
    const int t = tp.size();
    detail::expect(rows > 0 && full.size() % rows == 0, "zerotk::parallel::SplitLastDim",
                   std::to_string(full.size()) + " elements in " + std::to_string(rows) + " rows");
    take_shard<T>(full, {rows, full.size() / rows}, TensorSplit::cols(), tp.rank(), t, local);
  }
  /// `full` = every rank's `local` side by side (an all-gather, then a local reordering through
  /// `scratch` of full.size() elements).
  template <comm::Communicator C, class T>
  static void backward(C& tp, std::span<const T> local, std::size_t rows, std::span<T> full, std::span<T> scratch) {
    gather(tp, local, rows, full, scratch, "zerotk::parallel::SplitLastDim::backward");
  }
  template <comm::Communicator C, class T>
  static void backward(C& tp, std::span<const T> local, std::size_t rows, std::span<T> full) {
    std::vector<T> scratch(full.size());
    backward(tp, local, rows, full, std::span<T>(scratch));
  }

  template <comm::Communicator C, class T>
  static void gather(C& tp, std::span<const T> local, std::size_t rows, std::span<T> full, std::span<T> scratch,
                     const char* fn) {
    const auto t = static_cast<std::size_t>(tp.size());
    detail::expect(rows > 0 && local.size() % rows == 0 && full.size() == local.size() * t && scratch.size() == full.size(),
                   fn,
                   "local " + std::to_string(local.size()) + ", full " + std::to_string(full.size()) + ", scratch " +
                       std::to_string(scratch.size()) + ", rows " + std::to_string(rows) + ", tensor size " +
                       std::to_string(t));
    comm::all_gather(tp, local, scratch).wait();
    const std::size_t cols = full.size() / rows;
    for (std::size_t i = 0; i < full.size(); ++i) full[i] = scratch[gathered_index(i, rows, cols, tp.size())];
  }
};

/// The conjugate of SplitLastDim: gather the features in forward, keep this rank's in backward.
struct GatherLastDim {
  template <comm::Communicator C, class T>
  static void forward(C& tp, std::span<const T> local, std::size_t rows, std::span<T> full, std::span<T> scratch) {
    SplitLastDim::gather(tp, local, rows, full, scratch, "zerotk::parallel::GatherLastDim::forward");
  }
  template <comm::Communicator C, class T>
  static void forward(C& tp, std::span<const T> local, std::size_t rows, std::span<T> full) {
    std::vector<T> scratch(full.size());
    forward(tp, local, rows, full, std::span<T>(scratch));
  }
  template <comm::Communicator C, class T>
  static void backward(C& tp, std::span<const T> full, std::size_t rows, std::span<T> local) {
    SplitLastDim::forward(tp, full, rows, local);
  }
};

/// Sequence parallel, entering a region: the tokens (dim 0) were split across the tensor group, the
/// region needs them all. [rows / T, cols] -> [rows, cols], rank r's rows at r * rows / T.
struct GatherFirstDim {
  template <comm::Communicator C, class T>
  static void forward(C& tp, std::span<const T> local, std::span<T> full) {
    detail::expect(full.size() == local.size() * static_cast<std::size_t>(tp.size()),
                   "zerotk::parallel::GatherFirstDim::forward",
                   "local " + std::to_string(local.size()) + ", full " + std::to_string(full.size()));
    comm::all_gather(tp, local, full).wait();
  }
  /// Each rank's rows of the sum over tensor ranks of the full gradient.
  template <comm::Communicator C, class T>
  static void backward(C& tp, std::span<const T> full, std::span<T> local) {
    detail::expect(full.size() == local.size() * static_cast<std::size_t>(tp.size()),
                   "zerotk::parallel::GatherFirstDim::backward",
                   "full " + std::to_string(full.size()) + ", local " + std::to_string(local.size()));
    comm::reduce_scatter(tp, full, local, comm::ReduceOp::sum).wait();
  }
};

/// Sequence parallel, leaving a region of partial sums: each rank keeps its rows of the sum.
struct ReduceScatterFirstDim {
  template <comm::Communicator C, class T>
  static void forward(C& tp, std::span<const T> partial, std::span<T> local) {
    GatherFirstDim::backward(tp, partial, local);
  }
  template <comm::Communicator C, class T>
  static void backward(C& tp, std::span<const T> local, std::span<T> full) {
    GatherFirstDim::forward(tp, local, full);
  }
};

}  // namespace zerotk::parallel
