// The compiled engine set (zerotk/engines.hpp, src/engines/): an engine type the set compiles,
// linked from zerotk::engines, trains to the same bits as the same templates instantiated in this
// translation unit (the policy's default bucket plus 2 bytes: another type, and the same buckets,
// since the fixture's options set the bucket size at run time). The set's type is named here with its policies in another order
// and a default spelled out: Engine<Ps...> names one type per canonical pack, so that is still the
// compiled one. check_no_engine_code.sh checks, on this file's object, that the set's types were
// not instantiated here and the control was.
#include <doctest/doctest.h>

#include "zerotk/engines.hpp"
// the fixture after engines.hpp: the extern declarations come before any use of the set's types
#include "../engine/engine_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace {

using namespace zerotk;

template <class E>
zt_test::RunResult run(const zt_test::RunConfig& cfg) {
  zt_test::RunResult result;
  comm::run_threads(cfg.world, [&](auto& comm) {
    zt_test::Mlp<bfloat16> model;
    E engine(comm, model, zt_test::engine_options(cfg));
    zt_test::init_model(engine, model, 42);
    zt_test::RunResult mine;
    zt_test::train_steps(engine, model, comm.rank(), cfg, 0, cfg.steps, &mine);
    {
      auto g = engine.gather(model);
      mine.params = model.values();
    }
    if (comm.rank() == 0) result = std::move(mine);
  });
  return result;
}

template <int S>
void compare_stage() {
  zt_test::RunConfig cfg;
  cfg.world = 2;
  cfg.steps = 6;
  cfg.gas = 2;
  cfg.clip = 0.5;
  using Compiled = Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, Precision<bf16>>;  // engines/set.hpp's spelling
  // the same policies in another order, two defaults spelled: the same type, the compiled one
  using Respelled = Engine<Precision<bf16>, Offload<None>, Optimizer<AdamW>, Partitioner<Stage<S>>, Device<Host>>;
  static_assert(std::is_same_v<Compiled, Respelled>);
  // the default bucket (500M elements of 2 bytes) plus 2 bytes: another type, instantiated here;
  // the buckets are the fixture's (EngineOptions::bucket_bytes overrides the policy's)
  using Local = Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, Precision<bf16>, Bucketer<Bytes<1'000'000'002>>>;
  static_assert(!std::is_same_v<Compiled, Local>);
  static_assert(std::is_same_v<typename Compiled::bucketer, Bucketer<Bytes<1'000'000'000>>>);
  const zt_test::RunResult a = run<Respelled>(cfg);
  const zt_test::RunResult b = run<Local>(cfg);
  REQUIRE(a.params.size() == b.params.size());
  REQUIRE(a.losses.size() == static_cast<std::size_t>(cfg.steps));
  CHECK(a.params == b.params);  // bitwise: the same templates, compiled in two places
  CHECK(a.losses == b.losses);
  CHECK(a.norms == b.norms);
  CHECK(a.params != a.initial);  // it trained
}

}  // namespace

TEST_CASE("a compiled engine trains to the bits of the same policies instantiated in the trainer's TU") {
  static_assert(ZEROTK_ENGINES_ADAMW_BF16 == 1, "this test links zerotk::engines with the adamw_bf16 family");
  compare_stage<0>();
  compare_stage<1>();
  compare_stage<2>();
  compare_stage<3>();
}
