#pragma once
// The libtorch GPT of examples/04_libtorch_gpt and its task, sorting 8 digits: shared by the example
// (main.cpp) and bench/interop (its step time against a plain data-parallel loop).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace gpt04 {

constexpr int kDigits = 8, kSeparator = 10, kVocab = 11, kSeq = 2 * kDigits;  // model reads 16 tokens

struct BlockImpl : torch::nn::Module {
  BlockImpl(int dim, int heads) : heads_(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj = register_module("proj", torch::nn::Linear(dim, dim));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc = register_module("fc", torch::nn::Linear(dim, 4 * dim));
    out = register_module("out", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(torch::Tensor x) {  // [B, T, C]
    const std::int64_t b = x.size(0), t = x.size(1), c = x.size(2), hd = c / heads_;
    const std::vector<torch::Tensor> parts = qkv(ln1(x)).chunk(3, -1);
    const auto heads = [&](const torch::Tensor& z) { return z.reshape({b, t, heads_, hd}).transpose(1, 2); };
    const torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    const torch::Tensor causal = torch::ones({t, t}, torch::kBool).triu(1);
    const torch::Tensor att =
        (q.matmul(k.transpose(-2, -1)) / std::sqrt(double(hd))).masked_fill(causal, -INFINITY).softmax(-1);
    x = x + proj(att.matmul(v).transpose(1, 2).reshape({b, t, c}));
    return x + out(torch::gelu(fc(ln2(x))));
  }
  std::int64_t heads_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Block);

/// Children tok, pos, block0.., ln_f, head: each one fetch unit at stage 3.
struct GptImpl : torch::nn::Module {
  GptImpl(int dim, int heads, int layers) {
    tok = register_module("tok", torch::nn::Embedding(kVocab, dim));
    pos = register_module("pos", torch::nn::Embedding(kSeq, dim));
    for (int i = 0; i < layers; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block(dim, heads)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    head = register_module("head", torch::nn::Linear(dim, kVocab));
  }
  /// `run(name, fn, x)`: the adapter's TorchGradients::forward in training, a plain call elsewhere.
  template <class Run>
  torch::Tensor forward(const torch::Tensor& idx, Run&& run) {
    const torch::Tensor positions = torch::arange(idx.size(1), torch::kLong);
    torch::Tensor h = run("tok", [m = tok](const torch::Tensor& in) mutable { return m(in); }, idx) +
                      run("pos", [m = pos](const torch::Tensor& in) mutable { return m(in); }, positions);
    for (std::size_t i = 0; i < blocks.size(); ++i)
      h = run("block" + std::to_string(i), [m = blocks[i]](const torch::Tensor& in) mutable { return m(in); }, h);
    h = run("ln_f", [m = ln_f](const torch::Tensor& in) mutable { return m(in); }, h);
    return run("head", [m = head](const torch::Tensor& in) mutable { return m(in); }, h);
  }
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Gpt);

inline constexpr auto plain_call = [](const std::string&, auto&& fn, const torch::Tensor& x) { return fn(x); };

/// `count` examples of 8 digits, separator, the digits sorted: [count, 17] int64.
inline torch::Tensor sort_examples(std::uint64_t seed, int count) {
  std::mt19937_64 gen(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(count) * (kSeq + 1));
  for (int n = 0; n < count; ++n) {
    std::int64_t* e = v.data() + static_cast<std::size_t>(n) * (kSeq + 1);
    for (int j = 0; j < kDigits; ++j) e[j] = static_cast<std::int64_t>(gen() % 10);
    e[kDigits] = kSeparator;
    std::copy(e, e + kDigits, e + kDigits + 1);
    std::sort(e + kDigits + 1, e + kSeq + 1);
  }
  return torch::from_blob(v.data(), {count, kSeq + 1}, torch::kLong).clone();
}

/// Cross entropy of the 8 answer digits (positions 8..15 predict tokens 9..16).
inline torch::Tensor answer_loss(const torch::Tensor& logits, const torch::Tensor& batch) {
  const torch::Tensor l = logits.slice(1, kDigits, kSeq).reshape({-1, kVocab});
  const torch::Tensor y = batch.slice(1, kDigits + 1, kSeq + 1).reshape({-1});
  return torch::nn::functional::cross_entropy(l, y);
}

}  // namespace gpt04
