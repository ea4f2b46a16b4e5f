// examples/04_libtorch_gpt: a GPT built from torch::nn modules (Embedding, Linear, LayerNorm,
// attention written with torch ops), trained with zerotk through the libtorch adapter
// (zerotk/interop/torch.hpp) on the demo's task, sorting 8 digits, on in-process ranks (threads
// communicator, one torch intra-op thread per rank), from a DeepSpeed JSON config. fp32, stages 0-3.
//
//   build/default/examples/04_libtorch_gpt/zerotk_example_04_libtorch_gpt [--stage 2] [--ranks 2]
//       [--steps 300] [--config ds_config.json] [--recompute]
//   mpirun -np 2 build/default/examples/04_libtorch_gpt/zerotk_example_04_libtorch_gpt --mpi
//
// Prints DeepSpeed's step lines every steps_per_print steps and a progress line with the loss
// (the config's csv_monitor writes DeepSpeed's csv files), the held-out accuracy of greedy decoding,
// and a checksum of the final parameters' bits (equal across stages 0-3: CTest's
// example.04_libtorch_gpt_stages checks it).
#include <torch/torch.h>

#include <zerotk/comm/threads.hpp>
#include <zerotk/config.hpp>
#include <zerotk/engines.hpp>  // the compiled engine set's types linked, when built with it
#include <zerotk/engine_config.hpp>
#include <zerotk/interop/torch.hpp>
#include <zerotk/monitor/progress.hpp>
#include <zerotk/monitor/training_log.hpp>
#if ZEROTK_HAS_MPI
#include <zerotk/comm/mpi.hpp>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpt.hpp"

namespace {

using namespace gpt04;

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
  "steps_per_print": 50,
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
  bool recompute = false;  // --recompute: every child under grads.checkpoint (activation checkpointing)
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
    // Each child through the adapter: its graph kept (at stage 3 gathered again for its backward),
    // or with --recompute only its input, its forward run again in backward.
    const auto run = [&](const std::string& name, auto&& fn, const torch::Tensor& x) {
      return launch.recompute ? grads.checkpoint(name, fn, x) : grads.forward(name, fn, x);
    };
    // The config's csv_monitor, steps_per_print and wall_clock_breakdown, in DeepSpeed's formats
    // (docs/monitor.md; rank 0 writes), and a progress line with the loss on rank 0.
    zerotk::monitor::TrainingLog log(zerotk::monitor::TrainingLogOptions::from(cfg, static_cast<int>(rank)));
    std::optional<zerotk::monitor::ProgressLine> progress;
    if (rank == 0) progress.emplace(steps, std::cout, zerotk::monitor::ProgressOptions{.tty = zerotk::monitor::is_terminal(stdout)});
    std::int64_t samples = 0;
    for (int s = 0; s < steps; ++s) {
      zerotk::StepReport r;
      for (int m = 0; m < gas; ++m) {
        const torch::Tensor batch = sort_examples((std::uint64_t(s) * gas + m) * ranks + rank, micro);
        const torch::Tensor loss = answer_loss(net->forward(batch.slice(1, 0, kSeq), run), batch);
        grads.backward(loss);
        r = grads.step(loss.item<double>());
        if (!r.boundary) log.on_micro_step();
      }
      samples += cfg.train_batch_size;
      log.on_boundary_loss(r.loss, samples - cfg.train_batch_size);  // train_loss: the samples before the step
      log.on_step(r, samples);                                       // the rest: the samples after it
      if (rank != 0) continue;
      progress->update(s + 1, r.loss);
      if (s == 0) out.first_loss = r.loss;
      out.last_loss = r.loss;
    }
    if (progress) progress->finish();
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

constexpr const char* kUsage =
    "zerotk_example_04_libtorch_gpt: a libtorch GPT trained by zerotk's engine through the adapter\n"
    "  --stage 0|1|2|3       ZeRO stage (default 2)\n"
    "  --ranks N             thread ranks (default 2; under --mpi the processes)\n"
    "  --steps N             optimizer steps (default 300)\n"
    "  --config FILE         a DeepSpeed config instead of the flags (no tensor or pipeline parallelism:\n"
    "                        this trainer builds no grid, so a config asking for one is refused)\n"
    "  --recompute           every child module recomputed in backward (activation checkpointing)\n"
    "  --mpi                 one rank per MPI process (run under mpirun)\n"
    "  --help                this text\n";

/// Every argument is a known flag (with its value where it takes one): an unknown or misspelt flag
/// is an error naming it, not a 300-step run without it (issue 57 item 15). True for --help.
bool check_flags(int argc, char** argv) {
  static constexpr std::array<std::string_view, 4> kValued{"--stage", "--ranks", "--steps", "--config"};
  static constexpr std::array<std::string_view, 2> kBool{"--recompute", "--mpi"};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") return true;
    if (std::find(kBool.begin(), kBool.end(), a) != kBool.end()) continue;
    if (std::find(kValued.begin(), kValued.end(), a) != kValued.end()) {
      if (i + 1 >= argc) throw zerotk::usage_error("needs a value", std::string(a));
      ++i;
      continue;
    }
    throw zerotk::usage_error("unknown flag (--help lists them)", std::string(a));
  }
  return false;
}

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
  rc.print_notices_to = root ? stderr : nullptr;  // the config's notices once
  const zerotk::config::Config cfg =
      file.empty() ? zerotk::config::load(default_config(stage, steps), rc, "flags") : zerotk::config::load_file(file, rc);
  if (root) {
    std::printf("zerotk + libtorch %d.%d: %d ranks (%s), ZeRO stage %d, fp32, batch %lld = %lld micro x %lld "
                "accumulation x %d ranks%s\n",
                TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, launch.ranks, launch.mpi() ? "MPI" : "threads",
                cfg.zero_optimization.stage, static_cast<long long>(cfg.train_batch_size),
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                static_cast<long long>(cfg.gradient_accumulation_steps), launch.ranks,
                launch.recompute ? ", every child recomputed in backward (--recompute)" : "");
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
    if (check_flags(argc, argv)) {
      std::printf("%s", kUsage);
      return 0;
    }
    Launch launch;
    launch.ranks = std::atoi(arg(argc, argv, "--ranks", "2").c_str());
    launch.recompute = flag(argc, argv, "--recompute");
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
