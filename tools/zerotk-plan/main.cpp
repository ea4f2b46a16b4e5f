// zerotk-plan: predict per-rank peak memory for every ZeRO stage x offload x precision x
// activation-checkpointing choice, and print the cheapest configuration that fits.
//
//   zerotk-plan --params 7.5e9 --world 64                      the ZeRO paper's model-state table
//   zerotk-plan --layers 24 --hidden 1024 --heads 16 --seq 1024 --vocab 50257 --micro-batch 4
//               --world 8 --device-mem 24GB --host-mem 200GB   the grid, and the cheapest fit as DeepSpeed JSON
//   zerotk-plan --params 1.3e9 --world 8 --deepspeed-estimate  DeepSpeed's own estimators
//
// Exit 0: printed (with a budget: a configuration fits). Exit 1: bad input (a config_error naming
// the flag or key and the value) or nothing fits. Exit 2: bad command line.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/config.hpp"
#include "zerotk/plan.hpp"

namespace {

namespace plan = zerotk::plan;
using zerotk::MemoryCategory;
using zerotk::MemorySpace;

constexpr std::string_view kUsage = R"usage(usage: zerotk-plan MODEL --world N [--device-mem SIZE --host-mem SIZE] [options]

Predicts per-rank memory (bytes by space and category) of zerotk's engine for every ZeRO stage x
optimizer offload x parameter offload x precision x activation checkpointing, and the cheapest
configuration that fits, printed as a DeepSpeed config.

MODEL, one of:
  --params N             total parameters (7.5e9, 350M, 1.3B); one tensor, no activations
  --layer-params A,B,..  parameters per layer (each layer one tensor and one ZeRO-3 fetch unit)
  --layers L --hidden D --heads H --seq T --vocab V [--micro-batch B] [--d-ff F] [--context C]
                         [--tied-head]   the GPT example's transformer (examples/02_gpt), with activations
  --config FILE          a DeepSpeed JSON config: plan exactly that configuration (with a MODEL above);
                         a regular file of at most 16 MiB (a FIFO or /dev/zero is refused)
required:
  --world N              every rank of the job: data-parallel ranks x --tp
  --tp T                 tensor-parallel size (with the transformer flags: the GPT example's Megatron
                         split; the plan is one tensor rank's, N = --world / T data ranks)
  --sequence-parallel    with --tp: the blocks' activations split by tokens
  --experts E --top-k K --ep P   with the transformer flags: each block's MLP replaced by E experts
                         routed top-K, held by P expert ranks (expert-data ranks: data / P); prints
                         the model states per rank (dense over the data ranks, experts over the
                         expert-data ranks) and the all-to-all bytes per MoE layer (model states
                         only: not with --device-mem, --config, --pp or --deepspeed-estimate yet)
  --cp P [--cp-mode a2a|p2p|a2a+p2p] [--a2a A] [--kv-heads K] [--sparse-attention FILE]
         [--flops F --link-bw BW]
                         with the transformer flags: context parallelism over P ranks (each N / P
                         tokens); prints the elements each rank sends per layer under Ulysses (a2a),
                         the ring (p2p) and both (a2a+p2p, A the Ulysses degree; default all three,
                         A = the largest proper divisor of P), the ring's under FILE's
                         sparse_attention layout (a DeepSpeed config; what the mask-aware ring sends),
                         one rank's activations against the whole sequence's, and with F (FLOP/s)
                         and BW (bytes/s) the tokens per rank from which the ring's transfers hide
                         (context parallelism's tables only: not with --device-mem, --config, --pp,
                         --experts or --deepspeed-estimate yet)
  --pp P                 pipeline stages (with --layer-params or the transformer flags): the layers
                         cut by parameter count (DeepSpeed's partition "parameters"; --partition
                         uniform by layer count); the plan is the stage with the most model
                         states, N = --world / (--tp x --pp) data ranks
budget (per rank; suffixes B, KB, MB, GB, TB = powers of 1000, KiB .. TiB = powers of 1024):
  --device-mem SIZE      accelerator memory
  --host-mem SIZE        host memory (pageable + pinned)
engine settings:
  --precision LIST       fp32,fp16,bf16 (default all three; the ZeRO table: fp16)
  --gas N                gradient accumulation steps (default 1)
  --bucket-elements N    reduce_bucket_size in elements (default 5e8)
  --sub-group-size N     sub_group_size (default 1e9)
  --hpz G                zero_hpz_partition_size (default 1)
  --checkpoint-every K   also evaluate every:K checkpointing (default 2)
  --host-engine          Device<Host>: the engine's buffers in host memory instead of the device
  --emulated             float parameters over 16-bit storage (the GPT example)
  --optimizer NAME       the optimizer's DeepSpeed type, for its state's size (default AdamW: 2
                         moments; Lion keeps 1). With --config, the config's optimizer block
output:
  --all                  every configuration of the grid, not only the first that fit
  --deepspeed-estimate   DeepSpeed's estimate_zero2/zero3_model_states_mem_needs figures
  --gpus-per-node G      for --deepspeed-estimate (default: --world, one node)
  --buffer-factor F      DeepSpeed's additional_buffer_factor (default 1.5)
  --help                 this text
limits (a number outside them is refused, naming the flag, the value and the range; exit 1):
  --params, --bucket-elements, --sub-group-size   1 .. 1e15
  --layer-params         at most 1,000,000 entries, each 0 .. 1e15, their sum 1 .. 1e15
  --layers               1 .. 1,000,000 (the transformer's parameters at most 1e15 in all)
  --hidden, --heads, --micro-batch   1 .. 2^20;   --seq, --context, --vocab, --d-ff   1 .. 2^24
  --experts, --top-k, --ep, --cp, --a2a, --kv-heads   1 .. 2^20;   --flops, --link-bw   (0, 1e30)
  --world, --tp, --pp, --hpz, --gpus-per-node   1 .. 2^20;   --gas 1 .. 1e6;   --checkpoint-every 1 .. 1e6
  --device-mem, --host-mem           0 .. 1e18 bytes;   --buffer-factor 1 .. 1000
)usage";

struct UsageError {
  std::string message;
};

struct Args {
  std::optional<std::size_t> params;
  std::vector<std::size_t> layer_params;
  plan::TransformerShape shape;
  bool transformer = false;
  std::optional<plan::ExpertShape> experts;  ///< --experts (with --top-k, --ep)
  std::optional<plan::ContextShape> context;  ///< --cp (with --cp-mode, --a2a, --kv-heads)
  bool all_cp_modes = true;                   ///< no --cp-mode: every mode
  bool cp_given = false;
  std::string sparse_attention_file;
  double flops = 0, link_bw = 0;
  std::string config_file;
  int world = 0;
  /// The data-parallel ranks ZeRO partitions over: --world / --tp.
  int data() const noexcept { return world / (static_cast<int>(shape.tensor) * pipeline); }
  int pipeline = 1;
  plan::StagePartition partition = plan::StagePartition::parameters;
  std::optional<std::size_t> device_mem, host_mem;
  std::vector<zerotk::DType> precisions;
  plan::EngineSettings settings;
  int checkpoint_every = 2;
  bool all = false, ds_estimate = false, help = false;
  int gpus_per_node = 0;
  double buffer_factor = 1.5;
};

// The tool's limits (docs/plan.md, "Limits"). Within them every figure the planner computes is an
// exact integer far below 2^64 bytes (16 bytes per parameter and the buffers on 1e15 parameters
// stay under 2^60), and a search at the largest model takes seconds: the planner is linear in the
// layers, but it holds every tensor of every layer (about 1.8 GB and 7-10 s at 1,000,000 GPT blocks).
constexpr std::size_t kMaxParams = 1'000'000'000'000'000;  // 1e15: 500 times today's largest models
constexpr std::size_t kMaxLayers = 1'000'000;              // --layers, and entries of --layer-params
constexpr std::size_t kMaxWidth = std::size_t{1} << 20;    // --hidden, --heads, --micro-batch
constexpr std::size_t kMaxLength = std::size_t{1} << 24;   // --seq, --context, --vocab, --d-ff
constexpr std::size_t kMaxBytes = 1'000'000'000'000'000'000;  // 1e18 B: --device-mem, --host-mem
constexpr int kMaxWorld = 1 << 20;
constexpr double kMaxBufferFactor = 1000;

std::string range_text(double lo, double hi) {
  std::ostringstream os;
  os.precision(15);
  os << "[" << lo << ", " << hi << "]";
  return os.str();
}

/// A count in [lo, hi]; the error names the flag, the text and the range.
std::size_t count_in(std::string_view flag, std::string_view text, std::size_t lo, std::size_t hi) {
  const std::size_t v = plan::parse_count(flag, text);
  if (v < lo || v > hi) {
    throw zerotk::config_error("out of range: must be in " + range_text(static_cast<double>(lo), static_cast<double>(hi)),
                               std::string(flag), std::string(text));
  }
  return v;
}

int to_int(std::string_view flag, std::string_view text, int lo, int hi = 2147483647) {
  return static_cast<int>(count_in(flag, text, static_cast<std::size_t>(lo), static_cast<std::size_t>(hi)));
}

std::size_t bytes_in(std::string_view flag, std::string_view text) {
  const std::size_t v = plan::parse_bytes(flag, text);
  if (v > kMaxBytes) {
    throw zerotk::config_error("out of range: must be in [0, 1e18] bytes", std::string(flag), std::string(text));
  }
  return v;
}

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

/// The moment count of the optimizer DeepSpeed calls `name` (its "type"; any case).
std::size_t optimizer_moments(std::string_view flag, std::string_view name) {
  std::string names;
  for (std::size_t i = 0; i < zerotk::config::OptimizerKind::count(); ++i) {
    const zerotk::config::OptimizerKind k = zerotk::config::OptimizerKind::at(i);
    if (zerotk::config::detail::iequals(name, k.name())) return k.moments();
    names += (names.empty() ? "" : ", ") + std::string(k.name());
  }
  throw zerotk::config_error("must be one of " + names, std::string(flag), std::string(name));
}

zerotk::DType precision_of(std::string_view flag, std::string_view p) {
  if (p == "fp32") return zerotk::DType::fp32;
  if (p == "fp16") return zerotk::DType::fp16;
  if (p == "bf16") return zerotk::DType::bf16;
  throw zerotk::config_error("must be fp32, fp16 or bf16", std::string(flag), std::string(p));
}

Args parse_args(int argc, char** argv) {
  Args a;
  auto expert_shape = [&]() -> plan::ExpertShape& {
    if (!a.experts) a.experts.emplace();
    return *a.experts;
  };
  auto context_shape = [&]() -> plan::ContextShape& {
    if (!a.context) a.context.emplace();
    return *a.context;
  };
  std::vector<std::string_view> rest(argv + 1, argv + argc);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    const std::string_view arg = rest[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= rest.size()) throw UsageError{std::string(arg) + " expects a value"};
      return rest[++i];
    };
    if (arg == "--help" || arg == "-h") a.help = true;
    else if (arg == "--params") a.params = count_in(arg, value(), 1, kMaxParams);
    else if (arg == "--layer-params") {
      const std::string_view list = value();
      const std::size_t entries = static_cast<std::size_t>(std::count(list.begin(), list.end(), ',')) + 1;
      if (entries > kMaxLayers) {  // counted before any entry is parsed or stored
        throw zerotk::config_error("too many layers: at most " + std::to_string(kMaxLayers) + " entries", std::string(arg),
                                   std::to_string(entries) + " entries");
      }
      std::size_t total = 0;
      for (const std::string& s : split(list)) {
        a.layer_params.push_back(count_in(arg, s, 0, kMaxParams));
        total += a.layer_params.back();  // both terms <= 1e15: no wrap
        if (total > kMaxParams) {
          throw zerotk::config_error("out of range: the layers' sum must be in [1, 1e15]", std::string(arg),
                                     "a sum above 1e15 at entry " + std::to_string(a.layer_params.size()));
        }
      }
      if (total == 0) throw zerotk::config_error("out of range: the layers' sum must be in [1, 1e15]", std::string(arg), "0");
    } else if (arg == "--layers") { a.shape.layers = count_in(arg, value(), 1, kMaxLayers); a.transformer = true; }
    else if (arg == "--hidden") { a.shape.hidden = count_in(arg, value(), 1, kMaxWidth); a.transformer = true; }
    else if (arg == "--heads") { a.shape.heads = count_in(arg, value(), 1, kMaxWidth); a.transformer = true; }
    else if (arg == "--seq") { a.shape.sequence = count_in(arg, value(), 1, kMaxLength); a.transformer = true; }
    else if (arg == "--vocab") { a.shape.vocab = count_in(arg, value(), 1, kMaxLength); a.transformer = true; }
    else if (arg == "--micro-batch") a.shape.micro_batch = count_in(arg, value(), 1, kMaxWidth);
    else if (arg == "--d-ff") a.shape.d_ff = count_in(arg, value(), 1, kMaxLength);
    else if (arg == "--context") a.shape.context = count_in(arg, value(), 1, kMaxLength);
    else if (arg == "--tied-head") a.shape.tied_head = true;
    else if (arg == "--tp") a.shape.tensor = count_in(arg, value(), 1, kMaxWorld);
    else if (arg == "--sequence-parallel") a.shape.sequence_parallel = true;
    else if (arg == "--experts") expert_shape().experts = count_in(arg, value(), 1, kMaxWidth);
    else if (arg == "--top-k") expert_shape().top_k = count_in(arg, value(), 1, kMaxWidth);
    else if (arg == "--ep") expert_shape().ep = count_in(arg, value(), 1, kMaxWidth);
    else if (arg == "--cp") { context_shape().cp = count_in(arg, value(), 1, kMaxWidth); a.cp_given = true; }
    else if (arg == "--cp-mode") {
      const std::string_view v = value();
      if (v != "a2a" && v != "p2p" && v != "a2a+p2p") throw zerotk::config_error("must be a2a, p2p or a2a+p2p", std::string(arg), std::string(v));
      context_shape().mode = v == "a2a" ? plan::CpMode::a2a : v == "p2p" ? plan::CpMode::p2p : plan::CpMode::a2a_p2p;
      a.all_cp_modes = false;
    }
    else if (arg == "--a2a") context_shape().a2a = count_in(arg, value(), 1, kMaxWidth);
    else if (arg == "--kv-heads") context_shape().kv_heads = count_in(arg, value(), 1, kMaxWidth);
    else if (arg == "--sparse-attention") a.sparse_attention_file = std::string(value());
    else if (arg == "--flops" || arg == "--link-bw") {
      std::size_t used = 0;
      const double v = plan::detail::number_prefix(arg, value(), used);
      if (used != rest[i].size() || !(v > 0 && v < 1e30)) {
        throw zerotk::config_error("must be a number in (0, 1e30)", std::string(arg), std::string(rest[i]));
      }
      (arg == "--flops" ? a.flops : a.link_bw) = v;
    }
    else if (arg == "--pp") a.pipeline = to_int(arg, value(), 1, kMaxWorld);
    else if (arg == "--partition") {
      const std::string_view v = value();
      if (v != "parameters" && v != "uniform") throw zerotk::config_error("must be parameters or uniform", std::string(arg), std::string(v));
      a.partition = v == "uniform" ? plan::StagePartition::uniform : plan::StagePartition::parameters;
    }
    else if (arg == "--config") a.config_file = std::string(value());
    else if (arg == "--world") a.world = to_int(arg, value(), 1, kMaxWorld);
    else if (arg == "--device-mem") a.device_mem = bytes_in(arg, value());
    else if (arg == "--host-mem") a.host_mem = bytes_in(arg, value());
    else if (arg == "--precision") {
      for (const std::string& s : split(value())) a.precisions.push_back(precision_of(arg, s));
    } else if (arg == "--gas") a.settings.gradient_accumulation_steps = to_int(arg, value(), 1, 1'000'000);
    else if (arg == "--bucket-elements") {
      // elements, in every precision (as the engine takes it)
      a.settings.reduce_bucket_size = count_in(arg, value(), 1, kMaxParams);
    } else if (arg == "--sub-group-size") a.settings.sub_group_size = count_in(arg, value(), 1, kMaxParams);
    else if (arg == "--hpz") a.settings.hpz_partition_size = to_int(arg, value(), 1, kMaxWorld);
    else if (arg == "--checkpoint-every") a.checkpoint_every = to_int(arg, value(), 1, static_cast<int>(kMaxLayers));
    else if (arg == "--host-engine") a.settings.compute_space = MemorySpace::host;
    else if (arg == "--emulated") a.settings.emulated = true;
    else if (arg == "--optimizer") a.settings.optimizer_moments = optimizer_moments(arg, value());
    else if (arg == "--all") a.all = true;
    else if (arg == "--deepspeed-estimate") a.ds_estimate = true;
    else if (arg == "--gpus-per-node") a.gpus_per_node = to_int(arg, value(), 1, kMaxWorld);
    else if (arg == "--buffer-factor") {
      std::size_t used = 0;
      a.buffer_factor = plan::detail::number_prefix(arg, value(), used);
      if (used != rest[i].size()) throw zerotk::config_error("must be a number", std::string(arg), std::string(rest[i]));
      // DeepSpeed multiplies the CPU figures by it: below 1 it would predict less than the states
      // themselves, and 1e308 overflowed to a negative size (issue 49).
      if (!(a.buffer_factor >= 1 && a.buffer_factor <= kMaxBufferFactor)) {
        throw zerotk::config_error("out of range: must be in " + range_text(1, kMaxBufferFactor), std::string(arg),
                                   std::string(rest[i]));
      }
    } else throw UsageError{"unknown option " + std::string(arg)};
  }
  if (a.help) return a;
  if (a.world == 0) throw UsageError{"--world N is required"};
  const int models = (a.params ? 1 : 0) + (a.layer_params.empty() ? 0 : 1) + (a.transformer ? 1 : 0);
  if (models == 0) throw UsageError{"no model given: --params, --layer-params or --layers/--hidden/..."};
  if (models > 1) throw UsageError{"give one model: --params, --layer-params or the transformer shape"};
  if (a.device_mem.has_value() != a.host_mem.has_value()) {
    throw UsageError{"--device-mem and --host-mem go together (the budget per rank)"};
  }
  if (a.shape.tensor > 1 && !a.transformer) {
    throw UsageError{"--tp splits the transformer's tensors (qkv, MLP, projections): give the model as "
                     "--layers/--hidden/--heads/..., which says which tensors split"};
  }
  if (a.shape.tensor > 1 && a.ds_estimate) {
    throw UsageError{"--deepspeed-estimate: DeepSpeed's estimators know no tensor parallelism (drop --tp)"};
  }
  if (a.world % static_cast<int>(a.shape.tensor) != 0) {
    throw zerotk::config_error("must divide --world (" + std::to_string(a.world) + ")", "--tp", std::to_string(a.shape.tensor));
  }
  if (a.pipeline > 1 && a.params) {
    throw UsageError{"--pp cuts the model's layers into stages: give them (--layer-params or the transformer flags)"};
  }
  if (a.pipeline > 1 && a.ds_estimate) throw UsageError{"--deepspeed-estimate: DeepSpeed's estimators know no pipeline (drop --pp)"};
  if (a.world % (static_cast<int>(a.shape.tensor) * a.pipeline) != 0) {
    throw zerotk::config_error("--tp x --pp must divide --world (" + std::to_string(a.world) + ")", "--pp", std::to_string(a.pipeline));
  }
  if (a.data() % a.settings.hpz_partition_size != 0) {
    throw zerotk::config_error("must divide the data-parallel ranks (" + std::to_string(a.data()) + " = --world / --tp)",
                               "--hpz", std::to_string(a.settings.hpz_partition_size));
  }
  if (a.experts) {
    if (a.experts->experts == 0) throw UsageError{"--top-k and --ep go with --experts E"};
    if (!a.transformer) throw UsageError{"--experts replaces the transformer's MLPs: give the model as --layers/--hidden/..."};
    if (a.device_mem || !a.config_file.empty() || a.pipeline > 1 || a.ds_estimate) {
      throw UsageError{"--experts prints model states per rank only, for now: not with --device-mem, --config, --pp or "
                       "--deepspeed-estimate"};
    }
    if (a.data() % static_cast<int>(a.experts->ep) != 0) {
      throw zerotk::config_error("must divide the data-parallel ranks (" + std::to_string(a.data()) + " = --world / --tp)",
                                 "--ep", std::to_string(a.experts->ep));
    }
  }
  if (a.context) {
    if (!a.cp_given) throw UsageError{"--cp-mode, --a2a and --kv-heads go with --cp P"};
    if (!a.transformer) throw UsageError{"--cp splits the transformer's sequence: give the model as --layers/--hidden/--heads/--seq/..."};
    if (a.device_mem || !a.config_file.empty() || a.pipeline > 1 || a.ds_estimate || a.experts) {
      throw UsageError{"--cp prints context parallelism's tables only, for now: not with --device-mem, --config, --pp, "
                       "--experts or --deepspeed-estimate"};
    }
    if ((a.flops > 0) != (a.link_bw > 0)) throw UsageError{"--flops and --link-bw go together (the ring's overlap condition)"};
  } else if (!a.sparse_attention_file.empty() || a.flops > 0 || a.link_bw > 0) {
    throw UsageError{"--sparse-attention, --flops and --link-bw go with --cp P"};
  }
  return a;
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / 1e9);
  return buf;
}
std::string gb2(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / 1e9);
  return buf;
}

plan::EngineSettings for_precision(plan::EngineSettings s, zerotk::DType) {
  return s;  // the bucket size counts elements in every precision
}

void print_breakdown(const plan::Evaluation& e) {
  std::cout << "per-rank bytes of " << e.choice.name() << ":\n";
  std::printf("  %-16s", "category");
  for (std::size_t s = 0; s < zerotk::kMemorySpaceCount; ++s) {
    std::printf(" %16s", std::string(zerotk::to_string(static_cast<MemorySpace>(s))).c_str());
  }
  std::printf("\n");
  for (std::size_t c = 0; c < zerotk::kMemoryCategoryCount; ++c) {
    std::printf("  %-16s", std::string(zerotk::to_string(static_cast<MemoryCategory>(c))).c_str());
    for (std::size_t s = 0; s < zerotk::kMemorySpaceCount; ++s) {
      std::printf(" %16zu", e.memory.at(static_cast<MemorySpace>(s), static_cast<MemoryCategory>(c)));
    }
    std::printf("\n");
  }
  std::printf("  %-16s", "total");
  for (std::size_t s = 0; s < zerotk::kMemorySpaceCount; ++s) std::printf(" %16zu", e.memory.space_total(static_cast<MemorySpace>(s)));
  std::printf("\n  Psi = %zu, padded %zu, %zu buckets, partition %zu elements per rank; activations kept %zu + transient %zu\n",
              e.memory.psi, e.memory.psi_padded, e.memory.buckets, e.memory.partition, e.activations.kept,
              e.activations.transient);
  for (const auto& n : e.memory.approximate) std::cout << "  approximate: " << n << "\n";
}

void print_zero_table(const plan::ModelDescription& m, const Args& a, zerotk::DType p) {
  std::cout << "model states per rank (" << zerotk::to_string(p) << (p == zerotk::DType::fp32 ? "" : " mixed precision")
            << ", " << (a.settings.optimizer_moments == 1 ? "one optimizer moment (Lion)" : "Adam")
            << "; Psi = " << m.total_params()
            << (a.pipeline > 1 ? (a.shape.tensor > 1 ? " on one tensor rank of the stage" : " on the stage") : a.shape.tensor > 1 ? " on one tensor rank" : "")
            << ", N = " << a.data()
            << "; GB = 1e9 bytes):\n";
  for (int stage = 0; stage <= 3; ++stage) {
    plan::Choice c;
    c.stage = stage;
    c.precision = p;
    const plan::MemoryPlan mp = plan::model_state_plan(m, a.data(), c, for_precision(a.settings, p));
    std::cout << "  stage " << stage << ": " << gb(static_cast<double>(mp.model_states())) << " GB  ("
              << mp.model_states() << " B)\n";
  }
}

/// --experts: the dense parameters' and this rank's experts' model states per stage, the expert
/// group's optimizer state against 12 Psi_e / (ep edp), and the all-to-all bytes per MoE layer.
void print_expert_table(const Args& a, zerotk::DType p) {
  const plan::ExpertShape& x = *a.experts;
  const plan::ExpertModel m = plan::moe_gpt_model(a.shape, x);
  const int ep = static_cast<int>(x.ep), edp = a.data() / ep;
  const std::size_t psi_local = m.experts.total_params();
  std::cout << "experts: " << x.experts << " per block, top-" << x.top_k << ", expert parallel " << ep << " x expert-data "
            << edp << " (data " << a.data() << (a.shape.tensor > 1 ? ", expert-tensor = tensor " + std::to_string(a.shape.tensor) : std::string())
            << "): this rank holds " << x.experts / x.ep << " experts per block, Psi_e = " << psi_local * x.ep << " in all, "
            << psi_local << " here\n";
  std::cout << "model states per rank (" << zerotk::to_string(p) << (p == zerotk::DType::fp32 ? "" : " mixed precision")
            << ", " << (a.settings.optimizer_moments == 1 ? "one optimizer moment (Lion)" : "Adam") << "; dense Psi = "
            << m.dense.total_params() << " over " << a.data() << " data ranks; GB = 1e9 bytes):\n";
  for (int stage = 0; stage <= 3; ++stage) {
    plan::Choice c;
    c.stage = stage;
    c.precision = p;
    const plan::EngineSettings s = for_precision(a.settings, p);
    const plan::MemoryPlan all = plan::expert_model_state_plan(m.dense, m.experts, a.data(), edp, c, s);
    const plan::MemoryPlan dense = plan::model_state_plan(m.dense, a.data(), c, s);
    const auto state = [](const plan::MemoryPlan& q) {
      return q.category_total(MemoryCategory::master32) + q.category_total(MemoryCategory::optimizer_state);
    };
    std::cout << "  stage " << stage << ": " << gb(static_cast<double>(all.model_states())) << " GB  (dense "
              << dense.model_states() << " B, experts " << all.model_states() - dense.model_states()
              << " B, of which master + optimizer state " << state(all) - state(dense) << " B)\n";
  }
  const std::size_t tokens = a.shape.micro_batch * a.shape.sequence /
                             (a.shape.sequence_parallel ? a.shape.tensor : 1);
  const std::uint64_t b = plan::detail::bytes_of(p);
  std::cout << "all-to-all per MoE layer and micro-batch (uniform routing, dropless): 4 T k h b (ep - 1) / ep = "
            << plan::all_to_all_bytes_per_layer(tokens, x.top_k, a.shape.hidden, b, x.ep) << " bytes sent per rank (T = "
            << tokens << " tokens, h = " << a.shape.hidden << ", b = " << b << ")\n";
}

/// --cp: elements sent per rank and layer under each mode (and the mask-aware ring's under a
/// sparse_attention layout), one rank's activations, and the ring's overlap condition.
void print_context_table(const Args& a, zerotk::DType p) {
  plan::ContextShape base = *a.context;
  base.micro_batch = a.shape.micro_batch;
  base.sequence = a.shape.sequence;
  base.hidden = a.shape.hidden;
  base.heads = a.shape.heads;
  std::size_t A = base.a2a;
  if (A == 0) {  // the largest proper divisor of P
    for (std::size_t d = base.cp / 2; d >= 1 && A == 0; --d) {
      if (base.cp % d == 0) A = d;
    }
  }
  std::vector<plan::CpMode> modes;
  if (a.all_cp_modes) {
    modes = {plan::CpMode::a2a, plan::CpMode::p2p};
    if (A > 1) modes.push_back(plan::CpMode::a2a_p2p);
  } else {
    modes = {base.mode};
  }
  const std::uint64_t b = plan::detail::bytes_of(p);
  const std::size_t n = base.sequence / std::max<std::size_t>(1, base.cp);
  std::optional<zerotk::context::BlockLayout> layout;
  bool causal = true;
  if (!a.sparse_attention_file.empty()) {
    zerotk::config::ResolveContext ctx;
    ctx.world_size = a.world;
    ctx.micro_batch_size = static_cast<std::int64_t>(a.shape.micro_batch);
    const zerotk::config::Config cfg = zerotk::config::load_file(a.sparse_attention_file, ctx);
    if (!cfg.sparse_attention) {
      throw zerotk::config_error("has no sparse_attention block", "--sparse-attention", a.sparse_attention_file);
    }
    zerotk::context::SparsityConfig sc = *cfg.sparse_attention;
    sc.heads = static_cast<int>(base.heads);
    causal = sc.unidirectional;
    layout = zerotk::context::make_layout(sc, base.sequence);
  }
  std::cout << "context parallel " << base.cp << " over N = " << base.sequence << " tokens (" << n << " a rank), micro batch "
            << base.micro_batch << ", h = " << base.hidden << ", h_kv = " << base.h_kv() << " ("
            << zerotk::to_string(p) << ", " << b << " bytes an element); sent per rank per layer:\n";
  for (plan::CpMode mode : modes) {
    plan::ContextShape s = base;
    s.mode = mode;
    if (mode == plan::CpMode::a2a_p2p) s.a2a = A;
    const plan::ContextTraffic t = plan::context_traffic(s);
    std::cout << "  " << plan::to_string(mode);
    if (mode == plan::CpMode::a2a_p2p) std::cout << " (a2a " << s.ulysses() << " x ring " << s.ring() << ")";
    std::cout << ": forward " << t.forward() << " elements (" << t.forward() * b << " B; all-to-all " << t.a2a_forward
              << ", ring " << t.ring_forward << "), forward + backward " << t.forward_backward() << " elements ("
              << t.forward_backward() * b << " B)\n";
    if (layout && mode != plan::CpMode::a2a) {
      const std::uint64_t masked = plan::masked_ring_forward(s, *layout, causal);
      std::cout << "    the mask-aware ring under " << a.sparse_attention_file << "'s layout (" << layout->kept() << " of "
                << static_cast<std::size_t>(layout->heads()) * static_cast<std::size_t>(layout->blocks()) *
                       static_cast<std::size_t>(layout->blocks())
                << " blocks kept): forward at most " << masked << " elements a rank (" << masked * b << " B), against the ring's "
                << t.ring_forward << "\n";
    }
  }
  plan::TransformerShape whole = a.shape, mine = a.shape;
  mine.context = a.shape.positions();
  mine.sequence = n;
  const std::size_t all = plan::activation_peak(plan::gpt_model(whole), {}).peak();
  const std::size_t one = plan::activation_peak(plan::gpt_model(mine), {}).peak();
  std::cout << "activations per rank, no checkpointing: " << one << " B with " << n << " tokens (attention scores over one block of "
            << n << " keys at a time, as a blockwise kernel keeps them), against " << all << " B for the whole sequence on one rank ("
            << std::fixed << std::setprecision(2) << static_cast<double>(all) / static_cast<double>(std::max<std::size_t>(1, one))
            << "x)\n";
  std::cout.unsetf(std::ios::floatfield);
  if (a.flops > 0) {
    const double hide = plan::ring_hiding_tokens(base, static_cast<double>(b), a.flops, a.link_bw);
    std::cout << "the ring's transfers hide behind its attention from " << static_cast<std::uint64_t>(std::ceil(hide))
              << " tokens a ring rank ((b h_kv / 2h)(F / BW), F = " << a.flops << " FLOP/s, BW = " << a.link_bw << " B/s):";
    for (plan::CpMode mode : modes) {
      if (mode == plan::CpMode::a2a) continue;
      plan::ContextShape s = base;
      s.mode = mode;
      if (mode == plan::CpMode::a2a_p2p) s.a2a = A;
      const std::size_t per = base.sequence / s.ring();
      std::cout << " " << plan::to_string(mode) << " (" << per << " a ring rank) " << (per >= hide ? "hides" : "does not hide") << ";";
    }
    std::cout << " a2a's all-to-all sits between the projections and attention and hides behind neither\n";
  }
}

void print_deepspeed_estimate(const plan::ModelDescription& m, const Args& a) {
  const int g = a.gpus_per_node ? a.gpus_per_node : a.world;
  if (a.world % g != 0) {
    throw zerotk::config_error("must divide --world (" + std::to_string(a.world) + ")", "--gpus-per-node", std::to_string(g));
  }
  const int nodes = a.world / g;
  const double P = static_cast<double>(m.total_params()), L = static_cast<double>(m.largest_layer_params());
  std::cout << "DeepSpeed's estimators (" << nodes << " node(s) x " << g << " GPU(s); " << P << " params, largest layer "
            << L << "; additional_buffer_factor " << a.buffer_factor << "; GB = 1e9 bytes):\n";
  std::cout << "  estimate_zero2_model_states_mem_needs:\n     per CPU  |  per GPU  | options\n";
  for (const auto& e : plan::deepspeed_zero2_table(P, g, nodes, a.buffer_factor)) {
    std::printf("  %9s GB | %7s GB | %s\n", gb2(e.cpu_bytes).c_str(), gb2(e.gpu_bytes).c_str(), e.options.c_str());
  }
  std::cout << "  estimate_zero3_model_states_mem_needs:\n     per CPU  |  per GPU  | options\n";
  for (const auto& e : plan::deepspeed_zero3_table(P, L, g, nodes, a.buffer_factor)) {
    std::printf("  %9s GB | %7s GB | %s\n", gb2(e.cpu_bytes).c_str(), gb2(e.gpu_bytes).c_str(), e.options.c_str());
  }
}

/// --pp: the stage whose model states are the largest (at stage 0 in fp16: what every configuration
/// scales), with a line saying which and how the layers were cut.
plan::ModelDescription largest_stage(const plan::ModelDescription& m, const Args& a) {
  const auto bounds = plan::stage_bounds(m, a.pipeline, a.partition);
  int best = 0;
  std::size_t most = 0;
  for (int s = 0; s < a.pipeline; ++s) {
    const std::size_t n = plan::stage_model(m, bounds, s).total_params();
    if (n > most) most = n, best = s;
  }
  std::printf("pipeline %d stages (by %s): layers", a.pipeline, a.partition == plan::StagePartition::uniform ? "layer count" : "parameters");
  for (int s = 0; s < a.pipeline; ++s) {
    std::printf(" [%zu, %zu)", bounds[static_cast<std::size_t>(s)], bounds[static_cast<std::size_t>(s) + 1]);
  }
  std::printf("; planning stage %d, the largest (%zu parameters)\n", best, most);
  return plan::stage_model(m, bounds, best);
}

/// --config: the one configuration the DeepSpeed file asks for (its tensor size with it).
int plan_config(plan::ModelDescription m, const Args& a) {
  zerotk::config::ResolveContext ctx;
  ctx.world_size = a.world;
  ctx.micro_batch_size = static_cast<std::int64_t>(a.shape.micro_batch);
  if (a.precisions.size() == 1) ctx.precision = a.precisions.front();  // fills fp16/bf16 "enabled": "auto"
  const zerotk::config::Config cfg = zerotk::config::load_file(a.config_file, ctx);
  if (a.pipeline != 1 && cfg.pipeline.stages != a.pipeline) {
    throw zerotk::config_error("differs from the config's pipeline stages (" + std::to_string(cfg.pipeline.stages) + ")", "--pp",
                               std::to_string(a.pipeline));
  }
  bool rebuilt = false;
  const auto tensor = static_cast<std::size_t>(cfg.tensor_parallel_size);
  if (tensor != a.shape.tensor) {
    if (a.shape.tensor != 1) {
      throw zerotk::config_error("differs from the config's tensor size (" + std::to_string(tensor) + ")", "--tp",
                                 std::to_string(a.shape.tensor));
    }
    if (!a.transformer) {
      throw zerotk::config_error("the config splits the model's tensors, which needs the model as --layers/--hidden/... "
                                 "(it says which tensors split)",
                                 a.config_file + ": tensor_model_parallel_size", std::to_string(tensor));
    }
    plan::TransformerShape shape = a.shape;
    shape.tensor = tensor;
    m = plan::gpt_model(shape);  // whole again: cut below if the config has stages
    rebuilt = true;
  }
  if (cfg.pipeline.stages > 1 && (rebuilt || a.pipeline == 1)) {
    Args staged = a;
    staged.pipeline = cfg.pipeline.stages;
    staged.partition = cfg.pipeline.partition == zerotk::config::PipelinePartition::uniform ? plan::StagePartition::uniform
                                                                                            : plan::StagePartition::parameters;
    m = largest_stage(m, staged);
  }
  const auto& z = cfg.zero_optimization;
  plan::Choice c;
  c.stage = z.stage;
  c.precision = cfg.precision();
  auto target = [](zerotk::config::OffloadDevice d) {
    return d == zerotk::config::OffloadDevice::none  ? plan::OffloadTarget::none
           : d == zerotk::config::OffloadDevice::cpu ? plan::OffloadTarget::cpu
                                                     : plan::OffloadTarget::nvme;
  };
  c.optimizer = target(z.offload_optimizer.device);
  c.param = z.stage == 3 ? target(z.offload_param.device) : plan::OffloadTarget::none;
  plan::EngineSettings s = a.settings;
  s.reduce_bucket_size = z.reduce_bucket_size;  // elements, as the engine takes it
  s.gradient_accumulation_steps = cfg.gradient_accumulation_steps;
  s.grad_accum_fp32 = cfg.grad_accum_dtype.value_or(cfg.precision()) == zerotk::DType::fp32;
  s.sub_group_size = z.sub_group_size;
  s.prefetch_bucket_size = z.stage3.prefetch_bucket_size;
  s.param_persistence_threshold = z.stage3.param_persistence_threshold;
  s.model_persistence_threshold = z.stage3.model_persistence_threshold;
  s.max_live_parameters = z.stage3.max_live_parameters;
  s.max_reuse_distance = z.stage3.max_reuse_distance;
  s.hpz_partition_size = std::max(1, z.stage3.reshard_after_forward.group_size());
  s.optimizer_buffer_count = z.nvme.buffer_count;
  s.param_buffer_count = z.param_nvme.buffer_count;
  s.param_buffer_size = z.param_nvme.buffer_size;
  s.param_max_in_cpu = z.param_nvme.max_in_cpu;
  s.optimizer_pipeline_read = z.nvme.pipeline_read;
  s.optimizer_pipeline_write = z.nvme.pipeline_write;
  if (cfg.optimizer) s.optimizer_moments = cfg.optimizer->kind.moments();  // else --optimizer's (Adam's)
  plan::Budget b;
  b.device_bytes = a.device_mem.value_or(static_cast<std::size_t>(-1));
  b.host_bytes = a.host_mem.value_or(static_cast<std::size_t>(-1));
  const plan::Evaluation e = plan::evaluate(m, cfg.data_parallel_size, c, s, b);
  print_breakdown(e);
  if (!e.memory.refused.empty()) {
    std::cout << "the engine would refuse this configuration: " << e.memory.refused << "\n";
    return 1;
  }
  if (a.device_mem) std::cout << (e.fits ? "fits" : "does NOT fit") << " in the budget\n";
  return e.fits ? 0 : 1;
}

int run(int argc, char** argv) {
  Args a;
  try {
    a = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "zerotk-plan: " << e.message << "\n\n" << kUsage;
    return 2;
  }
  if (a.help) {
    std::cout << kUsage;
    return 0;
  }
  plan::ModelDescription m;
  if (a.params) m = plan::from_total(*a.params);
  else if (!a.layer_params.empty()) m = plan::from_layer_counts(a.layer_params);
  else {
    m = plan::gpt_model(a.shape);  // refuses shapes whose sizes would not fit the arithmetic
    if (m.total_params() > kMaxParams) {
      throw zerotk::config_error("out of range: the transformer's parameters must be in [1, 1e15]",
                                 "--layers, --hidden, --d-ff, --vocab", std::to_string(m.total_params()));
    }
  }

  if (a.pipeline > 1) m = largest_stage(m, a);
  if (!a.config_file.empty()) return plan_config(m, a);
  if (a.ds_estimate) {
    print_deepspeed_estimate(m, a);
    return 0;
  }
  if (!a.device_mem) {
    if (a.precisions.empty()) a.precisions.push_back(zerotk::DType::fp16);
    for (zerotk::DType p : a.precisions) {
      if (a.experts) {
        print_expert_table(a, p);
      } else if (a.context) {
        print_context_table(a, p);
      } else {
        print_zero_table(m, a, p);
      }
    }
    return 0;
  }

  plan::Grid grid;
  if (!a.precisions.empty()) grid.precisions = a.precisions;
  grid.checkpointing = {plan::CheckpointChoice::none(), plan::CheckpointChoice::every(a.checkpoint_every), plan::CheckpointChoice::all()};
  if (a.checkpoint_every == 1) grid.checkpointing = {plan::CheckpointChoice::none(), plan::CheckpointChoice::all()};
  plan::Budget b;
  b.device_bytes = *a.device_mem;
  b.host_bytes = *a.host_mem;
  // One search over every precision, so that fp16 and bf16 share their layouts (plan_all computes
  // each once). The order is that of one search per precision: the cost order ranks precision first.
  const std::vector<plan::Evaluation> all = plan::plan_all(m, a.data(), a.settings, b, grid);
  std::printf("%-78s %10s %10s %10s  %s\n", "configuration (cheapest first)", "device GB", "host GB", "disk GB", "fits");
  const auto best = plan::cheapest_fit(all);
  for (const auto& e : all) {
    std::printf("%-78s %10s %10s %10s  %s%s\n", e.choice.name().c_str(), gb2(static_cast<double>(e.device())).c_str(),
                gb2(static_cast<double>(e.host())).c_str(),
                gb2(static_cast<double>(e.memory.space_total(MemorySpace::disk))).c_str(), e.fits ? "yes" : "no",
                !e.memory.refused.empty()      ? ("  (" + e.memory.refused + ")").c_str()
                : e.memory.approximate.empty() ? ""
                                               : "  (approximate)");
    if (!a.all && e.fits) break;
  }
  if (!best) {
    std::cout << "\nnothing fits in " << gb2(static_cast<double>(b.device_bytes)) << " GB device + "
              << gb2(static_cast<double>(b.host_bytes)) << " GB host per rank\n";
    return 1;
  }
  std::cout << "\ncheapest configuration that fits: " << best->choice.name() << "\n";
  print_breakdown(*best);
  const auto flags = plan::checkpointed_layers(m, best->choice.checkpointing);
  std::int64_t n = 0;
  for (char f : flags) n += f;
  if (best->choice.checkpointing.kind != plan::CheckpointChoice::Kind::none) {
    std::cout << "GPT example: --checkpoint-activations " << best->choice.checkpointing.name() << "\n";
  }
  std::cout << "DeepSpeed config:\n"
            << plan::deepspeed_config_json(best->choice, for_precision(a.settings, best->choice.precision), a.data(),
                                           static_cast<std::int64_t>(a.shape.micro_batch), n,
                                           static_cast<int>(a.shape.tensor))
                   .dump(2)
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zerotk::error& e) {
    std::cerr << "zerotk-plan: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "zerotk-plan: internal error: " << e.what() << "\n";
    return 3;
  }
}
