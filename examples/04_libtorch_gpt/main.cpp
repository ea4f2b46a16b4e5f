// examples/04_libtorch_gpt: a GPT built from torch::nn modules (Embedding, Linear, LayerNorm,
// attention written with torch ops), trained with zerotk through the libtorch adapter
// (zerotk/interop/torch.hpp) on the demo's task, sorting 8 digits, on in-process ranks (threads
// communicator, one torch intra-op thread per rank), from a DeepSpeed JSON config. fp32, stages 0-3.
//
//   build/default/examples/04_libtorch_gpt/zerotk_example_04_libtorch_gpt [--stage 2] [--ranks 2]
//       [--steps 300] [--config ds_config.json]
//   mpirun -np 2 build/default/examples/04_libtorch_gpt/zerotk_example_04_libtorch_gpt --mpi
//
// Prints the loss every 50 steps, the held-out accuracy of greedy decoding, and a checksum of the
// final parameters' bits (equal across stages 0-3: CTest's example.04_libtorch_gpt_stages checks it).
#include <torch/torch.h>

#include <zerotk/comm/threads.hpp>
#include <zerotk/config.hpp>
#include <zerotk/engine.hpp>
#include <zerotk/engine_config.hpp>
#include <zerotk/interop/torch.hpp>
#if ZEROTK_HAS_MPI
#include <zerotk/comm/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

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

const auto plain_call = [](const std::string&, auto&& fn, const torch::Tensor& x) { return fn(x); };

/// `count` examples of 8 digits, separator, the digits sorted: [count, 17] int64.
torch::Tensor sort_examples(std::uint64_t seed, int count) {
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
torch::Tensor answer_loss(const torch::Tensor& logits, const torch::Tensor& batch) {
  const torch::Tensor l = logits.slice(1, kDigits, kSeq).reshape({-1, kVocab});
  const torch::Tensor y = batch.slice(1, kDigits + 1, kSeq + 1).reshape({-1});
  return torch::nn::functional::cross_entropy(l, y);
}

/// Greedy decoding of held-out examples: the fraction sorted entirely right.
double accuracy(Gpt& net, int count) {
  torch::NoGradGuard no_grad;
  const torch::Tensor ex = sort_examples(0xe7a1, count);
  torch::Tensor seq = ex.slice(1, 0, kDigits + 1);
  for (int j = 0; j < kDigits; ++j) {
    const torch::Tensor logits = net->forward(seq, plain_call);
    seq = torch::cat({seq, logits.select(1, seq.size(1) - 1).argmax(-1, true)}, 1);
  }
  const torch::Tensor right = (seq.slice(1, kDigits + 1) == ex.slice(1, kDigits + 1)).all(1);
  return right.to(torch::kFloat64).mean().item<double>();
}

std::string arg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}

/// What the flags stand for, as a DeepSpeed config (the same keys a --config file gives).
std::string default_config(int stage, int steps) {
  return R"({"train_batch_size": 64, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": )" +
         std::to_string(steps) + R"(, "warmup_num_steps": 30, "warmup_type": "linear", "cos_min_ratio": 0.1}},
  "zero_optimization": {"stage": )" +
         std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0}})";
}

/// FNV-1a over the parameters' bits, in named_parameters() order.
std::uint64_t checksum(torch::nn::Module& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : m.parameters()) {
    const torch::Tensor c = p.detach().contiguous();
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    for (std::size_t i = 0; i < static_cast<std::size_t>(c.numel()) * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

struct Result {
  double first_loss = 0, last_loss = 0, seconds = 0, accuracy = 0;
  std::uint64_t checksum = 0;
};

/// Where the ranks are: threads of this process, or one rank per MPI process (world set).
struct Launch {
  int ranks = 2;
  int rank = 0;  // this process's rank under MPI (0 with threads: rank 0 prints)
#if ZEROTK_HAS_MPI
  zerotk::comm::MpiCommunicator* world = nullptr;
  bool mpi() const noexcept { return world != nullptr; }
#else
  bool mpi() const noexcept { return false; }
#endif
};

template <class E>
void train(const zerotk::config::Config& cfg, const Launch& launch, int steps, Result& out) {
  const int micro = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  const int gas = static_cast<int>(cfg.gradient_accumulation_steps);
  const int ranks = launch.ranks;
  std::vector<Gpt> nets;  // one per rank of this process
  for (int r = 0; r < (launch.mpi() ? 1 : ranks); ++r) {
    torch::manual_seed(42);  // the same initial weights on every rank (libtorch's generator is global)
    nets.emplace_back(64, 4, 2);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto body = [&](auto& comm) {
    at::set_num_threads(1);
    const auto rank = static_cast<std::size_t>(comm.rank());
    Gpt& net = nets[launch.mpi() ? 0 : rank];
    zerotk::interop::TorchModel model(*net);
    E engine(comm, model, zerotk::engine_options<E>(cfg));
    if (auto s = zerotk::lr_scheduler(cfg)) engine.set_scheduler(*s);
    zerotk::interop::TorchGradients grads(engine, model);
    const auto run = [&](const std::string& name, auto&& fn, const torch::Tensor& x) { return grads.forward(name, fn, x); };
    for (int s = 0; s < steps; ++s) {
      zerotk::StepReport r;
      for (int m = 0; m < gas; ++m) {
        const torch::Tensor batch = sort_examples((std::uint64_t(s) * gas + m) * ranks + rank, micro);
        const torch::Tensor loss = answer_loss(net->forward(batch.slice(1, 0, kSeq), run), batch);
        grads.backward(loss);
        r = grads.step(loss.item<double>());
      }
      if (rank != 0) continue;
      if (s == 0) out.first_loss = r.loss;
      out.last_loss = r.loss;
      if (s % 50 == 0 || s + 1 == steps)
        std::printf("step %4d  loss %.4f  lr %.5f  grad_norm %.3f\n", s, r.loss, r.lr, r.grad_norm);
    }
    grads.release_module();  // the module keeps its trained values (collective at stage 3)
  };
#if ZEROTK_HAS_MPI
  if (launch.mpi()) {
    body(*launch.world);
  } else {
    zerotk::comm::run_threads(ranks, body);
  }
#else
  zerotk::comm::run_threads(ranks, body);
#endif
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  at::set_num_threads(1);
  out.accuracy = accuracy(nets[0], 1000);
  out.checksum = checksum(*nets[0]);
}

template <int S>
using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::AdamW>>;

bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

int run(int argc, char** argv, const Launch& launch) {
  const int steps = std::atoi(arg(argc, argv, "--steps", "300").c_str());
  const int stage = std::atoi(arg(argc, argv, "--stage", "2").c_str());
  const std::string file = arg(argc, argv, "--config", "");
  const bool root = launch.rank == 0;
  zerotk::config::ResolveContext rc;
  rc.world_size = launch.ranks;
  const zerotk::config::Config cfg =
      file.empty() ? zerotk::config::load(default_config(stage, steps), rc, "flags") : zerotk::config::load_file(file, rc);
  if (root) {
    std::printf("zerotk + libtorch %d.%d: %d ranks (%s), ZeRO stage %d, fp32, batch %lld = %lld micro x %lld "
                "accumulation x %d ranks\n",
                TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, launch.ranks, launch.mpi() ? "MPI" : "threads",
                cfg.zero_optimization.stage, static_cast<long long>(cfg.train_batch_size),
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                static_cast<long long>(cfg.gradient_accumulation_steps), launch.ranks);
  }
  Result res;
  zerotk::config::dispatch<E<0>, E<1>, E<2>, E<3>>(cfg, [&]<class Engine>(std::type_identity<Engine>) {
    train<Engine>(cfg, launch, steps, res);
    return 0;
  });
  if (!root) return 0;
  std::printf("trained %d steps in %.1f s; loss %.4f -> %.4f\n", steps, res.seconds, res.first_loss, res.last_loss);
  std::printf("task sort 8 digits: held-out sequence accuracy %.4f (1000 sequences, greedy decoding)\n",
              res.accuracy);
  std::printf("parameter checksum %016llx\n", static_cast<unsigned long long>(res.checksum));
  const bool ok = res.last_loss < 0.5 * res.first_loss;
  std::printf("%s\n", ok ? "PASS (the loss halved)" : "FAIL (the loss did not halve)");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Launch launch;
    launch.ranks = std::atoi(arg(argc, argv, "--ranks", "2").c_str());
    if (!flag(argc, argv, "--mpi")) return run(argc, argv, launch);
#if ZEROTK_HAS_MPI
    zerotk::comm::MpiSession session;
    zerotk::comm::MpiCommunicator world = zerotk::comm::MpiCommunicator::world();
    launch.world = &world;
    launch.ranks = world.size();
    launch.rank = world.rank();
    try {
      return run(argc, argv, launch);
    } catch (const std::exception& e) {  // a rank's error ends the job: its peers may wait in a collective
      if (world.size() > 1) zerotk::comm::MpiSession::abort("rank " + std::to_string(world.rank()) + ": " + e.what());
      throw;
    }
#else
    throw zerotk::usage_error("this binary was built without MPI", "--mpi");
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
