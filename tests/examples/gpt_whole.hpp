#pragma once
// The whole parameters of a split GPT, put together from the ranks' shards: for the tests that
// compare tensor- or pipeline-parallel runs with whole ones (test_gpt_tensor_parallel.cpp,
// test_gpt_pipeline.cpp).
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpt.hpp"
#include "zerotk/parallel/split.hpp"

namespace gpt_test {

using Whole = std::map<std::string, std::vector<float>>;

/// Writes tensor rank `tensor_rank`'s (of `tensor`) values of every bound parameter of `model` into
/// its place in `whole` (a parameter without storage, another pipeline stage's, is skipped).
inline void merge_shards(gpt::Gpt& model, int tensor_rank, int tensor, Whole& whole) {
  model.parameters([&](std::string_view name, auto& p) {
    if (p.data() == nullptr) return;
    const zerotk::parallel::TensorSplit split = gpt::tensor_split_of(p);  // what the parameter declares
    const zerotk::parallel::MatrixShape shard{p.dim(0), p.numel() / p.dim(0)};
    const zerotk::parallel::MatrixShape full = zerotk::parallel::full_shape(shard, split, split.is_split() ? tensor : 1);
    auto& w = whole[std::string(name)];
    w.resize(full.numel());
    zerotk::parallel::put_shard<float>(std::span<const float>(p.data(), p.numel()), full, split, split.is_split() ? tensor_rank : 0,
                                       split.is_split() ? tensor : 1, w);
  });
}

}  // namespace gpt_test
