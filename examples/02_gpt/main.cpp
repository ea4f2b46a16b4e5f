// examples/02_gpt: the flagship demo. A small GPT (gpt.hpp, user code) trained data-parallel with
// zerotk's Engine on N in-process ranks (threads communicator) or under mpirun, configured by
// command-line flags or by the DeepSpeed JSON file a DeepSpeed user already has.
//
//   build/default/examples/02_gpt/zerotk_example_02_gpt                       # 4 ranks, ZeRO-2, bf16
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 0 --precision fp32
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 3 --offload-optimizer cpu --offload-param cpu
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 3 --offload-optimizer nvme --nvme-path /local_nvme
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 3 --offload-optimizer nvme --offload-param nvme --nvme-path /local_nvme
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 0 --optimizer onebitadam --freeze-step 20
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 2 --optimizer lion --lr 1e-3 --weight-decay 0.1
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 0 --precision fp32 --optimizer zerooneadam
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 0 --precision fp32 --lr 8e-3 --optimizer onebitlamb
//   build/default/examples/02_gpt/zerotk_example_02_gpt --stage 0 --precision fp32 --compress topk:0.01 --huffman
//   build/default/examples/02_gpt/zerotk_example_02_gpt --config ds_config.json
//   mpirun -np 2 build/default/examples/02_gpt/zerotk_example_02_gpt --mpi
//
// The flags are turned into a DeepSpeed config (--print-config prints it and exits), so both paths go
// through the same reader and validation; the engine is the compiled engine set's engine for the
// config (zerotk::AnyEngine, zerotk::engines). This file holds the flags and the config; train.cpp the
// training loop (run.hpp).
#include <CLI/CLI.hpp>
#include <unistd.h>  // access(): is --nvme-path writable
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <exception>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <zerotk/config/reader.hpp>
#include <zerotk/context/sparsity.hpp>
#include <zerotk/config/structure.hpp>
#include <zerotk/config/writer.hpp>
#include <zerotk/any_engine.hpp>
#include <zerotk/engine_config.hpp>

#include "communication.hpp"
#include "data.hpp"
#include "evaluate.hpp"
#include "gpt.hpp"
#include "run.hpp"
#include "sparse_engine.hpp"

namespace {

using namespace gpt_demo;

/// --compress as gradient_compression's algorithm and topk_ratio ({"", 0} for none).
struct CompressFlag {
  std::string algorithm;
  double topk_ratio = 0.01;
};
CompressFlag parse_compress(const std::string& flag) {
  if (flag == "none") return {};
  if (flag == "2bit" || flag == "1bit") return {flag, 0.01};
  if (flag.rfind("topk:", 0) == 0) {
    const std::string ratio = flag.substr(5);
    char* end = nullptr;
    const double r = std::strtod(ratio.c_str(), &end);
    if (!ratio.empty() && end == ratio.c_str() + ratio.size() && r > 0.0 && r <= 1.0) return {"topk", r};
  }
  throw zerotk::usage_error("must be none, topk:RATIO with RATIO in (0, 1] (e.g. topk:0.01), 2bit or 1bit", "--compress",
                            flag);
}

/// A JSON string literal of `s` (paths may hold quotes or backslashes).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += esc;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

/// The flags' offload choices, checked before they become a config, so that errors name the flag.
void check_offload_flags(const Options& o) {
  if (o.optimizer == "onebitadam" && o.stage != 0) {
    throw zerotk::usage_error("1-bit Adam runs at ZeRO stage 0 (it compresses the momentum every rank holds in full, in "
                              "place of stage 0's gradient all-reduce); add --stage 0",
                              "--optimizer onebitadam", "--stage " + std::to_string(o.stage));
  }
  if (o.optimizer == "onebitadam" && o.precision == "fp16") {
    throw zerotk::usage_error("this binary builds 1-bit Adam in fp32 and bf16; use --precision fp32 or bf16",
                              "--optimizer onebitadam", "--precision fp16");
  }
  if (o.optimizer == "onebitlamb" && o.stage != 0) {
    throw zerotk::usage_error("1-bit LAMB runs at ZeRO stage 0 (it compresses the momentum every rank holds in full, in "
                              "place of stage 0's gradient all-reduce); add --stage 0",
                              "--optimizer onebitlamb", "--stage " + std::to_string(o.stage));
  }
  if (o.optimizer == "onebitlamb" && o.precision != "fp32") {
    throw zerotk::usage_error("this binary builds 1-bit LAMB in fp32; use --precision fp32", "--optimizer onebitlamb",
                              "--precision " + o.precision);
  }
  if (o.optimizer == "zerooneadam" && o.stage != 0) {
    throw zerotk::usage_error("0/1 Adam runs at ZeRO stage 0 (it all-reduces gradients and updates every rank holds in "
                              "full, in place of stage 0's gradient all-reduce); add --stage 0",
                              "--optimizer zerooneadam", "--stage " + std::to_string(o.stage));
  }
  if (o.optimizer == "zerooneadam" && o.precision != "fp32") {
    throw zerotk::usage_error("this binary builds 0/1 Adam in fp32; use --precision fp32", "--optimizer zerooneadam",
                              "--precision " + o.precision);
  }
  if (o.optimizer == "lion" && (o.stage == 0 || o.precision != "bf16")) {
    throw zerotk::usage_error("this binary builds Lion at stages 1-3 in bf16 (the library takes every stage and "
                              "precision); use --stage 1, 2 or 3 and --precision bf16",
                              "--optimizer lion", "--stage " + std::to_string(o.stage) + " --precision " + o.precision);
  }
  if (o.optimizer == "lion" && (o.offload_param != "none" || o.offload_optimizer == "nvme" ||
                                (o.offload_optimizer == "cpu" && o.stage != 3))) {
    throw zerotk::usage_error("this binary builds Lion without offload, or with --offload-optimizer cpu at stage 3",
                              "--optimizer lion", "--offload-optimizer " + o.offload_optimizer + " --offload-param " +
                                                      o.offload_param + " --stage " + std::to_string(o.stage));
  }
  if (o.compress != "none") {
    (void)parse_compress(o.compress);
    if (o.stage != 0) {
      throw zerotk::usage_error("gradient compression replaces ZeRO stage 0's gradient all-reduce (stages 1-3 "
                                "reduce-scatter into partitions, which no codec does yet); add --stage 0",
                                "--compress " + o.compress, "--stage " + std::to_string(o.stage));
    }
    if (o.precision != "fp32") {
      throw zerotk::usage_error("this binary builds gradient compression in fp32 (the library also takes bf16 and "
                                "fp16); add --precision fp32",
                                "--compress " + o.compress, "--precision " + o.precision);
    }
    if (o.optimizer != "adamw") {
      throw zerotk::usage_error("1-bit Adam, 0/1 Adam and 1-bit LAMB compress their own exchanges already; use "
                                "--optimizer adamw",
                                "--compress " + o.compress, "--optimizer " + o.optimizer);
    }
  }
  if (o.huffman && o.compress == "none") {
    throw zerotk::usage_error("Huffman-codes the payloads of --compress, which is not asked for", "--huffman",
                              "--compress none");
  }
  if (o.max_in_cpu != 0 && o.offload_param != "nvme") {
    throw zerotk::usage_error("keeps part of the NVMe parameter shard in host memory; it needs --offload-param nvme",
                              "--max-in-cpu " + std::to_string(o.max_in_cpu), "--offload-param " + o.offload_param);
  }
  if (o.offload_optimizer == "nvme" && o.nvme_path.empty()) {
    throw zerotk::usage_error("needs --nvme-path DIR, the existing writable directory of the swap files "
                              "(offload_optimizer.nvme_path)",
                              "--offload-optimizer", "nvme");
  }
  if (o.offload_param == "nvme" && o.nvme_path.empty()) {
    throw zerotk::usage_error("needs --nvme-path DIR, the existing writable directory of the parameter shard files "
                              "(offload_param.nvme_path)",
                              "--offload-param", "nvme");
  }
  if (!o.nvme_path.empty() && o.offload_optimizer != "nvme" && o.offload_param != "nvme") {
    throw zerotk::usage_error("is the swap directory of --offload-optimizer nvme or --offload-param nvme, neither of "
                              "which is asked for (--offload-optimizer " + o.offload_optimizer + ")",
                              "--nvme-path", o.nvme_path);
  }
}

/// The swap directory must exist, be a directory and be writable: said here, naming where the path came
/// from, rather than as the swap file's creation error on every rank.
void check_swap_directory(const std::string& dir, const std::string& where) {
  std::error_code ec;
  const auto st = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(st)) {
    throw zerotk::usage_error("the NVMe swap directory does not exist (it is not created: a typo must not put the "
                              "optimizer state on another disk)",
                              where, dir);
  }
  if (!std::filesystem::is_directory(st)) throw zerotk::usage_error("the NVMe swap directory is not a directory", where, dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw zerotk::usage_error(std::string("the NVMe swap directory is not writable (") + std::strerror(errno) + ")", where,
                              dir);
  }
}

/// The flags as the DeepSpeed config a DeepSpeed user would have written.
std::string flags_to_deepspeed_json(const Options& o) {
  const bool fp16 = o.precision == "fp16", bf16 = o.precision == "bf16";
  const bool onebit = o.optimizer == "onebitadam", zero_one = o.optimizer == "zerooneadam";
  const bool onebit_lamb = o.optimizer == "onebitlamb", lion = o.optimizer == "lion";
  std::ostringstream j;
  j << "{\n"
    << "  \"train_batch_size\": " << o.batch << ",\n";
  if (o.tp > 1) j << "  \"tensor_model_parallel_size\": " << o.tp << ",\n";
  if (o.ep > 1) j << "  \"expert_parallel\": {\"enabled\": true, \"autoep_size\": " << o.ep << "},\n";
  if (o.cp > 1) j << "  \"sequence_parallel_size\": " << o.cp << ",\n";
  // --sparse-attention fixed / bigbird: DeepSpeed's block (fixed "unidirectional"; bigbird has no such
  // key, and the kernel masks causally either way); window:W is no mode of that block (DeepSpeed's
  // LocalSlidingWindowSparsityConfig is a class only): the model's.
  if (o.sparse_attention == "fixed") {
    j << "  \"sparse_attention\": {\"mode\": \"fixed\", \"block\": " << o.sparse_block
      << ", \"num_local_blocks\": 4, \"num_global_blocks\": 1, \"attention\": \"unidirectional\"},\n";
  } else if (o.sparse_attention == "bigbird") {
    j << "  \"sparse_attention\": {\"mode\": \"bigbird\", \"block\": " << o.sparse_block
      << ", \"num_random_blocks\": 1, \"num_sliding_window_blocks\": 3, \"num_global_blocks\": 1},\n";
  }
  if (o.pp > 1) {
    j << "  \"pipeline_parallelism\": {\"num_stages\": " << o.pp << ", \"schedule\": " << json_string(o.schedule) << "},\n";
  }
  j << "  \"gradient_accumulation_steps\": " << o.gas << ",\n"
    << "  \"gradient_clipping\": " << o.clip << ",\n"
    << "  \"steps_per_print\": " << o.steps_per_print << ",\n"
    << "  \"fp16\": {\"enabled\": " << (fp16 ? "true" : "false") << ", \"initial_scale_power\": 12},\n"
    << "  \"bf16\": {\"enabled\": " << (bf16 ? "true" : "false") << "},\n"
    << "  \"optimizer\": {\"type\": \"" << (onebit ? "OneBitAdam" : zero_one ? "ZeroOneAdam" : onebit_lamb ? "OneBitLamb" : lion ? "Lion" : "AdamW")
    << "\", \"params\": {\"lr\": " << o.lr;
  // Lion has no eps; betas (0.9, 0.99) are the Lion paper's (DeepSpeed's FusedLion defaults to 0.999).
  if (lion) j << ", \"betas\": [0.9, 0.99], \"weight_decay\": " << o.weight_decay;
  else j << ", \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": " << o.weight_decay;
  if (onebit || onebit_lamb) j << ", \"freeze_step\": " << o.freeze_step;
  if (zero_one) {
    j << ", \"var_freeze_step\": " << o.var_freeze_step << ", \"var_update_scaler\": " << o.var_update_scaler
      << ", \"local_step_scaler\": " << o.local_step_scaler << ", \"local_step_clipper\": " << o.local_step_clipper;
  }
  j << "}},\n"
    << "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": " << o.steps
    << ", \"warmup_num_steps\": " << o.warmup << ", \"warmup_type\": \"linear\", \"cos_min_ratio\": 0.1}},\n"
    << "  \"zero_optimization\": {\"stage\": " << o.stage << ", \"reduce_bucket_size\": " << o.bucket_elements
    << ", \"overlap_comm\": true";
  // Stage 3: this demo's parameters are all below DeepSpeed's persistence threshold (1e5) and would
  // stay gathered; fetch every one and release it after each layer, so sharding shows.
  if (o.stage == 3) j << ", \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": 0";
  if (o.quantized_weights) j << ", \"zero_quantized_weights\": true";
  if (o.quantized_gradients) j << ", \"zero_quantized_gradients\": true";
  if (o.offload_optimizer != "none") {
    j << ", \"offload_optimizer\": {\"device\": \"" << o.offload_optimizer << "\"";
    if (o.offload_optimizer == "nvme") j << ", \"nvme_path\": " << json_string(o.nvme_path);
    j << "}";
  }
  if (o.offload_param != "none") {
    j << ", \"offload_param\": {\"device\": \"" << o.offload_param << "\"";
    if (o.offload_param == "nvme") j << ", \"nvme_path\": " << json_string(o.nvme_path) << ", \"max_in_cpu\": " << o.max_in_cpu;
    j << "}";
  }
  j << "},\n";
  if (o.compress != "none") {
    const CompressFlag c = parse_compress(o.compress);
    j << "  \"gradient_compression\": {\"algorithm\": \"" << c.algorithm << "\"";
    if (c.algorithm == "topk") j << ", \"topk_ratio\": " << c.topk_ratio;
    j << ", \"huffman_coding\": " << (o.huffman ? "true" : "false") << "},\n";
  }
  if (o.checkpoint_activations != "none") {
    j << "  \"activation_checkpointing\": {\"cpu_checkpointing\": " << (o.cpu_checkpointing ? "true" : "false") << "},\n";
  }
  // --topology / --slow-rank: zerotk's communication block. --slow-rank turns the slow-rank detector
  // on with its documented defaults (any slow_node_* key does), so the injected straggler is reported.
  if (o.topology > 1 || !o.slow_rank.empty()) {
    j << "  \"communication\": {";
    if (o.topology > 1) {
      j << "\"topology\": {\"levels\": " << o.topology;
      if (o.ranks_per_node > 0) j << ", \"ranks_per_node\": " << o.ranks_per_node;
      j << "}" << (o.slow_rank.empty() ? "" : ", ");
    }
    if (!o.slow_rank.empty()) j << "\"slow_node_tolerance\": 0.1, \"slow_node_window\": 20, \"slow_node_count\": 3";
    j << "},\n";
  }
  j << "  \"csv_monitor\": ";
  if (o.csv_dir.empty()) {
    j << "{\"enabled\": false}\n";
  } else {
    const std::filesystem::path dir(o.csv_dir);
    j << "{\"enabled\": true, \"output_path\": " << json_string(dir.parent_path().string())
      << ", \"job_name\": " << json_string(dir.filename().string()) << "}\n";
  }
  j << "}\n";
  return j.str();
}

/// Prints rank memory by category beside the ZeRO formula for this stage (16-bit training; K = 12 for
/// the Adam family's master, m and v, K = 8 for Lion's master and m: `moments` is 2 or 1).
/// `sub_group` > 0: the optimizer steps sub-group by sub-group (optimizer offload, or NVMe parameter
/// offload), with two pinned staging buffers of 4 B x min(sub_group, Psi/N) recorded as gradients
/// and parameters (docs/offload.md). `nvme`: Offload<Nvme>, whose master, m and v
/// rows count the two slots in the swap file (24 Psi/N on disk instead of 12 Psi/N in memory).
/// The memory spaces a row of rank 0 lives in: one name, or each space with its bytes. "compute" is
/// where the model computes (the host here; the GPU's memory in a device run).
std::string where_it_lives(const Summary& s, std::size_t category) {
  constexpr const char* kNames[] = {"compute (host)", "pinned host", "compute (device)", "disk"};
  static_assert(std::size(kNames) == zerotk::kMemorySpaceCount);
  std::vector<std::size_t> used;
  for (std::size_t sp = 0; sp < zerotk::kMemorySpaceCount; ++sp) {
    if (s.spaces[sp][category] > 0) used.push_back(sp);
  }
  if (used.empty()) return "-";
  if (used.size() == 1) return kNames[used[0]];
  std::string text;
  for (std::size_t sp : used) text += (text.empty() ? "" : " + ") + std::string(kNames[sp]) + " " + std::to_string(s.spaces[sp][category]);
  return text;
}

/// Below the table: what the spaces mean, and why the params and gradients rows grow under offload.
void explain_spaces(const Summary& s, std::int64_t sub_group, double shard) {
  using C = zerotk::MemoryCategory;
  const auto pinned = [&](C c) { return s.spaces[static_cast<std::size_t>(zerotk::MemorySpace::pinned_host)][static_cast<std::size_t>(c)]; };
  std::printf("  where: compute = the memory the model computes in (the host here, the GPU's on a device); pinned host =\n"
              "  page-locked host memory (what offload keeps and stages in); disk = swap files (NVMe offload)\n");
  if (pinned(C::grads) > 0 && pinned(C::params16) > 0 && sub_group > 0) {
    const double staging = 4.0 * std::min(static_cast<double>(sub_group), shard);
    std::printf("  the pinned parts of the params and gradients rows are the offloaded step's staging (%zu + %zu B):\n"
                "  one sub-group's fp32 gradients copied in and its updated values copied out, 4 B x min(sub_group_size,\n"
                "  Psi/N) = %.0f B each, reused for every sub-group (zero_optimization.sub_group_size)\n",
                pinned(C::grads), pinned(C::params16), staging);
  }
  if (s.spaces[static_cast<std::size_t>(zerotk::MemorySpace::host)][static_cast<std::size_t>(C::other)] > 0) {
    std::printf("  float compute copy: this model computes in float while the engine keeps 16-bit parameters (host\n"
                "  emulation of mixed precision): float copies of the parameters and gradients plus a scratch gradient;\n"
                "  the model's memory, not part of the model states\n");
  }
}

void print_memory_table(const Summary& s, int stage, const std::string& precision, int world, int gas, int accum_bytes,
                        std::int64_t sub_group, bool nvme, bool delayed, int moments) {
  const double pad = static_cast<double>(s.padded), N = s.data;
  const char* names[] = {"params (working precision)", "gradients", "fp32 master",
                         moments == 1 ? "optimizer state (m)" : "optimizer state (m, v)",
                         "bucket buffers", "gathered params (stage 3)", "hpZ secondary shard", "activations", "float compute copy (host)"};
  static_assert(std::size(names) == zerotk::kMemoryCategoryCount);
  if (s.pipeline > 1) {
    std::printf("\nmemory per rank by category (bytes; Psi = %zu parameters on rank 0, its pipeline stage%s of the model's\n"
                "%zu, %zu with bucket padding; N = %d, the data-parallel group ZeRO partitions over: ranks / (tensor %d x\n"
                "pipeline %d)):\n",
                s.psi, s.tensor > 1 ? "'s tensor shard" : "", s.psi_model, s.padded, s.data, s.tensor, s.pipeline);
  } else if (s.tensor > 1) {
    std::printf("\nmemory per rank by category (bytes; Psi = %zu parameters on rank 0, its tensor shard of the model's %zu\n"
                "(the split matrices' 1/%d and every replicated parameter), %zu with bucket padding; N = %d, the\n"
                "data-parallel group ZeRO partitions over: ranks / tensor %d):\n",
                s.psi, s.psi_model, s.tensor, s.padded, s.data, s.tensor);
  } else {
    std::printf("\nmemory per rank by category (bytes; Psi = %zu parameters, %zu with bucket padding; N = %d, the\n"
                "data-parallel group ZeRO partitions over, here every rank):\n",
                s.psi, s.padded, s.data);
  }
  std::printf("  %-28s", "category");
  for (int r = 0; r < world; ++r) std::printf("  %12s", ("rank " + std::to_string(r)).c_str());
  std::printf("  where (rank 0)\n");
  std::size_t model_state = 0;
  for (std::size_t c = 0; c < zerotk::kMemoryCategoryCount; ++c) {
    std::printf("  %-28s", names[c]);
    for (int r = 0; r < world; ++r) std::printf("  %12zu", s.memory[static_cast<std::size_t>(r)][c]);
    std::printf("  %s\n", where_it_lives(s, c).c_str());
    if (c < 4) model_state += s.memory[0][c];
  }
  if (precision == "fp32") {
    std::printf("  model states (rank 0) %zu B. The ZeRO formula assumes 16-bit training; in fp32 zerotk keeps a\n"
                "  separate fp32 master, so params 4 + grads 4 + master 4 + optimizer state %d bytes per element (stage %d).\n",
                model_state, 4 * moments, stage);
    return;
  }
  const double K = 4.0 + 4.0 * moments;  // fp32 master + 4 B per moment
  const double formula = stage == 0   ? (4 + K) * pad
                         : stage == 1 ? 4 * pad + K * pad / N
                         : stage == 2 ? 2 * pad + (2 + K) * pad / N
                                      : (4 + K) * pad / N;
  const std::string k = std::to_string(static_cast<int>(K)), k2 = std::to_string(static_cast<int>(K) + 2),
                    k4 = std::to_string(static_cast<int>(K) + 4);
  const std::string formula_text = stage == 0   ? k4 + " Psi"
                                   : stage == 1 ? "4 Psi + " + k + " Psi/N"
                                   : stage == 2 ? "2 Psi + " + k2 + " Psi/N"
                                                : k4 + " Psi/N";
  // GAS > 1: stages 2 and 3 reduce every micro-step and add the reduced partitions up in an accumulator
  // of the accumulation dtype (data_types.grad_accum_dtype; a DeepSpeed config's default is the training
  // precision); stage 0 keeps one only in fp32 (in 16 bits it accumulates in its flat gradients, as
  // stage 1 always does).
  const int acc = gas <= 1 || stage == 1 ? 0 : accum_bytes == 4 ? 4 : stage == 0 ? 0 : accum_bytes;
  const double extra = stage == 0 ? acc * pad : acc * pad / N;
  std::printf("  model states (rank 0) %zu B  vs ZeRO-%d formula %s = %.0f B", model_state, stage,
              formula_text.c_str(), formula);
  if (acc > 0) {
    std::printf(" + %s accumulator of GAS > 1 %d Psi%s = %.0f B", acc == 4 ? "fp32" : "16-bit", acc, stage == 0 ? "" : "/N",
                formula + extra);
  }
  if (sub_group > 0) {
    const double staging = 2.0 * 4.0 * std::min(static_cast<double>(sub_group), pad / N);
    std::printf(" + sub-group staging 2 x 4 B x min(sub_group_size, Psi/N) = %.0f B", formula + extra + staging);
    // Offload<Nvme> keeps a second slot of master, m and v on disk (a failed step leaves the state as it was).
    const double second_slot = nvme ? K * pad / N : 0;
    if (nvme) std::printf(" + NVMe's second slot %s Psi/N = %.0f B", k.c_str(), formula + extra + staging + second_slot);
    // --delayed-param-update: the gradient snapshot and the delayed values, 4 B x Psi/N each (pinned).
    if (delayed) std::printf(" + delayed update buffers 2 x 4 B x Psi/N = %.0f B", formula + extra + staging + 8 * pad / N);
    // OffloadParams<Nvme>: the shard is its file (two slots of each block not kept in memory, padded
    // to 4096 B) and the blocks kept in host memory (two copies), instead of the 2 Psi/N above.
    if (s.params_disk > 0) {
      const double shard = static_cast<double>(s.params_disk) + static_cast<double>(s.params_in_cpu);
      std::printf(" + parameter shard in its file %zu B + its blocks kept in host memory (max_in_cpu, two copies) "
                  "%zu B - 2 Psi/N = %.0f B",
                  s.params_disk, s.params_in_cpu, formula + extra + staging + second_slot + shard - 2 * pad / N);
    }
  }
  std::printf("\n");
  if (s.params_disk > 0) {
    std::printf("  NVMe parameter shard (rank 0; 2 Psi/N = %.0f B): %zu B on disk (two slots of each block not kept\n"
                "  in memory, padded to 4096 B); %zu B in host memory, two copies of the blocks kept there (--max-in-cpu)\n",
                2 * pad / N, s.params_disk, s.params_in_cpu);
  }
  if (s.params_disk > 0 && !nvme) {
    std::printf("  without an NVMe optimizer state the step writes its values to the shard before it steps master, m\n"
                "  and v in place (a failed shard write then changes nothing; no extra memory)\n");
  }
  if (nvme) {
    std::printf("  NVMe (rank 0): %zu B on disk (two slots of master, m, v: 24 Psi/N = %.0f B); %zu B of pinned swap\n"
                "  buffers (in the last row; per group and buffer 3 x 4 B x min(sub_group_size, group's Psi/N), each part\n"
                "  padded to 4096 B)\n",
                s.disk, 24 * pad / N, s.pinned_other);
  }
}

/// --topology / --quantized-*: what rank 0 sent per link level and through ZeRO++'s exchanges.
void print_links(const LinkFigures& l) {
  const auto u = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
  if (l.hierarchical) {
    std::printf("links (rank 0, whole run; data group %s): %llu B inside the node, %llu B across nodes\n", l.topology.c_str(),
                u(l.intra_node), u(l.inter_node));
  } else if (l.levels > 1) {  // e.g. --topology 2 on one machine without --ranks-per-node: one node was detected
    std::printf("links: the data group is %s, one level holding every rank, so its collectives stay flat\n", l.topology.c_str());
  }
  if (l.qwz) std::printf("ZeRO++ qwZ (rank 0, whole run): %llu B of int8 parameter gathers in %llu calls\n", u(l.qwz_bytes), u(l.qwz_calls));
  if (l.qgz) {
    std::printf("ZeRO++ qgZ (rank 0, whole run): %llu B of int4 gradient reduce-scatters in %llu calls (%llu fell back to "
                "a plain one)\n", u(l.qgz_bytes), u(l.qgz_calls), u(l.qgz_fallbacks));
  }
}

/// --batch must split into whole micro batches over the ranks and --gas: said in flags, with the nearest
/// batches that do, rather than as the config reader's train_batch_size equation (checkpoints load on
/// any rank count, but a batch of 64 does not split over 3 ranks).
std::string ranks_flag(const Options& o, int world) {
  return o.mpi ? "the MPI world size " + std::to_string(world) : "--ranks " + std::to_string(world);
}

/// --tp x --pp must divide the ranks (checked first, whatever else is given).
void check_tp_flag(const Options& o, int world) {
  if (world % (o.tp * o.pp) != 0) {
    throw zerotk::usage_error(o.pp == 1 ? "the tensor size must divide the rank count (each data-parallel replica is --tp ranks)"
                                        : "--tp x --pp must divide the rank count (each data-parallel replica is that many ranks)",
                              o.pp == 1 ? "--tp " + std::to_string(o.tp) : "--tp " + std::to_string(o.tp) + " --pp " + std::to_string(o.pp),
                              ranks_flag(o, world));
  }
}

void check_batch_flags(const Options& o, int world) {
  check_tp_flag(o, world);
  const int data = world / (o.tp * o.pp);
  if (data % o.ep != 0) {  // before the config reader, which would name its key instead of the flag
    throw zerotk::usage_error("must divide the data ranks (" + std::to_string(data) +
                                  "): each block's experts spread over that many data ranks",
                              "--ep " + std::to_string(o.ep), ranks_flag(o, world) + " / (--tp " + std::to_string(o.tp) + " x --pp " + std::to_string(o.pp) + ")");
  }
  if (data % o.cp != 0) {  // the context ranks fold inside the data ranks
    throw zerotk::usage_error("must divide the data ranks (" + std::to_string(data) + "): each replica's sequences split over --cp of them",
                              "--cp " + std::to_string(o.cp), ranks_flag(o, world) + " / (--tp " + std::to_string(o.tp) + " x --pp " + std::to_string(o.pp) + ")");
  }
  // samples per micro-step of all replicas (the context ranks of one read the same samples)
  const long long per_micro = static_cast<long long>(data / o.cp) * o.gas;
  if (o.batch % per_micro == 0) return;
  std::string ranks = o.tp * o.pp > 1 ? ranks_flag(o, world) + " / (--tp " + std::to_string(o.tp) + " x --pp " +
                                            std::to_string(o.pp) + ") (data ranks)"
                                      : ranks_flag(o, world);
  if (o.cp > 1) ranks = "(" + ranks + ") / --cp " + std::to_string(o.cp) + " (replicas)";
  const long long below = o.batch / per_micro * per_micro, above = below + per_micro;
  std::string use = "use --batch ";
  if (below > 0) use += std::to_string(below) + " or ";
  use += std::to_string(above);
  if (o.gas > 1) use += " (or another --gas)";
  throw zerotk::usage_error("is not divisible by " + ranks + " x --gas " + std::to_string(o.gas) + " = " +
                                std::to_string(per_micro) + " (every rank runs the same whole micro batch); " + use,
                            "--batch " + std::to_string(o.batch));
}

/// What a tensor-parallel run needs of the model and the batch, said in flags before any rank starts.
/// The pipeline's virtual stages (stages x chunks per rank) against the model's layers (embedding,
/// blocks, head), when the flag or key is read: each virtual stage holds at least one layer, and the
/// product is taken in 64 bits (issue 57 item 6: interleaved:V with a huge V overflowed).
void check_pipeline_chunks(const Options& o, const zerotk::config::Config& cfg, const gpt::Config& model) {
  if (cfg.pipeline.stages <= 1) return;
  const zerotk::pipeline::ScheduleSpec spec = zerotk::pipeline::ScheduleSpec::parse(cfg.pipeline.schedule);
  const long long virtual_stages = static_cast<long long>(cfg.pipeline.stages) * spec.chunks;
  const long long layers = static_cast<long long>(model.n_layers) + 2;
  if (virtual_stages > layers) {
    throw zerotk::usage_error("the pipeline has more stages x chunks (" + std::to_string(cfg.pipeline.stages) + " x " +
                                  std::to_string(spec.chunks) + " = " + std::to_string(virtual_stages) +
                                  ") than the model has layers (embedding, each block, head: " + std::to_string(layers) +
                                  "); each virtual stage needs one",
                              o.config_file.empty() ? "--schedule" : o.config_file + ": /pipeline_parallelism/schedule",
                              cfg.pipeline.schedule);
  }
}

/// --experts, --top-k, --ep, --capacity against the model, the grid and the flags they meet, said in
/// flags before any rank starts. With --config the file's expert_parallel block decides the size.
void check_expert_flags(const Options& o, const zerotk::config::Config& cfg, const gpt::Config& model) {
  const int ep = cfg.expert_parallel_size;
  const std::string ep_from = o.config_file.empty() ? "--ep " + std::to_string(ep)
                                                    : o.config_file + ": expert_parallel.autoep_size " + std::to_string(ep);
  if (!o.config_file.empty() && o.ep != 1 && o.ep != ep) {
    throw zerotk::usage_error("differs from the config's expert-parallel size (its expert_parallel block decides; drop "
                              "--ep or change the file)",
                              "--ep " + std::to_string(o.ep), ep_from);
  }
  if (model.experts == 0) {
    if (ep > 1) throw zerotk::usage_error("spreads experts over ranks, and the model has none (add --experts E)", ep_from);
    if (o.top_k != 1) throw zerotk::usage_error("routes each token to experts, and the model has none (add --experts E)", "--top-k " + std::to_string(o.top_k));
    if (o.capacity != 0) throw zerotk::usage_error("limits the tokens an expert takes, and the model has none (add --experts E)", "--capacity " + std::to_string(o.capacity));
    if (o.balance_coef != 0) {
      throw zerotk::usage_error("balances the experts' load, and the model has none (add --experts E)", "--balance-coef " + std::to_string(o.balance_coef));
    }
    return;
  }
  const std::string experts = "--experts " + std::to_string(model.experts);
  if (model.top_k > model.experts) {
    throw zerotk::usage_error("routes each token to more experts than there are", "--top-k " + std::to_string(model.top_k), experts);
  }
  if (model.experts % ep != 0) {
    throw zerotk::usage_error("must divide the experts (each rank of an expert group holds E / ep whole experts)", ep_from, experts);
  }
  if (o.sequence_parallel) {
    throw zerotk::usage_error("is not offered with experts: each tensor rank would route a different token set through "
                              "experts that stay whole and equal on every tensor rank",
                              "--sequence-parallel", experts);
  }
  if (cfg.pipeline.stages > 1 && zerotk::pipeline::ScheduleSpec::parse(cfg.pipeline.schedule).kind == zerotk::pipeline::ScheduleKind::zb_h1) {
    throw zerotk::usage_error("defers weight gradients, which the experts compute at once: use 1f1b, gpipe or interleaved:V with experts",
                              "--schedule " + cfg.pipeline.schedule, experts);
  }
}

void check_tensor_flags(const Options& o, const zerotk::config::Config& cfg, const gpt::Config& model) {
  const int t = cfg.tensor_parallel_size;
  const std::string tensor_from = o.config_file.empty() ? "--tp " + std::to_string(t)
                                                        : o.config_file + ": tensor size " + std::to_string(t);
  if (!o.config_file.empty() && o.tp != 1 && o.tp != t) {  // --config replaces the flags: say so rather than drop --tp
    throw zerotk::usage_error("differs from the config's tensor size (its tensor_model_parallel_size or "
                              "tensor_parallel.autotp_size decides; drop --tp or change the file)",
                              "--tp " + std::to_string(o.tp), tensor_from);
  }
  if (!o.config_file.empty() && o.pp != 1 && o.pp != cfg.pipeline.stages) {
    throw zerotk::usage_error("differs from the config's pipeline stages (its pipeline_parallelism.num_stages or "
                              "pipeline.stages decides; drop --pp or change the file)",
                              "--pp " + std::to_string(o.pp), o.config_file + ": pipeline stages " + std::to_string(cfg.pipeline.stages));
  }
  // --schedule is refused where it would be dropped, as --tp and --pp are (issue 57 item 4).
  if (o.schedule_given && !o.config_file.empty()) {
    throw zerotk::usage_error("sets pipeline_parallelism.schedule, which --config replaces: give the schedule in the file",
                              "--schedule " + o.schedule, o.config_file);
  }
  if (o.schedule_given && cfg.pipeline.stages == 1) {
    throw zerotk::usage_error("orders a pipeline's micro-batches, and there is no pipeline (add --pp P, P > 1)",
                              "--schedule " + o.schedule, "--pp " + std::to_string(o.pp));
  }
  if (o.sequence_parallel && t == 1) {
    throw zerotk::usage_error("splits the activations between the tensor regions by tokens, which needs a tensor size "
                              "above 1 (--tp N, or the config's tensor_model_parallel_size)",
                              "--sequence-parallel");
  }
  if (t == 1) return;
  if (model.n_heads % t != 0) {
    throw zerotk::usage_error("the attention heads must divide by the tensor size (each tensor rank computes whole heads)",
                              "--heads " + std::to_string(model.n_heads), tensor_from);
  }
  if (model.mlp_width() % t != 0) {
    throw zerotk::usage_error("the MLP width (4 x --d-model) must divide by the tensor size",
                              "--d-model " + std::to_string(model.d_model), tensor_from);
  }
  // (a context rank's blocks hold 1/P of each sequence)
  const long long tokens = cfg.train_micro_batch_size_per_gpu * static_cast<long long>(model.context / cfg.sequence_parallel_size);
  if (o.sequence_parallel && tokens % t != 0) {
    throw zerotk::usage_error("under sequence parallel each tensor rank takes 1/T of a micro-batch's tokens (micro batch x "
                              "sequence length = " + std::to_string(tokens) + ")",
                              "--sequence-parallel", tensor_from);
  }
}

/// --sparse-attention window:W's W (0 for another value).
int window_blocks(const std::string& flag) {
  if (flag.rfind("window:", 0) != 0) return 0;
  const std::string w = flag.substr(7);
  char* end = nullptr;
  const long v = std::strtol(w.c_str(), &end, 10);
  if (w.empty() || end != w.c_str() + w.size() || v < 1 || v > 1 << 20) {
    throw zerotk::usage_error("must be none, fixed, bigbird or window:W with W >= 1 blocks", "--sparse-attention", flag);
  }
  return static_cast<int>(v);
}

/// The layout the blocks' attention uses: the config's sparse_attention block (the flags' fixed and
/// bigbird, or --config's), or --sparse-attention window:W's sliding window; empty: dense.
std::optional<zerotk::context::SparsityConfig> sparse_layout(const Options& o, const zerotk::config::Config& cfg) {
  if (cfg.sparse_attention) return cfg.sparse_attention;
  if (const int w = window_blocks(o.sparse_attention); w > 0) {
    return zerotk::context::SparsityConfig{.mode = zerotk::context::SparsityMode::local_sliding_window, .block = o.sparse_block,
                                           .unidirectional = true, .num_sliding_window_blocks = w};
  }
  return std::nullopt;
}

/// --cp, --cp-mode, --a2a, --sparse-attention against the config, the model and each other, in
/// flags' words before any rank starts. With --config the file's sequence_parallel_size decides P.
void check_context_flags(const Options& o, const zerotk::config::Config& cfg, const gpt::Config& model) {
  if (o.sparse_attention != "none" && o.sparse_attention != "fixed" && o.sparse_attention != "bigbird" &&
      window_blocks(o.sparse_attention) == 0) {
    throw zerotk::usage_error("must be none, fixed, bigbird or window:W with W >= 1 blocks", "--sparse-attention", o.sparse_attention);
  }
  const int P = cfg.sequence_parallel_size;
  const std::string cp_from = o.config_file.empty() ? "--cp " + std::to_string(P) : o.config_file + ": sequence_parallel_size " + std::to_string(P);
  if (!o.config_file.empty() && o.cp_given && o.cp != P) {
    throw zerotk::usage_error("differs from the config's sequence_parallel_size (the file decides; drop --cp or change the file)",
                              "--cp " + std::to_string(o.cp), cp_from);
  }
  if (!o.config_file.empty() && o.sparse_attention != "none" && window_blocks(o.sparse_attention) == 0) {
    throw zerotk::usage_error("sets the sparse_attention block, which --config replaces: give it in the file (window:W "
                              "is the model's and stays)",
                              "--sparse-attention " + o.sparse_attention, o.config_file);
  }
  if (cfg.sparse_attention && window_blocks(o.sparse_attention) > 0) {
    throw zerotk::usage_error("and the config's sparse_attention block both give the layout: keep one",
                              "--sparse-attention " + o.sparse_attention, o.config_file);
  }
  if (o.cp_mode != "a2a" && o.cp_mode != "p2p" && o.cp_mode != "a2a+p2p") {
    throw zerotk::usage_error("must be a2a, p2p or a2a+p2p", "--cp-mode", o.cp_mode);
  }
  if (P == 1 && o.cp_mode_given) {
    throw zerotk::usage_error("says how a sequence splits over context ranks, and there are none (add --cp P, P > 1)",
                              "--cp-mode " + o.cp_mode, cp_from);
  }
  if (o.a2a != 0 && o.cp_mode != "a2a+p2p") {
    throw zerotk::usage_error("is the Ulysses degree of --cp-mode a2a+p2p", "--a2a " + std::to_string(o.a2a), "--cp-mode " + o.cp_mode);
  }
  if (P > 1 && o.cp_mode == "a2a+p2p" && o.a2a != 0 && P % o.a2a != 0) {
    throw zerotk::usage_error("a2a+p2p needs the Ulysses degree --a2a A dividing the context size (A ranks all-to-all, "
                              "P / A in the ring)",
                              "--a2a " + std::to_string(o.a2a), cp_from);
  }
  const std::string seq = "the sequence length " + std::to_string(model.context) +
                          (o.text_file.empty() ? " (2 x --digits)" : " (--context)");
  if (model.context % P != 0) {
    throw zerotk::usage_error("each context rank holds 1/P of every sequence: P must divide " + seq, cp_from, seq);
  }
  const std::optional<zerotk::context::SparsityConfig> sparse = sparse_layout(o, cfg);
  if (o.sparse_block_given && (!sparse || cfg.sparse_attention && !o.config_file.empty())) {
    throw zerotk::usage_error(sparse ? "is the flags' layout block, and the config's sparse_attention.block decides"
                                     : "is the block of a block-sparse layout, and none is asked for (add --sparse-attention)",
                              "--sparse-block " + std::to_string(o.sparse_block), "--sparse-attention " + o.sparse_attention);
  }
  if (!sparse) return;
  // Each ring rank's tokens (n = T/P under p2p, A n under a2a+p2p, T under a2a) are whole blocks.
  // (a2a+p2p from the nodes: the ring is at most P long, so n divides every ring rank's tokens)
  const int ring = P == 1 || o.cp_mode == "a2a" ? 1 : o.cp_mode == "p2p" || o.a2a == 0 ? P : P / o.a2a;
  const int tokens = model.context / ring;
  if (sparse->block < 1 || tokens % sparse->block != 0) {
    const std::string whose = o.cp_mode == "a2a+p2p" && o.a2a == 0 && P > 1
                                  ? "each context rank's " + std::to_string(tokens) + " tokens (" + seq + " over " + std::to_string(P) +
                                        " context ranks; the ring's ranks hold whole multiples of them)"
                                  : "each ring rank's " + std::to_string(tokens) + " tokens (" + seq + " over a ring of " +
                                        std::to_string(ring) + ")";
    throw zerotk::usage_error("the layout's block must divide " + whose,
                              o.config_file.empty() || !cfg.sparse_attention ? "--sparse-block " + std::to_string(sparse->block)
                                                                            : o.config_file + ": /sparse_attention/block",
                              std::to_string(sparse->block));
  }
  zerotk::context::SparsityConfig c = *sparse;
  c.heads = model.n_heads;
  (void)zerotk::context::make_layout(c, static_cast<std::size_t>(model.context));  // what DeepSpeed refuses, named
}

/// --topology, --ranks-per-node, --slow-rank, --quantized-*: refused in flags' words before the config
/// is read. With --config the file's communication block and zero_optimization keys decide; the
/// flags that would set them are refused rather than dropped (--slow-rank is no config key and stays).
void check_communication_flags(const Options& o, int world) {
  if (!o.config_file.empty()) {
    const char* flag = o.topology != 1 ? "--topology" : o.ranks_per_node != 0 ? "--ranks-per-node"
                     : o.quantized_weights ? "--quantized-weights" : o.quantized_gradients ? "--quantized-gradients" : nullptr;
    if (flag) {
      throw zerotk::usage_error("sets a key of the config, which --config replaces: give communication.topology or "
                                "zero_optimization.zero_quantized_weights / _gradients in the file",
                                flag, o.config_file);
    }
  }
  // --ranks-per-node places the thread ranks on nodes for --topology 2, and for a2a+p2p's Ulysses groups.
  const bool nodes_for_cp = o.cp_mode == "a2a+p2p" && o.a2a == 0;  // (--cp-mode without a context size is refused later)
  if (o.ranks_per_node != 0 && o.topology != 2 && !nodes_for_cp) {
    throw zerotk::usage_error("places the ranks on nodes for --topology 2 (or --cp-mode a2a+p2p without --a2a), which is not asked for",
                              "--ranks-per-node " + std::to_string(o.ranks_per_node), "--topology " + std::to_string(o.topology));
  }
  if (o.ranks_per_node != 0 && world % o.ranks_per_node != 0) {
    throw zerotk::usage_error("must divide the rank count (every node holds the same number of ranks)",
                              "--ranks-per-node " + std::to_string(o.ranks_per_node), ranks_flag(o, world));
  }
  for (const auto& [on, flag] : {std::pair{o.quantized_weights, "--quantized-weights"}, std::pair{o.quantized_gradients, "--quantized-gradients"}}) {
    if (on && o.config_file.empty() && o.stage != 3) {
      throw zerotk::usage_error("is ZeRO++'s, which quantizes stage 3's exchanges; add --stage 3", flag,
                                "--stage " + std::to_string(o.stage));
    }
  }
  if (o.slow_rank.empty()) return;
  const SlowRankFlag slow = parse_slow_rank(o.slow_rank);
  if (slow.rank >= world) {
    throw zerotk::usage_error("names no rank: the ranks are 0 .. " + std::to_string(world - 1), "--slow-rank " + o.slow_rank,
                              ranks_flag(o, world));
  }
}

std::string flag_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// What the example knows for a --config file's "auto" values, as the Hugging Face Trainer fills them
/// from its arguments: the flags (their defaults included) and the model. Only "auto" values read
/// these; a value the file gives wins. `from` gets, per config path, the flags it came from.
zerotk::config::ResolveContext auto_values(const Options& o, int world, const std::string& text,
                                          std::map<std::string, std::string>& from) {
  zerotk::config::ResolveContext rc;
  rc.world_size = world;
  rc.hidden_size = o.d_model;
  from["/zero_optimization/reduce_bucket_size"] = from["/zero_optimization/stage3_prefetch_bucket_size"] =
      from["/zero_optimization/stage3_param_persistence_threshold"] = "--d-model " + std::to_string(o.d_model);
  rc.precision = o.precision == "fp16" ? zerotk::DType::fp16 : o.precision == "bf16" ? zerotk::DType::bf16 : zerotk::DType::fp32;
  from["/fp16/enabled"] = from["/bf16/enabled"] = "--precision " + o.precision;
  rc.gradient_accumulation_steps = o.gas;
  from["/gradient_accumulation_steps"] = "--gas " + std::to_string(o.gas);
  // The data ranks of a config without a tensor size; a file that splits is checked against it by the reader.
  // The file's sequence_parallel_size is read here: the batch triad counts replicas, data / that.
  int sp = 1;
  if (const auto j = zerotk::config::Json::parse(text, nullptr, false);
      j.is_object() && j.contains("sequence_parallel_size") && j["sequence_parallel_size"].is_number_integer()) {
    const auto v = j["sequence_parallel_size"].get<long long>();
    if (v >= 1 && v <= world) sp = static_cast<int>(v);  // else the reader names it
  }
  const int data = world / (o.tp * o.pp);
  const int replicas = data % sp == 0 ? data / sp : data;  // the reader refuses a size that does not divide
  const long long per_micro = static_cast<long long>(replicas) * o.gas;
  const std::string ranks = sp > 1 ? " replicas (data ranks / sequence_parallel_size " + std::to_string(sp) + ")" : " data ranks";
  if (o.batch % per_micro == 0) {  // else an "auto" micro batch is refused in flags' words (check_batch_flags)
    rc.micro_batch_size = o.batch / per_micro;
    from["/train_micro_batch_size_per_gpu"] = "--batch " + std::to_string(o.batch) + " / (" + std::to_string(replicas) +
                                              ranks + " x --gas " + std::to_string(o.gas) + ")";
  }
  from["/train_batch_size"] = "micro batch x --gas x" + ranks;
  rc.lr = o.lr;
  from["/optimizer/params/lr"] = from["/scheduler/params/warmup_max_lr"] = "--lr " + flag_number(o.lr);
  rc.weight_decay = o.weight_decay;
  from["/optimizer/params/weight_decay"] = "--weight-decay " + flag_number(o.weight_decay);
  rc.max_grad_norm = o.clip;
  from["/gradient_clipping"] = "--clip " + flag_number(o.clip);
  rc.total_num_steps = o.steps;
  from["/scheduler/params/total_num_steps"] = "--steps " + std::to_string(o.steps);
  if (o.warmup > 0) {
    rc.warmup_num_steps = o.warmup;
    from["/scheduler/params/warmup_num_steps"] = "--warmup " + std::to_string(o.warmup);
  }
  return rc;
}

/// Reads the config (the flags' or --config's) for `world` ranks. With --config, "auto" values are
/// filled from the flags and each is said on stderr with the flag it came from (stdout stays the
/// run's, or --print-config's JSON alone); so are the config's notes (keys without effect here).
struct ReadConfig {
  zerotk::config::Config cfg;
  bool resolved_auto = false;  ///< some "auto" value was filled in
};
ReadConfig read_config(const Options& o, int world, bool root, const std::string& text) {
  std::map<std::string, std::string> from;
  const zerotk::config::ResolveContext rc = o.config_file.empty() ? zerotk::config::ResolveContext{.world_size = world}
                                                                  : auto_values(o, world, text, from);
  zerotk::config::ParseResult r = zerotk::config::parse(text, rc);
  const std::string source = o.config_file.empty() ? "flags" : o.config_file;
  if (!r.ok()) {
    for (const auto& e : r.errors) {  // a batch "auto" that --batch does not divide into: say it in flags
      if ((e.where() == "/train_micro_batch_size_per_gpu" || e.where() == "/train_batch_size") && e.value() == "\"auto\"") {
        check_batch_flags(o, world);
      }
    }
    throw zerotk::config::summarize(r.errors, source);
  }
  bool resolved_auto = false;
  for (const auto& n : r.notices) {
    std::string line = source + ": " + n.path + ": " + n.message;
    if (n.kind == zerotk::config::Notice::Kind::auto_resolved) {
      resolved_auto = true;
      if (auto f = from.find(n.path); f != from.end()) line += "; from " + f->second;
    }
    if (root) std::fprintf(stderr, "%s\n", line.c_str());
  }
  return {std::move(*r.config), resolved_auto};
}

int run(const Options& o, const gpt::Config& model_config, TrainContext::FillBatch fill_batch,
        TrainContext::Evaluate evaluate, MpiWorld* mpi_world) {
  const int world = o.mpi ? mpi_world->size() : o.ranks;
  check_tp_flag(o, world);
  if (o.config_file.empty()) check_batch_flags(o, world);
  check_communication_flags(o, world);
  const std::string text = o.config_file.empty() ? flags_to_deepspeed_json(o) : zerotk::config::read_text_file(o.config_file);
  const bool root = !o.mpi || mpi_world->rank() == 0;
  const ReadConfig read = read_config(o, world, root, text);
  const zerotk::config::Config& cfg = read.cfg;
  if (o.delayed_param_update_start != 0 && !o.delayed_param_update) {
    throw zerotk::usage_error("delays nothing without --delayed-param-update", "--delayed-param-update-start",
                              std::to_string(o.delayed_param_update_start));
  }
  if (o.delayed_param_update && cfg.zero_optimization.offload_optimizer.device != zerotk::config::OffloadDevice::cpu) {
    throw zerotk::usage_error("runs the host optimizer step of offload_optimizer.device cpu beside the next forward and "
                              "backward; add --offload-optimizer cpu (stages 1-3)",
                              "--delayed-param-update",
                              std::string(o.config_file.empty() ? "--offload-optimizer " : o.config_file + ": offload_optimizer.device ") +
                                  std::string(zerotk::config::to_string(cfg.zero_optimization.offload_optimizer.device)));
  }
  if (o.delayed_param_update && cfg.zero_optimization.offload_param.device == zerotk::config::OffloadDevice::nvme) {
    throw zerotk::usage_error("writes each step's values after its state has stepped, which a failed write to the NVMe "
                              "parameter shard could not undo; use --offload-param cpu or none",
                              "--delayed-param-update",
                              o.config_file.empty() ? "--offload-param nvme" : o.config_file + ": offload_param.device \"nvme\"");
  }
  // The config alone on stdout, then exit, as zerotk-config does: `--print-config > ds.json` writes a
  // file that --config takes. Checked like a run for this world size, except the swap directories,
  // which belong to the machine that will run it.
  if (o.print_config) {
    // A file with "auto" values prints resolved (as zerotk-config does), so that it runs anywhere.
    if (root && read.resolved_auto) {
      std::printf("%s\n", zerotk::config::to_json(cfg).dump(2).c_str());
    } else if (root) {
      std::printf("%s", text.c_str());
    }
    return 0;
  }
  if (cfg.zero_optimization.offload_optimizer.device == zerotk::config::OffloadDevice::nvme) {
    check_swap_directory(cfg.zero_optimization.nvme.path,
                         o.config_file.empty() ? "--nvme-path"
                                               : o.config_file + ": /zero_optimization/offload_optimizer/nvme_path");
  }
  if (cfg.zero_optimization.offload_param.device == zerotk::config::OffloadDevice::nvme) {
    check_swap_directory(cfg.zero_optimization.param_nvme.path,
                         o.config_file.empty() ? "--nvme-path"
                                               : o.config_file + ": /zero_optimization/offload_param/nvme_path");
  }
  check_tensor_flags(o, cfg, model_config);
  check_expert_flags(o, cfg, model_config);
  check_context_flags(o, cfg, model_config);
  check_pipeline_chunks(o, cfg, model_config);
  if (!o.slow_rank.empty() && !cfg.communication.slow_ranks.enabled) {  // --config without a detector
    throw zerotk::usage_error("is reported by the slow-rank detector, which the config leaves off: add a "
                              "communication.slow_node_* key (e.g. \"slow_node_tolerance\": 0.1)",
                              "--slow-rank " + o.slow_rank, o.config_file);
  }
  // The compiled engine the config asks for (zerotk::engines): a config that none fits is refused
  // here, naming its combination and the nearest compiled engines, before any rank starts.
  const bool sparse_weights = o.sparsity != "none";  // --sparsity: an engine the example compiles
  const std::string engine = sparse_weights ? sparse_engine_for(cfg) : zerotk::compiled_engine_for(cfg);
  const int tensor = cfg.tensor_parallel_size, data = cfg.data_parallel_size, stages = cfg.pipeline.stages;
  if (root && stages > 1 && cfg.gradient_accumulation_steps < stages) {  // issue 57 item 5: say why it is slow
    const int m = cfg.gradient_accumulation_steps;
    std::fprintf(stderr,
                 "note: %d pipeline stages with %d micro-batch%s a step: the stages mostly wait for each other "
                 "(1F1B's bubble is (P-1)/(m+P-1) = %.2f of the step); --gas %d or more fills the pipeline\n",
                 stages, m, m == 1 ? "" : "es", double(stages - 1) / double(m + stages - 1), stages);
  }
  if (root) {
    std::string grid;
    if (tensor > 1) grid += ", tensor " + std::to_string(tensor) + (o.sequence_parallel ? " (sequence parallel)" : "");
    if (stages > 1) {
      grid += std::string(grid.empty() ? ", " : " x ") + "pipeline " + std::to_string(stages) + " (" + cfg.pipeline.schedule + ", " +
              std::to_string(cfg.gradient_accumulation_steps) + " micro-batches a step)";
    }
    if (!grid.empty()) grid += " x data " + std::to_string(data);
    if (cfg.expert_parallel_size > 1) grid += std::string(grid.empty() ? ", " : "; ") + "experts over expert parallel " + std::to_string(cfg.expert_parallel_size);
    if (cfg.sequence_parallel_size > 1) {
      grid += std::string(grid.empty() ? ", " : "; ") + "context " + std::to_string(cfg.sequence_parallel_size) +
              " inside data (" + std::to_string(cfg.replica_count()) + " replicas)";
    }
    std::printf("zerotk %s: %d ranks (%s)%s, ZeRO stage %d, %s, batch %lld = %lld micro x %lld accumulation x %d %s\n",
                zerotk::kVersionString, world, o.mpi ? "MPI" : "threads", grid.c_str(), cfg.zero_optimization.stage,
                std::string(zerotk::to_string(cfg.precision())).c_str(), static_cast<long long>(cfg.train_batch_size),
                static_cast<long long>(cfg.train_micro_batch_size_per_gpu),
                static_cast<long long>(cfg.gradient_accumulation_steps), cfg.replica_count(),
                cfg.sequence_parallel_size > 1 ? "replicas" : tensor * stages > 1 ? "data ranks" : "ranks");
    std::printf("engine: %s (%s)\n", engine.c_str(),
                sparse_weights ? "compiled by the example: sparse_engine.cpp" : "the compiled engine set's, zerotk::engines");
    if (sparse_weights) {
      std::printf("sparsity: 2:4 on %s after %d dense steps (masks by magnitude, fixed)\n", o.sparse_params.c_str(),
                  o.sparse_from);
    }
    if (model_config.experts > 0) {
      const int ep = cfg.expert_parallel_size;
      char balance[64] = "";
      if (o.balance_coef > 0) std::snprintf(balance, sizeof balance, ", balance loss x %g", o.balance_coef);
      std::printf("experts: %d per block, top-%d, %s%s; expert parallel %d (%d experts a rank), expert data %d\n",
                  model_config.experts, model_config.top_k,
                  o.capacity > 0 ? ("capacity factor " + std::to_string(o.capacity)).c_str() : "dropless", balance, ep,
                  model_config.experts / ep, data / ep);
    }
  }

  Summary summary;
  summary.memory.resize(static_cast<std::size_t>(world));
  const std::optional<zerotk::context::SparsityConfig> sparse = sparse_layout(o, cfg);
  const bool context_attention = o.cp_given || cfg.sequence_parallel_size > 1 || sparse.has_value();
  if (root && context_attention) {
    const int P = cfg.sequence_parallel_size;
    std::string how = P == 1 ? "unsplit" : "context parallel " + std::to_string(P) + " (" + o.cp_mode;
    if (P > 1 && o.cp_mode == "a2a+p2p") {
      how += o.a2a > 0 ? ": Ulysses " + std::to_string(o.a2a) + " x ring " + std::to_string(P / o.a2a)
                       : ": Ulysses over each node's context ranks x the ring across nodes";
    }
    if (P > 1) how += ", " + std::to_string(model_config.context / P) + " of " + std::to_string(model_config.context) + " tokens a rank)";
    std::string layout = "dense";
    if (sparse) {
      zerotk::context::SparsityConfig c = *sparse;
      c.heads = model_config.n_heads;
      const zerotk::context::BlockLayout l = zerotk::context::make_layout(c, static_cast<std::size_t>(model_config.context));
      char kept[160];
      std::snprintf(kept, sizeof kept, "block-sparse %s (block %d, %zu of %d blocks kept over %d heads)",
                    std::string(zerotk::context::to_string(c.mode)).c_str(), c.block, l.kept(),
                    l.blocks() * l.blocks() * l.heads(), l.heads());
      layout = kept;
    }
    std::printf("attention: %s, %s, causal (zerotk::context's kernel; log-sum-exp kept, no [T][T] probabilities)\n", how.c_str(),
                layout.c_str());
  }
  TrainContext ctx{o, cfg, model_config, std::move(fill_batch), std::move(evaluate)};
  ctx.context_attention = context_attention;
  ctx.sparse = sparse;
  train(ctx, mpi_world, summary);
  if (!root) return 0;
  print_memory_table(summary, cfg.zero_optimization.stage, std::string(zerotk::to_string(cfg.precision())), world,
                     static_cast<int>(cfg.gradient_accumulation_steps),
                     static_cast<int>(zerotk::size_of(cfg.grad_accum_dtype.value_or(cfg.precision()))),
                     cfg.zero_optimization.offload_optimizer.device == zerotk::config::OffloadDevice::none &&
                             cfg.zero_optimization.offload_param.device != zerotk::config::OffloadDevice::nvme
                         ? 0
                         : cfg.zero_optimization.sub_group_size,
                     cfg.zero_optimization.offload_optimizer.device == zerotk::config::OffloadDevice::nvme,
                     o.delayed_param_update,
                     cfg.optimizer ? static_cast<int>(cfg.optimizer->kind.moments()) : 2);
  explain_spaces(summary, cfg.zero_optimization.sub_group_size, static_cast<double>(summary.padded) / summary.data);
  std::printf("activation peak per rank: %zu B (%zu of %d blocks checkpointed, --checkpoint-activations %s)\n",
              summary.activation_peak, summary.checkpointed_blocks, model_config.n_layers, o.checkpoint_activations.c_str());
  std::printf("\ntrained %d steps in %.1f s: %.0f tokens/s; time outside the model's own forward/backward: %.1f%%\n",
              summary.steps_run, summary.seconds, summary.tokens_per_s, 100.0 * summary.overhead);
  // Counted by the communicator (ring convention), every collective of the run included.
  std::printf("communication (rank 0, whole run): %llu B sent; %llu B without compression (ratio %.2f)\n",
              static_cast<unsigned long long>(summary.wire_bytes), static_cast<unsigned long long>(summary.dense_bytes),
              summary.wire_bytes ? static_cast<double>(summary.dense_bytes) / static_cast<double>(summary.wire_bytes) : 1.0);
  print_links(summary.links);
  if (cfg.sequence_parallel_size > 1) {  // the context group's own communicators: not in the figure above
    std::printf("context exchanges (rank 0, whole run: the attention's all-to-alls and ring passes, forward and backward): %llu B\n",
                static_cast<unsigned long long>(summary.context_bytes));
  }
  if (const gpt::ExpertLoad& l = summary.experts; !l.kept.empty()) {
    double kept = 0;
    for (double v : l.kept) kept += v;
    std::printf("experts (every layer and data rank, whole run): %.0f slots routed, %.0f dropped (%.2f%%); load per expert "
                "(share of the kept slots):",
                l.slots, l.dropped, l.slots > 0 ? 100.0 * l.dropped / l.slots : 0.0);
    for (std::size_t e = 0; e < l.kept.size(); ++e) std::printf(" %zu:%.1f%%", e, kept > 0 ? 100.0 * l.kept[e] / kept : 0.0);
    std::printf("\n");
    if (o.balance_coef > 0) {
      std::printf("balance loss (--balance-coef %g x the Switch loss, mean over blocks and micro-batches; not in the printed loss): %.6f\n",
                  o.balance_coef, l.passes > 0 ? l.balance_loss / l.passes : 0.0);
    }
  }
  return 0;
}

/// Runs on `o.ranks` threads, or under MPI with one rank per process. Under MPI one rank's exception
/// must end the whole job (its peers may wait for it inside a collective): MpiSession::abort prints
/// this rank's error, then stops every process.
int start(const Options& o, const gpt::Config& model_config, const TrainContext::FillBatch& fill_batch,
          const TrainContext::Evaluate& evaluate) {
  if (!o.mpi) return run(o, model_config, fill_batch, evaluate, nullptr);
#if ZEROTK_HAS_MPI
  zerotk::comm::MpiSession session;
  MpiWorld world = MpiWorld::world();
  try {
    return run(o, model_config, fill_batch, evaluate, &world);
  } catch (const std::exception& e) {
    if (world.size() > 1) zerotk::comm::MpiSession::abort("rank " + std::to_string(world.rank()) + ": " + e.what());
    throw;
  }
#else
  throw zerotk::usage_error("this binary was built without MPI", "--mpi");
#endif
}
}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"zerotk GPT demo: a small transformer trained with ZeRO on N ranks"};
  app.add_option("--ranks", o.ranks, "in-process ranks (threads communicator)")->check(CLI::Range(1, 64));
  app.add_flag("--mpi", o.mpi, "one rank per MPI process (run under mpirun)");
  app.add_option("--tp", o.tp,
                 "tensor-parallel size (tensor_model_parallel_size): each block's attention heads and MLP split "
                 "Megatron-style across this many adjacent ranks; ZeRO partitions over the data ranks = ranks / tp")
      ->check(CLI::Range(1, 64));
  app.add_option("--pp", o.pp,
                 "pipeline stages (pipeline_parallelism.num_stages): the layers (embedding, blocks, head) split across "
                 "this many ranks, --gas micro-batches a step run through them by --schedule")
      ->check(CLI::Range(1, 64));
  CLI::Option* schedule_flag = app.add_option(
      "--schedule", o.schedule, "with --pp: gpipe, 1f1b, interleaved:V (V chunks a rank) or zbh1 (zero-bubble H1: weight gradients deferred)");
  app.add_flag("--sequence-parallel", o.sequence_parallel,
               "with --tp: the activations between the tensor regions split by tokens (all-gather in, reduce-scatter out)");
  app.add_option("--experts", o.experts,
                 "each block's MLP a mixture of this many experts (router, top-k gating, zerotk::moe's dispatcher)")
      ->check(CLI::Range(0, 256));
  app.add_option("--top-k", o.top_k, "with --experts: experts each token is routed to (gates renormalized when > 1)")
      ->check(CLI::Range(1, 256));
  app.add_option("--ep", o.ep,
                 "with --experts: expert-parallel size (expert_parallel.autoep_size): each block's experts spread over "
                 "this many data ranks, expert parameters' ZeRO over the rest")
      ->check(CLI::Range(1, 64));
  CLI::Option* capacity_flag = app.add_option("--capacity", o.capacity,
                                              "with --experts: DeepSpeed's capacity factor (each expert takes at most "
                                              "ceil(tokens x k / E x factor) of a rank's slots, the rest dropped)")
                                   ->check(CLI::PositiveNumber);
  bool dropless = false;  // the default: the flag says so on the command line
  app.add_flag("--dropless", dropless, "with --experts: keep every routed slot (the default)")->excludes(capacity_flag);
  app.add_option("--balance-coef", o.balance_coef,
                 "with --experts: the Switch Transformer balance loss's coefficient (0: none; DeepSpeed's MoE uses 0.01); "
                 "its gradient joins the router's")
      ->check(CLI::NonNegativeNumber);
  CLI::Option* cp_flag = app.add_option("--cp", o.cp,
                 "context-parallel size (sequence_parallel_size): each sequence splits over this many of a replica's data "
                 "ranks; the blocks' attention crosses them by --cp-mode (--cp 1: the same attention kernel, unsplit)")
      ->check(CLI::Range(1, 64));
  CLI::Option* cp_mode_flag = app.add_option("--cp-mode", o.cp_mode, "with --cp: a2a (DeepSpeed-Ulysses), p2p (the ring; default) or a2a+p2p (Ulysses x ring)")
      ->check(CLI::IsMember({"a2a", "p2p", "a2a+p2p"}));
  app.add_option("--a2a", o.a2a,
                 "with --cp-mode a2a+p2p: the Ulysses degree A (P / A ranks in the ring); default: the context ranks "
                 "each node holds (--ranks-per-node under threads, the MPI processes sharing a host)")
      ->check(CLI::Range(1, 64));
  app.add_option("--sparsity", o.sparsity,
                 "none or 2:4: the weights --sparse-params names trained 2:4 sparse (Sparsity<NofM<2, 4>>, "
                 "docs/sparsity.md) after --sparse-from dense steps; bf16, ZeRO stage 2 or 3")
      ->check(CLI::IsMember({"none", "2:4"}));
  app.add_option("--sparse-from", o.sparse_from, "with --sparsity: dense steps before the masks are chosen")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--sparse-params", o.sparse_params,
                 "with --sparsity: the sparse weights, name patterns ('*' any run of characters), comma-separated");
  app.add_option("--sparse-attention", o.sparse_attention,
                 "block-sparse attention: none, fixed or bigbird (DeepSpeed's sparse_attention block, causal) or window:W "
                 "(a causal sliding window of W blocks); the ring sends only the blocks a rank's queries need");
  CLI::Option* sparse_block_flag = app.add_option("--sparse-block", o.sparse_block, "with --sparse-attention: the layout's block in tokens (sparse_attention.block)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--stage", o.stage, "ZeRO stage")->check(CLI::Range(0, 3));
  app.add_option("--precision", o.precision, "fp32, fp16 (dynamic loss scaling) or bf16")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--config", o.config_file, "a DeepSpeed JSON config (replaces the training flags)")
      ->check(CLI::ExistingFile);
  app.add_flag("--print-config", o.print_config,
               "print the DeepSpeed config in use (the flags' or --config's, checked for this world size) and exit "
               "without training: JSON alone on stdout");
  app.add_option("--task", o.task, "synthetic task: sort or reverse")->check(CLI::IsMember({"sort", "reverse"}));
  app.add_option("--digits", o.digits, "digits per synthetic example")->check(CLI::Range(1, 32));
  app.add_option("--text", o.text_file, "train character-level on this text file instead")->check(CLI::ExistingFile);
  app.add_option("--context", o.context, "sequence length in --text mode")->check(CLI::Range(2, 1024));
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::Range(1, 64));
  app.add_option("--d-model", o.d_model, "model width")->check(CLI::Range(1, 4096));
  app.add_option("--heads", o.heads, "attention heads")->check(CLI::Range(1, 64));
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::Range(1, 10000000));
  app.add_option("--batch", o.batch, "global batch (sequences per optimizer step)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--gas", o.gas, "gradient accumulation steps")->check(CLI::Range(1, 1024));
  app.add_option("--warmup", o.warmup, "warm-up steps of the cosine schedule");
  app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", o.weight_decay, "optimizer.params.weight_decay (decoupled for AdamW and Lion)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--clip", o.clip, "gradient clipping (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--bucket-elements", o.bucket_elements, "reduce_bucket_size in elements")->check(CLI::Range(1LL, 1LL << 40));
  app.add_option("--seed", o.seed, "initialisation and data seed");
  app.add_option("--eval-size", o.eval_size, "held-out sequences for the accuracy");
  app.add_option("--csv", o.csv_dir, "csv_monitor directory (output_path/job_name); empty: off");
  app.add_option("--steps-per-print", o.steps_per_print, "DeepSpeed's steps_per_print")->check(CLI::Range(1, 1 << 30));
  app.add_option("--save", o.save_dir, "checkpoint directory to save into after the last step (and every --save-every)");
  app.add_option("--save-every", o.save_every, "also save every N optimizer steps")->check(CLI::Range(1, 1 << 30));
  app.add_flag("--save-async", o.save_async, "write checkpoints while training goes on; each is committed at the next save");
  app.add_option("--load", o.load_dir,
                 "checkpoint directory to resume from (its latest tag; any rank count that divides --batch)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--tag", o.load_tag, "with --load: the checkpoint tag to load instead of the latest");
  app.add_option("--checkpoint-activations", o.checkpoint_activations,
                 "activation checkpointing (Recompute) of the blocks: none, all or every:K");
  app.add_option("--offload-optimizer", o.offload_optimizer,
                 "offload_optimizer.device: fp32 master and Adam state in pinned host memory (cpu: stages 1-3) or in "
                 "swap files under --nvme-path (nvme: stage 3); this binary: bf16")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}));
  app.add_option("--nvme-path", o.nvme_path,
                 "offload_optimizer.nvme_path (and offload_param.nvme_path): existing writable directory of the swap "
                 "files of --offload-optimizer nvme and --offload-param nvme (one per rank, group and kind, removed at "
                 "exit)");
  app.add_flag("--delayed-param-update", o.delayed_param_update,
               "with --offload-optimizer cpu: ZeRO-Offload's delayed parameter update; the host optimizer step runs "
               "beside the next step's forward and backward, so every update lands one step late (no DeepSpeed key)");
  app.add_option("--delayed-param-update-start", o.delayed_param_update_start,
                 "with --delayed-param-update: optimizer steps taken immediately before the delay begins")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--offload-param", o.offload_param,
                 "offload_param.device: stage 3's parameter shards in pinned host memory (cpu; this binary: bf16, or "
                 "fp32 with --offload-optimizer cpu) or in swap files under --nvme-path (nvme; bf16)")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}));
  app.add_option("--max-in-cpu", o.max_in_cpu,
                 "with --offload-param nvme: offload_param.max_in_cpu, elements of each rank's shard kept in "
                 "pinned host memory instead of the file (the first buckets' blocks that fit whole, two copies each; "
                 "no file I/O for them). 0 here "
                 "puts every block on NVMe only; DeepSpeed's default, 1e9, would keep all of this model in memory")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--optimizer", o.optimizer,
                 "adamw; lion: DeepSpeed's Lion (stages 1-3, bf16; with --offload-optimizer cpu at stage 3): a "
                 "sign update from one moment, so half Adam's optimizer state; wants a smaller --lr (1e-3 "
                 "here against AdamW's 3e-3) and a larger --weight-decay; onebitadam: DeepSpeed's 1-bit Adam (stage 0, fp32 or bf16 in this binary): Adam without "
                 "bias correction for --freeze-step steps, then each rank's momentum is exchanged 1-bit compressed "
                 "with error feedback and the variance frozen; zerooneadam: DeepSpeed's 0/1 Adam (stage 0, fp32): "
                 "variance updates at doubling intervals with 1-bit gradients between them, then local steps with "
                 "1-bit syncs of the accumulated update (--var-freeze-step, --local-step-scaler, ...); onebitlamb: "
                 "DeepSpeed's 1-bit LAMB (stage 0, fp32): LAMB for --freeze-step steps, then the whole model's momentum "
                 "exchanged 1-bit compressed with error feedback, each tensor's step scaled by its averaged trust "
                 "ratio and a variance factor")
      ->check(CLI::IsMember({"adamw", "lion", "onebitadam", "zerooneadam", "onebitlamb"}));
  app.add_option("--freeze-step", o.freeze_step,
                 "with --optimizer onebitadam or onebitlamb: warm-up steps before compression")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--var-freeze-step", o.var_freeze_step,
                 "with --optimizer zerooneadam: last step of the variance phase (then local steps and 1-bit syncs)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--var-update-scaler", o.var_update_scaler,
                 "with --optimizer zerooneadam: variance updates before their interval doubles")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--local-step-scaler", o.local_step_scaler,
                 "with --optimizer zerooneadam: frozen steps before the sync interval doubles")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--local-step-clipper", o.local_step_clipper, "with --optimizer zerooneadam: longest sync interval")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--compress", o.compress,
                 "gradient_compression at stage 0 (fp32 in this binary): topk:RATIO (the largest RATIO of each bucket's "
                 "values), 2bit or 1bit, each with error feedback; every rank gathers the others' payloads");
  app.add_flag("--huffman", o.huffman, "with --compress: Huffman-code every payload (lossless; sent raw where smaller)");
  app.add_flag("--cpu-checkpointing", o.cpu_checkpointing,
               "with --checkpoint-activations: keep the saved inputs in pinned host memory");
  app.add_option("--topology", o.topology,
                 "communication.topology: 1 flat, 2 nodes -> world (the data group's reduce-scatters, all-gathers and "
                 "all-reduces run inside each node first, then across nodes on 1/L of the data); nodes detected (MPI "
                 "shared memory) unless --ranks-per-node says; 3 levels: --config")
      ->check(CLI::Range(1, 2));
  app.add_option("--ranks-per-node", o.ranks_per_node,
                 "with --topology 2: consecutive ranks per node (communication.topology.ranks_per_node); on threads "
                 "the ranks are simulated nodes of that many, under MPI it overrides detection")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--slow-rank", o.slow_rank,
                 "RANK:FACTOR: inject a straggler (no config key): that world rank spins after each step until its "
                 "compute is FACTOR x its own; turns the slow-rank detector on (communication.slow_node_*, tolerance "
                 "0.1, window 20, count 3), whose clock is then each rank's thread CPU time; the progress line names "
                 "the rank from step window x count on");
  app.add_flag("--quantized-weights", o.quantized_weights,
               "zero_quantized_weights (ZeRO++ qwZ, stage 3): the layers' parameter gathers as int8 blocks");
  app.add_flag("--quantized-gradients", o.quantized_gradients,
               "zero_quantized_gradients (ZeRO++ qgZ, stage 3): the gradient reduce-scatter as int4, through "
               "--topology's levels");
  CLI11_PARSE(app, argc, argv);
  o.schedule_given = schedule_flag->count() > 0;
  o.cp_given = cp_flag->count() > 0;
  o.cp_mode_given = cp_mode_flag->count() > 0;
  o.sparse_block_given = sparse_block_flag->count() > 0;
#if defined(__GLIBC__)
  // Activation buffers of checkpointed blocks are freed and allocated again every step. Keep freed
  // memory in the heap for reuse instead of returning it to the kernel and faulting it back in (what
  // PyTorch's caching allocator does for it); the ledger counts the bytes in use either way.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
  try {
    if (o.config_file.empty()) check_offload_flags(o);
    gpt::Config config;
    config.n_layers = o.layers;
    config.d_model = o.d_model;
    config.n_heads = o.heads;
    config.experts = o.experts;
    config.top_k = o.top_k;
    if (o.text_file.empty()) {
      const gpt::DigitTask task(o.task == "sort" ? gpt::DigitTaskKind::sort : gpt::DigitTaskKind::reverse, o.digits,
                                o.seed);
      config.vocab_size = task.vocab_size();
      config.context = task.seq_len();
      const auto fill = [&task](std::uint64_t i, int rank, int world, int micro, gpt::Batch& b) {
        task.fill_batch(i, rank, world, micro, b);
      };
      return start(o, config, fill, [&](const gpt::LogitsOf& logits, Summary& s, bool report) {
        const gpt::DigitScore score = gpt::evaluate_digits(logits, task, 0, o.eval_size);
        if (!report) return score.sequence_accuracy();
        s.accuracy = score.sequence_accuracy();
        s.digit_accuracy = score.digit_accuracy();
        std::printf("task %s %d digits: held-out sequence accuracy %.4f, digit accuracy %.4f (%zu sequences)\n",
                    o.task.c_str(), o.digits, s.accuracy, s.digit_accuracy, score.sequences);
        return s.accuracy;
      });
    }
    const gpt::TextCorpus corpus = gpt::TextCorpus::from_file(o.text_file, o.context, o.seed);
    config.vocab_size = corpus.vocab_size();
    config.context = o.context;
    const auto fill = [&corpus](std::uint64_t i, int rank, int world, int micro, gpt::Batch& b) {
      corpus.fill_batch(i, rank, world, micro, b);
    };
    return start(o, config, fill, [&](const gpt::LogitsOf& logits, Summary& s, bool report) {
      const gpt::TextScore score = gpt::evaluate_text(logits, corpus, static_cast<std::size_t>(o.eval_size));
      if (!report) return score.accuracy;
      s.accuracy = score.accuracy;
      std::printf("text: held-out loss %.4f nats/char, next-char accuracy %.4f (%zu chars)\n", score.loss,
                  score.accuracy, score.positions);
      return s.accuracy;
    });
  } catch (const zerotk::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
