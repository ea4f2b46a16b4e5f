#pragma once
/// \file zerotk/checkpoint/save_16bit.hpp
/// The model's full working-precision weights as one safetensors file, written by one rank while
/// training runs: DeepSpeed's `save_16bit_model`, which its `stage3_gather_16bit_weights_on_model_save`
/// key enables at stage 3. Works at every stage (stages 0-2 hold the values already).
///
///   zerotk::checkpoint::save_16bit_model(engine, model, comm, "out/model.safetensors");
///
/// Collective: every rank calls it. It opens `engine.gather(model)` (stage 3: every bucket gathered
/// on every rank for the duration, 2 bytes per parameter more per rank for fp16/bf16), rank
/// `writer_rank` streams each Param's values in the model's visiting order, names and shapes as the
/// model declares them, in the precision the engine keeps each in (Engine::stored_dtypes: the
/// training precision, fp32 for parameters kept in fp32; float Params over 16-bit storage hold
/// values already rounded to it and are written as such). The file appears complete or not at all; a failure on
/// the writing rank reaches every rank as an error (checkpoint/agree.hpp), so no rank goes on
/// believing the model was saved. No libxxhash needed.

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/checkpoint/agree.hpp"
#include "zerotk/checkpoint/settle.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/engine/api.hpp"
#include "zerotk/io/safetensors.hpp"

namespace zerotk::checkpoint {

template <TrainingEngine E, Module M, HostCommunicator C>
void save_16bit_model(E& engine, M& model, C& comm, const std::filesystem::path& file, int writer_rank = 0) {
  if (writer_rank < 0 || writer_rank >= comm.size()) {
    throw usage_error("writer_rank must name a rank of the communicator", "save_16bit_model",
                      std::to_string(writer_rank) + " of " + std::to_string(comm.size()));
  }
  if constexpr (requires { engine.grid_place(); }) {
    const auto& place = engine.grid_place();
    if (place.tensor_size > 1 || place.pipeline_size > 1) {  // the same answer on every rank: no collective left waiting
      throw usage_error("with a tensor or pipeline size above 1 each rank holds part of the model (its shards, its "
                        "stage's layers), and this writes one rank's: save a checkpoint (checkpoint::save(engine, grid, "
                        "dir)) and export it, which puts the whole model together (checkpoint::export_safetensors, "
                        "zerotk-ckpt export)",
                        "save_16bit_model",
                        "tensor size " + std::to_string(place.tensor_size) + ", pipeline size " + std::to_string(place.pipeline_size));
    }
    if (place.expert_params && place.experts_apart()) {
      throw usage_error("with expert parallelism each rank holds some of the experts, and this writes one rank's: "
                        "checkpoints that put the experts together are not written yet (issue 58)",
                        "save_16bit_model", "expert size " + std::to_string(place.expert_size));
    }
  }
  const std::vector<DType> stored = engine.stored_dtypes();
  detail::settle(engine);  // the model saved is the master's, the last update included
  auto scope = engine.gather(model);
  agreed(comm, "save_16bit_model", [&] {
    if (comm.rank() != writer_rank) return;
    std::vector<io::TensorInfo> tensors;
    model.parameters([&](std::string_view name, auto& p) {
      io::TensorInfo t{std::string(name), stored[tensors.size()], {}};
      if constexpr (requires { p.shape(); }) {
        for (auto d : p.shape()) t.shape.push_back(static_cast<std::uint64_t>(d));
      } else {
        t.shape = {static_cast<std::uint64_t>(p.numel())};
      }
      tensors.push_back(std::move(t));
    });
    io::SafetensorsWriter out(file, std::move(tensors), {{"format", "pt"}, {"written_by", "zerotk save_16bit_model"}});
    std::size_t i = 0;
    model.parameters([&](std::string_view, auto& p) {
      using V = typename std::remove_cvref_t<decltype(p)>::value_type;
      const std::size_t n = static_cast<std::size_t>(p.numel());
      if (dtype_of_v<V> == stored[i]) {
        out.write(i, std::as_bytes(std::span<const V>(p.data(), n)));
      } else if constexpr (std::is_same_v<V, float>) {
        out.write_from_fp32(i, std::span<const float>(p.data(), n));  // emulated: values already rounded
      } else {
        throw usage_error("a Param's element type differs from what the engine stores", "save_16bit_model",
                          std::string(p.name()));
      }
      ++i;
    });
    out.finish();
  });
}

}  // namespace zerotk::checkpoint
