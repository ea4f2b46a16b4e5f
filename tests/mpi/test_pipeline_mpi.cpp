// Point-to-point with tags and the pipeline executor on the MPI back end (np 2, 3, 4): the world
// is one pipeline; results and virtual-clock figures as on threads (tests/pipeline/test_pipeline.cpp).
// Only CHECKs (no REQUIREs): a rank must never skip a collective the others will call.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "../pipeline/toy_model.hpp"
#include "zerotk/comm.hpp"
#include "zerotk/pipeline.hpp"

namespace test_pipeline_mpi {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using comm::MpiCommunicator;

namespace {

MpiCommunicator& pipe_world() {
  static MpiCommunicator w = MpiCommunicator::world();
  return w;
}

}  // namespace

TEST_CASE("mpi: send/recv are non-blocking, matched per tag in posting order; different tags complete independently") {
  MpiCommunicator& c = pipe_world();
  const int r = c.rank(), w = c.size();
  const int next = (r + 1) % w, prev = (r + w - 1) % w;
  // Each rank posts four sends to the next rank before any receive: tags 1, 2, 5, 5.
  const std::int32_t out[4] = {10 * r + 1, 10 * r + 2, 10 * r + 5, 10 * r + 6};
  std::vector<comm::Work> sends;
  for (int k = 0; k < 4; ++k) sends.push_back(c.send(&out[k], 1, DType::int32, next, k < 2 ? k + 1 : 5));
  // The receiver takes tag 5 first (both of its messages, in posting order), then 2, then 1.
  std::int32_t five_a = -1, five_b = -1, two = -1, one = -1;
  comm::Work ra = c.recv(&five_a, 1, DType::int32, prev, 5);
  comm::Work rb = c.recv(&five_b, 1, DType::int32, prev, 5);
  c.recv(&two, 1, DType::int32, prev, 2).wait();
  c.recv(&one, 1, DType::int32, prev, 1).wait();
  rb.wait();
  ra.wait();
  for (auto& s : sends) s.wait();
  CHECK(five_a == 10 * prev + 5);
  CHECK(five_b == 10 * prev + 6);
  CHECK(two == 10 * prev + 2);
  CHECK(one == 10 * prev + 1);
}

TEST_CASE("mpi: the pipeline executor gives the serial run's gradients, and on a virtual clock the simulator's figures") {
  MpiCommunicator& c = pipe_world();
  const int p = c.size();
  for (std::string_view spec : {"gpipe", "1f1b", "interleaved:2", "zbh1"}) {
    CAPTURE(spec);
    const int m = 2 * p;
    const pipeline::Schedule s = pipeline::make_schedule(pipeline::ScheduleSpec::parse(spec), p, m);
    const zt_test::Serial want = zt_test::serial_reference(s.virtual_stages(), m);
    pipeline::CostModel costs;
    costs.forward = 2;
    costs.transfer = 1;
    pipeline::Executor exec(c, s, {.virtual_clock = costs});
    zt_test::ToyRank me(s, c.rank());
    pipeline::StageFunctions f = me.functions();
    const pipeline::StepResult res = exec.run(f);
    for (int k = 0; k < s.chunks; ++k) {
      CHECK(me.chunks[static_cast<std::size_t>(k)].grad == want.grads[static_cast<std::size_t>(s.virtual_stage(c.rank(), k))]);
    }
    if (c.rank() == p - 1) CHECK(res.losses == want.losses);
    CHECK(res.figures == static_cast<const pipeline::Figures&>(pipeline::simulate(s, costs)));
  }
}

}  // namespace test_pipeline_mpi
