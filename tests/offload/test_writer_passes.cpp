// The two-pass step through a writer (offload/writer_passes.hpp) with one sub-group of a million
// elements (DeepSpeed's default sub_group_size): pass 1 writes the values of the step
// (kernels::host::fused_adam_values) without changing the state, pass 2 steps the state. Checked on
// Offload<None>'s store (offload/resident.hpp) against the same store stepping in one fused pass
// into memory:
//  - master, m, v and every output element bitwise, over several steps, segments of uneven sizes
//    (the kernel's SIMD tails and thread shares differ from the reference's); the writer sees each
//    element once and one sub-group end per step;
//  - no memory beyond the sub-group's two stagings (4 B per element each);
//  - a write failing near the end leaves master, m, v and the step count as they were, and the
//    next step equals the reference's.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/device/host_ops.hpp"
#include "zerotk/offload/resident.hpp"
#include "zerotk/optim/adam.hpp"

namespace test_writer_passes {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;

namespace {

using HostOps = device::Ops<Host>;
using Opt = Optimizer<AdamW>;
using Store = offload::Resident<Opt, HostOps>;

/// Collects the optimizer's output: out[at + j] := host[j]; counts the writes per element.
struct Recorder {
  using value_type = bfloat16;
  std::vector<bfloat16> out;
  std::vector<int> seen;
  int sub_groups = 0;
  std::size_t fail_at = static_cast<std::size_t>(-1);  // a write reaching this element throws
  explicit Recorder(std::size_t n) : out(n), seen(n) {}
  void write(std::size_t at, const bfloat16* host, std::size_t n) {
    if (at <= fail_at && fail_at < at + n) throw std::runtime_error("injected write failure");
    for (std::size_t j = 0; j < n; ++j) {
      out[at + j] = host[j];
      ++seen[at + j];
    }
  }
  void end_sub_group() { ++sub_groups; }
};

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST_CASE("WriterPasses: a million-element sub-group through a writer has the fused step's bits; a failed write changes nothing") {
  constexpr std::size_t C = std::size_t{1} << 18;
  const std::vector<std::size_t> sizes = {C / 3 + 7, C - 11, 5, C + C / 2 + 3, 9, C / 5};
  std::vector<kernels::Segment> segments;
  std::size_t n = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    segments.push_back(kernels::Segment{n, sizes[t], 0, static_cast<std::uint32_t>(t)});
    n += sizes[t];
  }
  REQUIRE(n > 3 * C);

  OptimizerOptions oo;
  oo.lr = 1e-2;
  oo.weight_decay = 0.1;
  const std::vector<ParamGroup> groups{ParamGroup{oo}};
  HostOps ops;
  MemoryLedger ledger, ref_ledger;
  offload::StoreOptions so;  // sub_group_size: DeepSpeed's default, one sub-group
  so.output_writer = true;
  Store store(ops, &ledger, n, groups, sizes.size(), so);
  Store ref(ops, &ref_ledger, n, groups, sizes.size());
  REQUIRE(store.sub_groups() == 1);
  // The stagings of one sub-group, and nothing else, beside the state.
  CHECK(ledger.live_total(MemorySpace::pinned_host) == 2 * sizeof(float) * n);
  CHECK(ledger.live(MemorySpace::pinned_host, MemoryCategory::other) == 0);
  CHECK(ledger.live(MemorySpace::host, MemoryCategory::other) == 0);

  std::vector<float> init(n);
  for (std::size_t j = 0; j < n; ++j) init[j] = 0.001f * static_cast<float>(j % 1009) - 0.5f;
  store.master_from_host(init.data());
  ref.master_from_host(init.data());

  std::vector<bfloat16> grads(n);
  auto grads_of = [&](int step) {
    for (std::size_t j = 0; j < n; ++j) grads[j] = bfloat16(0.01f * static_cast<float>((j * 7 + static_cast<std::size_t>(step) * 13) % 211) - 1.0f);
  };
  auto no_sums = [](double*, std::size_t) { FAIL("Adam asks for no sums"); };
  auto check_state = [&] {
    CHECK(same_bits(store.master(), ref.master(), n));
    CHECK(same_bits(store.exp_avg().data(), ref.exp_avg().data(), n));
    CHECK(same_bits(store.exp_avg_sq().data(), ref.exp_avg_sq().data(), n));
    CHECK(store.optimizer().step_count() == ref.optimizer().step_count());
  };

  // One step of both stores with the current gradients; the same state and output after it.
  std::vector<bfloat16> ref_out(n);
  auto step_both = [&] {
    Recorder rec(n);
    store.step(0, segments, grads.data(), &rec, 1.0f, no_sums);
    store.commit_step(segments, grads.data(), &rec, 1.0f, no_sums);
    ref.step(0, segments, grads.data(), ref_out.data(), 1.0f, no_sums);
    check_state();
    CHECK(std::memcmp(rec.out.data(), ref_out.data(), n * sizeof(bfloat16)) == 0);
    return rec;
  };
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    grads_of(step);
    const Recorder rec = step_both();
    std::size_t once = 0;
    for (int s : rec.seen) once += s == 1;
    CHECK(once == n);
    CHECK(rec.sub_groups == 1);
  }

  // A write failing near the end: the state, only read by pass 1, stays as it was.
  const std::vector<float> master(store.master(), store.master() + n);
  const std::vector<float> m(store.exp_avg().begin(), store.exp_avg().end()), v(store.exp_avg_sq().begin(), store.exp_avg_sq().end());
  const std::int64_t steps = store.optimizer().step_count();
  grads_of(4);
  {
    Recorder rec(n);
    rec.fail_at = n - 2;
    CHECK_THROWS_WITH(store.step(0, segments, grads.data(), &rec, 1.0f, no_sums), "injected write failure");
    store.abort_step(segments, &rec);
    CHECK(rec.seen[segments.back().offset - 1] == 1);  // the tensors before the last were written
  }
  CHECK(same_bits(store.master(), master.data(), n));
  CHECK(same_bits(store.exp_avg().data(), m.data(), n));
  CHECK(same_bits(store.exp_avg_sq().data(), v.data(), n));
  CHECK(store.optimizer().step_count() == steps);
  // Run again once the cause is gone: the reference's step.
  (void)step_both();
}

}  // namespace test_writer_passes
