// Host fused Adam/AdamW drivers against a serial loop over the per-element formula (tested against
// fp64 in test_elementwise.cpp): bit for bit, for every ISA build, 1-3 threads, every gradient and
// working-copy type, odd sizes and unaligned starts, and the multi-tensor forms.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernel_test_util.hpp"
#include "zerotk/kernels/host/adam.hpp"

using namespace zerotk;
using namespace zerotk::kernels;
using zerotk::test::Isa;

namespace {

template <class G, class P>
struct Combo {
  using grad = G;
  using out = P;  // void: no working copy
};

struct State {
  std::vector<float> p, m, v;
};

State make_state(std::size_t n, std::uint64_t seed) {
  State s{test::randn(n, seed), test::randn(n, seed + 1, 0.1f), test::randn(n, seed + 2, 0.01f)};
  for (auto& x : s.v) x = std::fabs(x);
  return s;
}

// The reference: the per-element formula in a plain serial loop.
template <class G, class P>
void reference(State& s, const G* g, P* out, std::size_t n, const AdamStepConsts& k, float scale) {
  for (std::size_t i = 0; i < n; ++i) {
    adam_update(s.p[i], s.m[i], s.v[i], to_float(g[i]) * scale, k);
    if constexpr (!std::is_void_v<P>) out[i] = from_float<P>(s.p[i]);
  }
}

AdamHyper hyper(bool adamw, bool bc) {
  AdamHyper h;
  h.lr = 3e-3f;
  h.weight_decay = 0.05f;
  h.adamw_mode = adamw;
  h.bias_correction = bc;
  return h;
}

}  // namespace

TEST_CASE_TEMPLATE("fused_adam equals the serial formula bit for bit", C, Combo<float, void>, Combo<float, float>,
                   Combo<float, half>, Combo<float, bfloat16>, Combo<half, half>, Combo<half, void>,
                   Combo<bfloat16, bfloat16>, Combo<bfloat16, float>) {
  using G = typename C::grad;
  using P = typename C::out;
  using Out = std::conditional_t<std::is_void_v<P>, float, P>;  // storage for the copy (unused for void)
  const std::size_t sizes[] = {0, 1, 2, 7, 15, 16, 17, 31, 33, 64, 1000, 70001};
  const State base = make_state(70004, 100);
  const auto g = test::convert<G>(test::randn(70004, 200));
  for (const Isa isa : test::supported_isas()) {
    kernels::host::simd::IsaCap cap(isa);
    for (int threads : {1, 2, 3}) {
      test::Threads th(threads);
      for (std::size_t n : sizes) {
        // More threads only matter for sizes that split (and one start offset is enough there).
        if (threads > 1 && n < 2 * kernels::host::kParallelMinElements) continue;
        for (std::size_t shift : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {  // unaligned starts
          if (threads > 1 && shift != 1) continue;
          for (int mode = 0; mode < 4; ++mode) {
            CAPTURE(kernels::host::simd::to_string(isa));
            CAPTURE(threads);
            CAPTURE(n);
            CAPTURE(shift);
            CAPTURE(mode);
            const auto k = AdamStepConsts::make(hyper(mode & 1, mode & 2), 1 + mode);
            const std::size_t total = n + shift;
            State a{{base.p.begin(), base.p.begin() + static_cast<std::ptrdiff_t>(total)},
                    {base.m.begin(), base.m.begin() + static_cast<std::ptrdiff_t>(total)},
                    {base.v.begin(), base.v.begin() + static_cast<std::ptrdiff_t>(total)}};
            State b = a;
            std::vector<Out> out_a(total), out_b(total);
            if constexpr (std::is_void_v<P>) {
              kernels::host::fused_adam(a.p.data() + shift, a.m.data() + shift, a.v.data() + shift, g.data() + shift,
                                        nullptr, n, k, 0.5f);
              State r = b;
              for (std::size_t i = shift; i < total; ++i) adam_update(r.p[i], r.m[i], r.v[i], to_float(g[i]) * 0.5f, k);
              b = r;
            } else {
              kernels::host::fused_adam(a.p.data() + shift, a.m.data() + shift, a.v.data() + shift, g.data() + shift,
                                        out_a.data() + shift, n, k, 0.5f);
              State r = b;
              for (std::size_t i = shift; i < total; ++i) {
                adam_update(r.p[i], r.m[i], r.v[i], to_float(g[i]) * 0.5f, k);
                out_b[i] = from_float<P>(r.p[i]);
              }
              b = r;
              REQUIRE(test::same_bits(out_a, out_b));
            }
            REQUIRE(test::same_bits(a.p, b.p));
            REQUIRE(test::same_bits(a.m, b.m));
            REQUIRE(test::same_bits(a.v, b.v));
          }
        }
      }
    }
  }
}

TEST_CASE("fused_adam: any split of a buffer gives the same bits (ZeRO partitions)") {
  const std::size_t n = 100003;
  const auto k = AdamStepConsts::make(hyper(true, true), 4);
  const auto g = test::convert<half>(test::randn(n, 9));
  State whole = make_state(n, 5), split = whole;
  std::vector<half> out_whole(n), out_split(n);
  kernels::host::fused_adam(whole.p.data(), whole.m.data(), whole.v.data(), g.data(), out_whole.data(), n, k, 0.25f);
  const std::size_t cuts[] = {0, 1, 17, 4099, 33333, 33334, 99999, n};
  for (std::size_t c = 0; c + 1 < std::size(cuts); ++c) {
    const std::size_t b = cuts[c], e = cuts[c + 1];
    kernels::host::fused_adam(split.p.data() + b, split.m.data() + b, split.v.data() + b, g.data() + b,
                              out_split.data() + b, e - b, k, 0.25f);
  }
  CHECK(test::same_bits(whole.p, split.p));
  CHECK(test::same_bits(whole.m, split.m));
  CHECK(test::same_bits(whole.v, split.v));
  CHECK(test::same_bits(out_whole, out_split));
}

TEST_CASE("fused_adam over segments: per-group constants, gaps untouched, one pass") {
  // Partition of 5000 elements: four tensors in two groups, with unowned gaps between them.
  const std::size_t n = 5000;
  const std::vector<Segment> segs = {{3, 1, 0, 0}, {10, 1000, 1, 1}, {1010, 17, 0, 2}, {1100, 3800, 1, 3}};
  AdamHyper h0 = hyper(true, true), h1 = hyper(true, true);
  h1.lr = 1e-2f;
  h1.weight_decay = 0.0f;
  const std::vector<AdamStepConsts> consts = {AdamStepConsts::make(h0, 2), AdamStepConsts::make(h1, 2)};
  const auto g = test::convert<bfloat16>(test::randn(n, 12));
  State a = make_state(n, 13), b = a;
  std::vector<bfloat16> out_a(n, bfloat16(7.0f)), out_b = out_a;
  kernels::host::fused_adam<bfloat16, bfloat16>(segs, consts, a.p.data(), a.m.data(), a.v.data(), g.data(), out_a.data(),
                                                2.0f);
  for (const Segment& s : segs) {
    for (std::size_t i = s.offset; i < s.offset + s.numel; ++i) {
      adam_update(b.p[i], b.m[i], b.v[i], to_float(g[i]) * 2.0f, consts[s.group]);
      out_b[i] = bfloat16(b.p[i]);
    }
  }
  CHECK(test::same_bits(a.p, b.p));  // includes the gaps, which neither touched
  CHECK(test::same_bits(a.m, b.m));
  CHECK(test::same_bits(a.v, b.v));
  CHECK(test::same_bits(out_a, out_b));

  const std::vector<Segment> bad = {{0, 10, 2, 0}};
  auto bad_call = [&] {
    kernels::host::fused_adam<bfloat16, bfloat16>(bad, consts, a.p.data(), a.m.data(), a.v.data(), g.data(),
                                                  out_a.data(), 1.0f);
  };
  CHECK_THROWS_AS(bad_call(), usage_error);
}

TEST_CASE("fused_adam over a list of separate tensors (1000 tensors, mixed sizes)") {
  test::Threads th(2);
  const auto k = AdamStepConsts::make(hyper(false, true), 3);
  std::vector<State> a, b;
  std::vector<std::vector<float>> g;
  std::vector<std::vector<half>> out_a, out_b;
  for (std::size_t t = 0; t < 1000; ++t) {
    const std::size_t n = (t * 7919) % 257 + (t % 100 == 0 ? 40000 : 0);  // includes empty tensors
    a.push_back(make_state(n, t));
    b.push_back(a.back());
    g.push_back(test::randn(n, 5000 + t));
    out_a.emplace_back(n);
    out_b.emplace_back(n);
  }
  std::vector<kernels::host::AdamTensor<float, half>> list;
  for (std::size_t t = 0; t < a.size(); ++t) {
    list.push_back({a[t].p.data(), a[t].m.data(), a[t].v.data(), g[t].data(), out_a[t].data(), a[t].p.size()});
  }
  kernels::host::fused_adam<float, half>(list, k, 1.0f);
  for (std::size_t t = 0; t < b.size(); ++t) {
    reference(b[t], g[t].data(), out_b[t].data(), b[t].p.size(), k, 1.0f);
    REQUIRE(test::same_bits(a[t].p, b[t].p));
    REQUIRE(test::same_bits(out_a[t], out_b[t]));
  }
}

TEST_CASE("fused_adam: the working copy may alias the gradient element for element") {
  // The engine writes the new 16-bit parameters into the buffer the 16-bit gradients came from.
  const std::size_t n = 40001;
  const auto k = AdamStepConsts::make(hyper(true, true), 1);
  State a = make_state(n, 21), b = a;
  auto buf = test::convert<half>(test::randn(n, 22));
  const auto g = buf;
  std::vector<half> out(n);
  kernels::host::fused_adam(a.p.data(), a.m.data(), a.v.data(), buf.data(), buf.data(), n, k, 1.0f);
  kernels::host::fused_adam(b.p.data(), b.m.data(), b.v.data(), g.data(), out.data(), n, k, 1.0f);
  CHECK(test::same_bits(buf, out));
  CHECK(test::same_bits(a.p, b.p));
}

TEST_CASE("fused_adam propagates inf/NaN only where they are (detection is norm_and_check's job)") {
  const std::size_t n = 100;
  const auto k = AdamStepConsts::make(hyper(true, true), 1);
  State s = make_state(n, 31);
  auto g = test::randn(n, 32);
  g[5] = test::qnan();
  g[77] = -test::inf();
  kernels::host::fused_adam(s.p.data(), s.m.data(), s.v.data(), g.data(), nullptr, n, k, 1.0f);
  for (std::size_t i = 0; i < n; ++i) CHECK(std::isnan(s.p[i]) == (i == 5 || i == 77));
}
