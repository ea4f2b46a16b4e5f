// save_16bit_model: the model's full weights from a running engine, in the precision the engine
// keeps them, written by one rank. The file's data area must be exactly the bytes the Params hold
// inside a gather scope, in visiting order, at stage 3 (sharded) as at stage 2; a failure on the
// writing rank reaches every rank.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/io/bytes.hpp"

namespace test_save_16bit {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

/// Trains a few steps, saves, and compares the file with the Params' bytes in a gather scope.
template <int S, class Prec, class Model>
void check_saved(int world, const std::string& expect_dtype) {
  ScratchDir dir("save16");
  const auto file = dir / "model.safetensors";
  RunConfig cfg;
  cfg.world = world;
  std::vector<std::byte> expected;
  std::string names;
  comm::run_threads(world, [&](auto& comm) {
    using E = Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, Precision<Prec>>;
    Model model;
    EngineOptions o = engine_options(cfg);
    o.stage3.param_persistence_threshold = 0;
    E engine(comm, model, o);
    {
      auto g = engine.gather(model, 0);
      model.init(7);
    }
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 3, nullptr);
    checkpoint::save_16bit_model(engine, model, comm, file);
    auto g = engine.gather(model);  // collective: on every rank
    if (comm.rank() != 0) return;
    model.parameters([&](std::string_view name, auto& p) {
      using V = typename std::remove_cvref_t<decltype(p)>::value_type;
      for (std::size_t i = 0; i < p.numel(); ++i) {
        if constexpr (std::is_same_v<V, float>) {  // emulated: the file holds the 16-bit storage
          const auto h = from_float<typename Prec::storage>(p.data()[i]);
          const auto* b = reinterpret_cast<const std::byte*>(&h);
          expected.insert(expected.end(), b, b + sizeof h);
        } else {
          const auto* b = reinterpret_cast<const std::byte*>(p.data() + i);
          expected.insert(expected.end(), b, b + sizeof(V));
        }
      }
      names += std::string(name) + " ";
    });
  });
  const std::vector<std::byte> bytes = read_file(file);
  REQUIRE(bytes.size() > 8);
  io::ByteReader r(std::span<const std::byte>(bytes).first(8), "file");
  const auto header = r.get<std::uint64_t>("header length");
  REQUIRE(8 + header + expected.size() == bytes.size());
  const std::string json(reinterpret_cast<const char*>(bytes.data()) + 8, header);
  INFO(json);
  CHECK(json.find("\"fc0.weight\":{\"dtype\":\"" + expect_dtype + "\",\"shape\":[17,13]") != std::string::npos);
  CHECK(json.find("\"fc2.bias\"") != std::string::npos);
  CHECK(std::memcmp(bytes.data() + 8 + header, expected.data(), expected.size()) == 0);
}

}  // namespace

TEST_CASE("save_16bit_model writes the gathered working-precision weights (stage 3 and 2, fp16, emulated bf16)") {
  check_saved<3, fp16, Mlp<half>>(2, "F16");
  check_saved<3, fp16, Mlp<half>>(3, "F16");
  check_saved<2, fp16, Mlp<half>>(2, "F16");
  check_saved<3, bf16, Mlp<float>>(2, "BF16");  // float Params over bf16 storage: written as bf16
  check_saved<3, fp32, Mlp<float>>(2, "F32");
}

TEST_CASE("save_16bit_model: a failure on the writing rank reaches every rank, and nothing is left behind") {
  ScratchDir dir("save16_fail");
  const auto file = dir / "missing" / "model.safetensors";  // the directory does not exist
  std::vector<std::string> errors(2);
  comm::run_threads(2, [&](auto& comm) {
    using E = Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>>;
    Mlp<half> model;
    EngineOptions o;
    o.stage3.param_persistence_threshold = 0;
    E engine(comm, model, o);
    try {
      checkpoint::save_16bit_model(engine, model, comm, file);
    } catch (const error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
    CHECK(model.layers[0].w.data() == nullptr);  // the gather scope closed
  });
  INFO(errors[0]);
  INFO(errors[1]);
  CHECK(errors[0].find("missing") != std::string::npos);  // the writer's own error names the path
  CHECK(errors[1].find("save_16bit_model failed on rank 0") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(file));
  CHECK_THROWS_AS(comm::run_threads(1, [&](auto& comm) {
                    Mlp<half> model;
                    Engine<Partitioner<Stage<3>>, Optimizer<AdamW>, Precision<fp16>> engine(comm, model, EngineOptions{});
                    checkpoint::save_16bit_model(engine, model, comm, dir / "x.safetensors", 1);
                  }),
                  usage_error);
}

}  // namespace test_save_16bit
