#pragma once
/// \file zerotk/parallel/vocab.hpp
/// Vocab-parallel embedding and cross-entropy (Megatron-LM's): the vocabulary (dim 0 of the table,
/// the last dim of the logits) is split across the tensor group, and no rank ever holds the full
/// logits. Rank r owns token ids [r V / T, (r + 1) V / T).
///
/// Embedding: each rank looks up the ids it owns (zero rows for the others) and the rows are summed
/// over the tensor group (one all-reduce of [tokens, d]); exactly one rank adds a non-zero row, so
/// the output equals the unsplit lookup. Backward adds the output's gradient (the same on every
/// tensor rank) into the owned rows only: no communication.
///
/// Cross-entropy over logits [tokens, V / T] per rank: three all-reduces of `tokens` floats each (the
/// row max, the owner's target logit, the sum of exp(logit - max)); loss_i = log(sum) + max - target.
/// The gradient is softmax - one-hot on the owned columns, computed by one per-element function
/// (`xent_grad`) that host loops and device kernels share. The sum of exponentials is summed per rank
/// in column order, then over ranks in rank order, so it differs from tensor size 1 by rounding only
/// (tests bound it); it equals `VocabParallelCrossEntropy::reference` bit for bit.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/parallel/elementwise.hpp"
#include "zerotk/parallel/region.hpp"
#include "zerotk/parallel/split.hpp"
#include "zerotk/parallel/split_param.hpp"

namespace zerotk::parallel {

/// Rank `rank`'s range of a vocabulary of `vocab` ids split `size` ways (check_split first).
constexpr VocabRange vocab_range(std::int64_t vocab, int rank, int size) noexcept {
  const std::int64_t per = vocab / size;
  return {per * rank, per * (rank + 1)};
}

namespace detail {
inline void check_ids(std::span<const std::int32_t> ids, std::int64_t vocab, const char* fn) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw usage_error("token id outside the vocabulary of " + std::to_string(vocab), fn,
                        "ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]));
    }
  }
}
}  // namespace detail

class VocabParallelEmbedding {
 public:
  /// `vocab` ids of `dim` features, split over `tensor_size` ranks (usage_error naming `name` when the
  /// vocabulary does not divide).
  VocabParallelEmbedding(std::string name, std::int64_t vocab, std::size_t dim, int tensor_size)
      : name_(std::move(name)), vocab_(vocab), dim_(dim), tensor_size_(tensor_size) {
    check_split(name_, table_shape(), table_split(), tensor_size_);
  }
  TensorSplit table_split() const noexcept { return TensorSplit::rows(); }
  MatrixShape table_shape() const noexcept { return {static_cast<std::size_t>(vocab_), dim_}; }
  std::int64_t local_vocab() const noexcept { return vocab_ / tensor_size_; }
  /// This rank's rows of the table as a parameter that declares its split (the engine reads it):
  /// `name` [vocab / T, dim], rows().
  SplitParam<float> table_param() const {
    return {name_, {static_cast<std::size_t>(local_vocab()), dim_}, table_split()};
  }

  /// out [ids, dim] = table[ids]: owned rows looked up, summed over the tensor group.
  template <comm::Communicator C>
  void forward(C& tp, std::span<const std::int32_t> ids, std::span<const float> table_r, std::span<float> out) const {
    check(tp, ids, table_r, out, "zerotk::parallel::VocabParallelEmbedding::forward");
    const VocabRange range = vocab_range(vocab_, tp.rank(), tp.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      float* row = out.data() + i * dim_;
      if (range.owns(ids[i])) {
        const float* src = table_r.data() + static_cast<std::size_t>(ids[i] - range.begin) * dim_;
        std::copy(src, src + dim_, row);
      } else {
        std::fill(row, row + dim_, 0.0f);
      }
    }
    ReduceFromRegion::forward(tp, out);
  }

  /// dtable_r's owned rows += dout's rows (dout is the same on every tensor rank).
  template <comm::Communicator C>
  void backward(C& tp, std::span<const std::int32_t> ids, std::span<const float> dout, std::span<float> dtable_r) const {
    check(tp, ids, dtable_r, dout, "zerotk::parallel::VocabParallelEmbedding::backward");
    const VocabRange range = vocab_range(vocab_, tp.rank(), tp.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!range.owns(ids[i])) continue;
      float* dst = dtable_r.data() + static_cast<std::size_t>(ids[i] - range.begin) * dim_;
      for (std::size_t k = 0; k < dim_; ++k) dst[k] += dout[i * dim_ + k];
    }
  }

 private:
  template <class C>
  void check(C& tp, std::span<const std::int32_t> ids, std::span<const float> table_r, std::span<const float> out,
             const char* fn) const {
    if (tp.size() != tensor_size_) {
      throw usage_error("the tensor group's size differs from the layer's", fn + (" of " + name_),
                        std::to_string(tp.size()) + ", layer built for " + std::to_string(tensor_size_));
    }
    detail::expect(table_r.size() == static_cast<std::size_t>(local_vocab()) * dim_ && out.size() == ids.size() * dim_,
                   fn, name_ + ": table shard " + std::to_string(table_r.size()) + ", rows " + std::to_string(out.size()));
    detail::check_ids(ids, vocab_, fn);
  }

  std::string name_;
  std::int64_t vocab_;
  std::size_t dim_;
  int tensor_size_;
};

/// Cross-entropy of logits split by vocabulary: the per-token statistics the backward needs.
struct VocabParallelCrossEntropy {
  std::vector<float> max, sum;  ///< per token: the row max over all ranks, sum of exp(logit - max)

  /// loss [tokens] = log(sum) + max - logit[target]; `logits_r` [tokens, V / T] this rank's columns.
  template <comm::Communicator C>
  void forward(C& tp, std::span<const float> logits_r, std::span<const std::int32_t> targets, std::int64_t vocab,
               std::span<float> loss) {
    const std::size_t n = targets.size();
    const VocabRange range = vocab_range(vocab, tp.rank(), tp.size());
    const auto v = static_cast<std::size_t>(range.size());
    check_split("zerotk::parallel::VocabParallelCrossEntropy (logits)", {n, static_cast<std::size_t>(vocab)},
                TensorSplit::cols(), tp.size());
    detail::expect(logits_r.size() == n * v && loss.size() == n, "zerotk::parallel::VocabParallelCrossEntropy::forward",
                   "logits " + std::to_string(logits_r.size()) + " for " + std::to_string(n) + " tokens x " +
                       std::to_string(v) + " ids, loss " + std::to_string(loss.size()));
    detail::check_ids(targets, vocab, "zerotk::parallel::VocabParallelCrossEntropy::forward");
    max.assign(n, -std::numeric_limits<float>::infinity());
    sum.assign(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < v; ++j) max[i] = std::max(max[i], logits_r[i * v + j]);
    }
    comm::all_reduce(tp, max, comm::ReduceOp::max).wait();
    std::vector<float> target(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < v; ++j) sum[i] += expf(logits_r[i * v + j] - max[i]);
      if (range.owns(targets[i])) target[i] = logits_r[i * v + static_cast<std::size_t>(targets[i] - range.begin)];
    }
    comm::all_reduce(tp, sum, comm::ReduceOp::sum).wait();
    comm::all_reduce(tp, target, comm::ReduceOp::sum).wait();
    for (std::size_t i = 0; i < n; ++i) loss[i] = logf(sum[i]) + max[i] - target[i];
  }

  /// dlogits_r [tokens, V / T] = xent_grad per element with dloss [tokens] (no communication).
  template <comm::Communicator C>
  void backward(C& tp, std::span<const float> logits_r, std::span<const std::int32_t> targets, std::int64_t vocab,
                std::span<const float> dloss, std::span<float> dlogits_r) const {
    const std::size_t n = targets.size();
    const VocabRange range = vocab_range(vocab, tp.rank(), tp.size());
    const auto v = static_cast<std::size_t>(range.size());
    detail::expect(max.size() == n && dloss.size() == n && logits_r.size() == n * v && dlogits_r.size() == n * v,
                   "zerotk::parallel::VocabParallelCrossEntropy::backward",
                   "forward saw " + std::to_string(max.size()) + " tokens; targets " + std::to_string(n) + ", dloss " +
                       std::to_string(dloss.size()) + ", logits " + std::to_string(logits_r.size()));
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < v; ++j) {
        const bool is_target = range.owns(targets[i]) && static_cast<std::int64_t>(j) == targets[i] - range.begin;
        dlogits_r[i * v + j] = xent_grad(logits_r[i * v + j], max[i], sum[i], is_target, dloss[i]);
      }
    }
  }

  /// The serial reference of forward over the full logits [tokens, V]: each rank's column block summed
  /// in column order, the blocks' sums added in rank order, as the tensor group does.
  static std::vector<float> reference(std::span<const float> logits, std::span<const std::int32_t> targets,
                                      std::int64_t vocab, int tensor_size) {
    const std::size_t n = targets.size(), V = static_cast<std::size_t>(vocab);
    const std::size_t v = V / static_cast<std::size_t>(tensor_size);
    std::vector<float> loss(n);
    for (std::size_t i = 0; i < n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < V; ++j) m = std::max(m, logits[i * V + j]);
      float total = 0.0f;
      for (int r = 0; r < tensor_size; ++r) {
        float s = 0.0f;
        for (std::size_t j = 0; j < v; ++j) s += expf(logits[i * V + static_cast<std::size_t>(r) * v + j] - m);
        total = r == 0 ? s : total + s;
      }
      loss[i] = logf(total) + m - logits[i * V + static_cast<std::size_t>(targets[i])];
    }
    return loss;
  }
};

}  // namespace zerotk::parallel
