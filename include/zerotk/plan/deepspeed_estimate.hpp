#pragma once
/// \file zerotk/plan/deepspeed_estimate.hpp
/// DeepSpeed's own model-state estimators, as closed forms (deepspeed/runtime/zero/stage_1_and_2.py
/// `estimate_zero2_model_states_mem_needs`, stage3.py `estimate_zero3_model_states_mem_needs`), so a
/// DeepSpeed user can compare zerotk's exact figures with the numbers they know. Bytes; DeepSpeed
/// truncates each result to an integer, as here (std::trunc: the same integer wherever int64 holds
/// it, and no undefined conversion beyond, where a cast to int64 made 1e308 x P a negative size).
///
///   ZeRO-2, offload cpu:  gpu = 2 P                      cpu = P max(4 G, 16) f
///   ZeRO-2, no offload:   gpu = 4 P + int(16 P / G)      cpu = 4 P g f
///   ZeRO-3 (L = 4 x largest layer, n = nodes, g = GPUs per node, G = n g, f = additional_buffer_factor):
///     offload optimizer + params: gpu = L                cpu = P 18/n f (zero_init) | P max(4 g, 18/n) f
///     offload optimizer only:     gpu = L + int(2 P/G)   cpu = P 16/n f (zero_init) | P max(4 g, 16/n) f
///     no offload:                 gpu = L + int(18 P/G)  cpu = largest 4 g f (zero_init) | 4 P g f

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zerotk::plan {

struct DeepSpeedEstimate {
  std::string options;  ///< e.g. "offload_optimizer=cpu"
  double cpu_bytes = 0;
  double gpu_bytes = 0;
};

inline DeepSpeedEstimate deepspeed_zero2_estimate(double total_params, int gpus_per_node, int nodes, bool cpu_offload,
                                                  double additional_buffer_factor = 1.5) {
  const double P = total_params, G = static_cast<double>(gpus_per_node) * nodes, f = additional_buffer_factor;
  DeepSpeedEstimate e;
  e.options = cpu_offload ? "offload_optimizer=cpu" : "offload_optimizer=none";
  if (cpu_offload) {
    e.gpu_bytes = 2 * P;
    e.cpu_bytes = P * std::max(4 * G, 16.0) * f;
  } else {
    e.gpu_bytes = 4 * P + std::trunc(16 * P / G);
    e.cpu_bytes = P * 4 * gpus_per_node * f;
  }
  e.cpu_bytes = std::trunc(e.cpu_bytes);
  e.gpu_bytes = std::trunc(e.gpu_bytes);
  return e;
}

inline DeepSpeedEstimate deepspeed_zero3_estimate(double total_params, double largest_layer_params, int gpus_per_node,
                                                  int nodes, bool cpu_offload, bool cpu_offload_params, bool zero_init,
                                                  double additional_buffer_factor = 1.5) {
  const double P = total_params, G = static_cast<double>(gpus_per_node) * nodes, f = additional_buffer_factor;
  const double per_node = 1.0 / nodes, g = gpus_per_node, largest = 4 * largest_layer_params;
  auto trunc = [](double v) { return std::trunc(v); };
  DeepSpeedEstimate e;
  e.options = std::string("offload_param=") + (cpu_offload && cpu_offload_params ? "cpu" : "none") +
              ", offload_optimizer=" + (cpu_offload ? "cpu" : "none") + ", zero_init=" + (zero_init ? "1" : "0");
  if (cpu_offload && cpu_offload_params) {
    e.gpu_bytes = largest;
    e.cpu_bytes = zero_init ? P * 18 * per_node * f : P * std::max(4 * g, 18 * per_node) * f;
  } else if (cpu_offload) {
    e.gpu_bytes = largest + trunc(2 * P / G);
    e.cpu_bytes = zero_init ? P * 16 * per_node * f : P * std::max(4 * g, 16 * per_node) * f;
  } else {
    e.gpu_bytes = largest + trunc(18 * P / G);
    e.cpu_bytes = zero_init ? largest_layer_params * 4 * g * f : P * 4 * g * f;
  }
  e.cpu_bytes = trunc(e.cpu_bytes);
  e.gpu_bytes = trunc(e.gpu_bytes);
  return e;
}

/// Every row DeepSpeed's `*_all_cold` printers show: ZeRO-2 with and without cpu offload, ZeRO-3
/// with (offload_param, offload_optimizer) in {(cpu, cpu), (none, cpu), (none, none)} x zero_init.
inline std::vector<DeepSpeedEstimate> deepspeed_zero2_table(double P, int gpus_per_node, int nodes, double f = 1.5) {
  return {deepspeed_zero2_estimate(P, gpus_per_node, nodes, true, f), deepspeed_zero2_estimate(P, gpus_per_node, nodes, false, f)};
}
inline std::vector<DeepSpeedEstimate> deepspeed_zero3_table(double P, double largest, int gpus_per_node, int nodes,
                                                            double f = 1.5) {
  std::vector<DeepSpeedEstimate> out;
  for (bool off : {true, false})
    for (bool off_params : {true, false}) {
      if (!off && off_params) continue;
      for (bool init : {true, false}) out.push_back(deepspeed_zero3_estimate(P, largest, gpus_per_node, nodes, off, off_params, init, f));
    }
  return out;
}

}  // namespace zerotk::plan
