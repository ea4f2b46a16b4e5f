// zerotk_export_sample OUT_DIR: trains the test MLP (fp32, ZeRO stage 2, 3 ranks on threads: every
// tensor's elements spread over several ranks' partitions), saves OUT_DIR/ckpt, and writes beside
// it the reference dump (format: the top of read_safetensors.py) of the weights the engine gathered
// into rank 0's model: what `zerotk-ckpt export` must write. The CTests checkpoint_export_* then
// run the export and read_safetensors.py (export_test.sh).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "../engine/engine_fixture.hpp"
#include "reference_dump.hpp"
#include "zerotk/checkpoint.hpp"
#include "zerotk/comm/threads.hpp"

namespace {

using namespace zerotk;
using namespace zt_test;

int run(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  io::create_directories(dir);
  RunConfig cfg;
  cfg.world = 3;
  using E = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp32>>;
  ReferenceDump ref;
  comm::run_threads(cfg.world, [&](auto& comm) {
    Mlp<float> model;
    E engine(comm, model, engine_options(cfg));
    model.init(42);
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 2, nullptr);
    checkpoint::save(engine, comm, dir / "ckpt");
    if (comm.rank() != 0) return;
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{{"format", "pt"},
                                                                              {"zerotk_global_steps", "2"},
                                                                              {"zerotk_stage", "2"},
                                                                              {"zerotk_tag", "global_step2"},
                                                                              {"zerotk_world_size", "3"}}) {
      ref.metadata(k, v);
    }
    for (auto& l : model.layers) {
      for (auto* p : {&l.w, &l.b}) {
        std::vector<std::uint64_t> shape(p->shape().begin(), p->shape().end());
        ref.tensor(p->name(), "F32", shape, le_bytes(std::span<const float>(p->data(), p->numel())));
      }
    }
  });
  ref.write(dir, "weights");
  std::printf("saved %s and the reference dump %s\n", (dir / "ckpt").string().c_str(), (dir / "weights.ref.txt").string().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zt_test::sample_main(argc, argv, run); }
