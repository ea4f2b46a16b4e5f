// examples/02_gpt/options.hpp: the demo's command-line flags. main.cpp parses them and turns them into
// a DeepSpeed config; train.cpp reads the ones that are not config keys (steps, checkpoints, seeds).
#pragma once

#include <cstdint>
#include <string>

namespace gpt_demo {

struct Options {
  int ranks = 4;
  bool mpi = false;
  int tp = 1;                      ///< --tp: tensor-parallel size (tensor_model_parallel_size); data = ranks / tp
  bool sequence_parallel = false;  ///< --sequence-parallel: with --tp, activations between the tensor regions split by tokens
  int pp = 1;                      ///< --pp: pipeline stages (pipeline_parallelism.num_stages)
  std::string schedule = "1f1b";   ///< --schedule: the pipeline schedule (pipeline_parallelism.schedule)
  bool schedule_given = false;     ///< --schedule was on the command line (else 1f1b, or the config's)
  int stage = 2;
  std::string precision = "bf16";
  std::string config_file;
  bool print_config = false;
  std::string task = "sort";
  int digits = 8;
  std::string text_file;
  int context = 64;
  int layers = 2, d_model = 64, heads = 4;
  int steps = 300, batch = 64, gas = 1, warmup = 30;
  double lr = 3e-3, weight_decay = 0.01, clip = 1.0;
  long long bucket_elements = 50000;
  std::uint64_t seed = 1234;
  int eval_size = 1000;
  std::string csv_dir = "out/gpt_monitor";
  int steps_per_print = 50;
  std::string save_dir, load_dir;  ///< checkpoints (zerotk/checkpoint.hpp); empty: off
  std::string load_tag;            ///< --tag: the checkpoint to load (default: the directory's latest)
  int save_every = 0;              ///< also save every N steps (0: only after the last step)
  bool save_async = false;         ///< write checkpoints while training goes on (commit at the next save)
  std::string checkpoint_activations = "none";  ///< --checkpoint-activations: none, all or every:K blocks
  bool cpu_checkpointing = false;               ///< saved inputs in pinned host memory (DeepSpeed's key)
  std::string offload_optimizer = "none";       ///< offload_optimizer.device: none, cpu (stages 1-3) or nvme (stage 3)
  std::string offload_param = "none";           ///< offload_param.device: none, cpu or nvme (stage 3)
  std::string nvme_path;                        ///< offload_optimizer.nvme_path (and offload_param's): the swap files' directory
  std::int64_t max_in_cpu = 0;                  ///< offload_param.max_in_cpu: elements of the nvme shard kept in memory instead
  bool delayed_param_update = false;            ///< with offload_optimizer cpu: each update lands one step late
  int delayed_param_update_start = 0;           ///< optimizer steps taken immediately first
  std::string optimizer = "adamw";              ///< adamw, lion (stages 1-3, bf16), onebitadam (1-bit Adam), zerooneadam (0/1 Adam) or onebitlamb (1-bit LAMB), stage 0
  int freeze_step = 20;                         ///< onebitadam, onebitlamb: warm-up steps before compression
  int var_freeze_step = 30;                     ///< zerooneadam: last step of the variance phase
  int var_update_scaler = 16;                   ///< zerooneadam: var steps per doubling of the variance interval
  int local_step_scaler = 30;                   ///< zerooneadam: frozen steps per doubling of the sync interval
  int local_step_clipper = 4;                   ///< zerooneadam: longest sync interval
  std::string compress = "none";                ///< gradient_compression: none, topk:RATIO, 2bit or 1bit (stage 0)
  bool huffman = false;                         ///< gradient_compression.huffman_coding
  int topology = 1;                             ///< --topology: communication.topology levels (1 flat, 2 node -> world)
  int ranks_per_node = 0;                       ///< --ranks-per-node: communication.topology.ranks_per_node (0: detected)
  std::string slow_rank;                        ///< --slow-rank R:F: rank R's compute F x as long (empty: none)
  bool quantized_weights = false;               ///< --quantized-weights: zero_quantized_weights (qwZ, stage 3)
  bool quantized_gradients = false;             ///< --quantized-gradients: zero_quantized_gradients (qgZ, stage 3)
  int experts = 0;                              ///< --experts E: each block's MLP a mixture of E experts (0: dense)
  int top_k = 1;                                ///< --top-k: experts per token
  int ep = 1;                                   ///< --ep: expert-parallel size (expert_parallel.autoep_size)
  double capacity = 0;                          ///< --capacity: DeepSpeed's capacity factor (0: --dropless)
  double balance_coef = 0;                      ///< --balance-coef: the Switch balance loss's coefficient (0: none)
  int cp = 1;                                   ///< --cp P: context ranks each sequence splits over (sequence_parallel_size)
  bool cp_given = false;                        ///< --cp was on the command line (--cp 1: ContextAttention's kernel, unsplit)
  std::string cp_mode = "p2p";                  ///< --cp-mode: a2a (Ulysses), p2p (the ring) or a2a+p2p
  bool cp_mode_given = false;
  int a2a = 0;                                  ///< --a2a A: with --cp-mode a2a+p2p, the Ulysses degree (0: the context ranks a node holds)
  std::string sparsity = "none";                ///< --sparsity: none or 2:4 (Sparsity<NofM<2, 4>> on sparse_params)
  int sparse_from = 100;                        ///< --sparse-from: dense steps before the masks (SparsityOptions::start_step)
  std::string sparse_params = "blocks.*.mlp.fc.weight,blocks.*.mlp.proj.weight";  ///< --sparse-params: patterns, comma-separated
  std::string sparse_attention = "none";        ///< --sparse-attention: none, fixed, bigbird or window:W
  int sparse_block = 4;                         ///< --sparse-block: the layout's block (sparse_attention.block)
  bool sparse_block_given = false;
};

}  // namespace gpt_demo
