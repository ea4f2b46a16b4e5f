// The GPT example under zerotk's Engine: the same seed trained with stages 0, 1, 2 and 3 (threads,
// fp32, and bf16 emulated over the model's float Params) gives bitwise-identical losses and
// parameters, and the tied head works through external_parameters at stages 2 and 3 (the head writes
// into wte's gradient before the embedding's scope).
#include <doctest/doctest.h>

#include <vector>

#include "gpt_engine_train.hpp"

namespace test_gpt_engine {  // the file's own names, apart from its suite's other files in a unity build

namespace {

using gpt_test::Trace;

template <int Stage, class Prec = zerotk::fp32>
Trace train(bool tied, int world, int steps) {
  gpt::Config c;
  c.vocab_size = 11;
  c.context = 8;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 2;
  c.tied_head = tied;
  return gpt_test::train_engine<Stage, Prec>(c, world, steps);
}

}  // namespace

TEST_CASE_TEMPLATE("GPT: stages 0, 1, 2 and 3 give bitwise-identical losses and parameters (threads)", Prec,
                   zerotk::fp32, zerotk::bf16) {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const Trace a = train<0, Prec>(false, world, 8);
    CHECK(a.losses.back() < a.losses.front());  // it learns
    const Trace b1 = train<1, Prec>(false, world, 8);
    const Trace b2 = train<2, Prec>(false, world, 8);
    const Trace b3 = train<3, Prec>(false, world, 8);
    CHECK(a.losses == b1.losses);
    CHECK(a.params == b1.params);
    CHECK(a.losses == b2.losses);
    CHECK(a.params == b2.params);
    CHECK(a.losses == b3.losses);
    CHECK(a.params == b3.params);
  }
}

TEST_CASE_TEMPLATE("GPT with a tied head trains at stages 2 and 3 (external_parameters) like stage 0", Prec,
                   zerotk::fp32, zerotk::bf16) {
  const Trace a = train<0, Prec>(true, 2, 8);
  const Trace b = train<2, Prec>(true, 2, 8);
  const Trace c = train<3, Prec>(true, 2, 8);
  CHECK(a.losses == b.losses);
  CHECK(a.params == b.params);
  CHECK(a.losses == c.losses);
  CHECK(a.params == c.params);
}

}  // namespace test_gpt_engine
