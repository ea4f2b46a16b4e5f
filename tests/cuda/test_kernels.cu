// CUDA kernels against the host drivers on the same inputs (which tests/kernels checks against
// fp64 references) and against the golden fixtures: Adam/AdamW, Lion (the generic elementwise driver), casts, flatten and sums of squares (the
// reproducible two-phase norm) bit for bit; LAMB's moments bit for bit and its parameters to one
// rounding of the trust ratio.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "../golden/golden_fixture.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/kernels/cuda.cuh"
#include "zerotk/kernels/host.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/optim/run.hpp"

namespace kc = zerotk::kernels::cuda;
namespace kh = zerotk::kernels::host;
using zerotk::bfloat16;
using zerotk::kernels::AdamHyper;
using zerotk::kernels::AdamStepConsts;
using zerotk::kernels::LambHyper;
using zerotk::kernels::LambStepConsts;
using zerotk::kernels::Segment;
using zerotk::kernels::TensorRef;
using half16 = zerotk::half;

namespace {

/// Device array of n T, filled from / copied back to host vectors.
template <class T>
class Dev {
 public:
  explicit Dev(std::size_t n) : n_(n) { ZEROTK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T))); }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { put(v); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }
  void put(const std::vector<T>& v) {
    ZEROTK_CUDA_CHECK(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> get() const {
    std::vector<T> v(n_);
    ZEROTK_CUDA_CHECK(cudaDeviceSynchronize());
    ZEROTK_CUDA_CHECK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  T* get_ptr() const { return p_; }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

std::vector<float> randn(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class T>
std::vector<T> to(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = zerotk::from_float<T>(v[i]);
  return r;
}

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void require_gpu() { REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device"); }

template <class G, class P>
void adam_flat_case(std::size_t n, std::size_t shift) {
  AdamHyper h;
  h.lr = 3e-3f;
  h.weight_decay = 0.05f;
  const auto k = AdamStepConsts::make(h, 3);
  const std::size_t total = n + shift;
  auto p = randn(total, 1), m = randn(total, 2, 0.1f), v = randn(total, 3, 0.01f);
  for (auto& x : v) x = std::fabs(x);
  const auto g = to<G>(randn(total, 4));
  Dev<float> dp(p), dm(m), dv(v);
  Dev<G> dg(g);
  Dev<P> dout(total);
  kc::fused_adam(dp.get_ptr() + shift, dm.get_ptr() + shift, dv.get_ptr() + shift, dg.get_ptr() + shift,
                 dout.get_ptr() + shift, n, k, 0.5f);
  std::vector<P> out(total);
  kh::fused_adam(p.data() + shift, m.data() + shift, v.data() + shift, g.data() + shift, out.data() + shift, n, k, 0.5f);
  const auto gp = dp.get(), gm = dm.get(), gv = dv.get();
  auto gout = dout.get();
  for (std::size_t i = 0; i < shift; ++i) gout[i] = out[i];  // never written by either
  CHECK(same(gp, p));
  CHECK(same(gm, m));
  CHECK(same(gv, v));
  CHECK(same(gout, out));
}

}  // namespace

TEST_CASE("cuda fused_adam (one tensor) equals the host driver bit for bit") {
  require_gpu();
  for (std::size_t n : {1u, 3u, 4u, 17u, 16384u, 16385u, 1000003u}) {
    for (std::size_t shift : {0u, 1u}) {
      CAPTURE(n);
      CAPTURE(shift);
      adam_flat_case<float, float>(n, shift);
      adam_flat_case<half16, half16>(n, shift);
      adam_flat_case<bfloat16, bfloat16>(n, shift);
      adam_flat_case<float, half16>(n, shift);
    }
  }
}

TEST_CASE("cuda fused_adam over 3000 tensors in one launch equals the host multi-tensor driver") {
  require_gpu();
  std::vector<Segment> segs;
  std::size_t n = 0;
  for (std::uint32_t t = 0; t < 3000; ++t) {
    const std::size_t len = (t * 7919u) % 997 + (t % 500 == 0 ? 100000 : 0);
    segs.push_back({n + (t % 3), len, t % 2, t});  // gaps and unaligned starts
    n += len + (t % 3) + 1;
  }
  AdamHyper h0, h1;
  h0.weight_decay = 0.1f;
  h1.lr = 1e-2f;
  h1.adamw_mode = false;
  h1.weight_decay = 0.01f;
  const std::vector<AdamStepConsts> k = {AdamStepConsts::make(h0, 5), AdamStepConsts::make(h1, 5)};
  auto p = randn(n, 5), m = randn(n, 6, 0.1f), v = randn(n, 7, 0.01f);
  for (auto& x : v) x = std::fabs(x);
  const auto g = to<half16>(randn(n, 8));
  Dev<float> dp(p), dm(m), dv(v);
  Dev<half16> dg(g), dout(to<half16>(std::vector<float>(n, 0.0f)));
  kc::Workspace ws;
  kc::fused_adam<half16, half16>(segs, k, dp.get_ptr(), dm.get_ptr(), dv.get_ptr(), dg.get_ptr(), dout.get_ptr(), 0.25f, ws);
  std::vector<half16> out = to<half16>(std::vector<float>(n, 0.0f));
  kh::fused_adam<half16, half16>(segs, k, p.data(), m.data(), v.data(), g.data(), out.data(), 0.25f);
  CHECK(same(dp.get(), p));
  CHECK(same(dm.get(), m));
  CHECK(same(dv.get(), v));
  CHECK(same(dout.get(), out));
}

TEST_CASE("cuda Lion (the generic elementwise driver) equals the host driver bit for bit, c = 0 included") {
  require_gpu();
  std::vector<Segment> segs;
  std::size_t n = 0;
  for (std::uint32_t t = 0; t < 500; ++t) {
    const std::size_t len = (t * 7919u) % 997 + (t % 100 == 0 ? 40000 : 0);
    segs.push_back({n + (t % 3), len, t % 2, t});  // gaps and unaligned starts
    n += len + (t % 3) + 1;
  }
  zerotk::OptimizerOptions o0, o1;
  o0.lr = 3e-3;
  o0.beta2 = 0.99;
  o0.weight_decay = 0.1;
  o1.lr = 1e-3;
  const std::vector<zerotk::optim::LionStepConsts> k = {zerotk::optim::LionStepConsts::make(o0),
                                                        zerotk::optim::LionStepConsts::make(o1)};
  auto p = randn(n, 11), m = randn(n, 12, 0.1f);
  auto gf = randn(n, 13);
  for (std::size_t i = 0; i < n; i += 97) gf[i] = m[i] = 0.0f;  // c = 0: FusedLion steps by +lr
  const auto g = to<bfloat16>(gf);
  Dev<float> dp(p), dm(m);
  Dev<bfloat16> dg(g), dout(to<bfloat16>(std::vector<float>(n, 0.0f)));
  kc::Workspace ws;
  kc::elementwise_step<zerotk::optim::LionRule, bfloat16, bfloat16>(segs, k, dp.get_ptr(), dm.get_ptr(), nullptr,
                                                                    dg.get_ptr(), dout.get_ptr(), 0.5f, ws);
  std::vector<bfloat16> out = to<bfloat16>(std::vector<float>(n, 0.0f));
  kh::elementwise_step<zerotk::optim::LionRule, bfloat16, bfloat16>(segs, k, p.data(), m.data(), nullptr, g.data(),
                                                                    out.data(), 0.5f);
  CHECK(same(dp.get(), p));
  CHECK(same(dm.get(), m));
  CHECK(same(dout.get(), out));
}

TEST_CASE("cuda Adam/AdamW follow the host optimizer (and so torch) over the golden trajectories") {
  require_gpu();
  for (const char* name : {"adamw", "adam_l2", "adamw_groups"}) {
    CAPTURE(name);
    const auto c = zerotk::test::load_golden(name);
    std::vector<Segment> segs;
    for (std::size_t t = 0; t < c.numels.size(); ++t) {
      segs.push_back({c.offset(t), c.numels[t], c.tensor_group[t], static_cast<std::uint32_t>(t)});
    }
    std::vector<zerotk::ParamGroup> groups;
    for (const auto& g : c.groups) {
      zerotk::OptimizerOptions o;
      o.lr = g.lr;
      o.beta1 = g.beta1;
      o.beta2 = g.beta2;
      o.eps = g.eps;
      o.weight_decay = g.weight_decay;
      groups.push_back({o});
    }
    const bool adamw = c.optimizer == "adamw";
    auto host_p = c.p0;
    Dev<float> dp(c.p0), dm(std::vector<float>(c.n, 0.0f)), dv(std::vector<float>(c.n, 0.0f)), dg(c.n);
    kc::Workspace ws;
    auto run_host = [&](auto& opt) {
      opt.init_state(c.n);
      for (int t = 1; t <= c.steps; ++t) {
        opt.step(segs, host_p.data(), c.grads[static_cast<std::size_t>(t - 1)].data(), nullptr, 1.0f);
        std::vector<AdamStepConsts> k;
        for (const auto& g : c.groups) {
          k.push_back(AdamStepConsts::make({g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, adamw, true}, t));
        }
        dg.put(c.grads[static_cast<std::size_t>(t - 1)]);
        kc::fused_adam<float, void>(segs, k, dp.get_ptr(), dm.get_ptr(), dv.get_ptr(), dg.get_ptr(), nullptr, 1.0f, ws);
        REQUIRE(same(dp.get(), host_p));
      }
    };
    if (adamw) {
      zerotk::optim::Standalone<zerotk::Optimizer<zerotk::AdamW>> opt(groups);
      run_host(opt);
    } else {
      zerotk::optim::Standalone<zerotk::Optimizer<zerotk::Adam>> opt(groups);
      run_host(opt);
    }
  }
}

TEST_CASE("cuda LAMB: moments bit for bit, parameters within one rounding of the host driver") {
  require_gpu();
  const std::vector<std::size_t> numels = {1, 33, 5000, 70001, 17};
  std::vector<Segment> segs;
  std::size_t n = 0;
  for (std::uint32_t t = 0; t < numels.size(); ++t) {
    segs.push_back({n, numels[t], t == 2 ? 1u : 0u, t});
    n += numels[t];
  }
  LambHyper a, b;
  a.lr = 1e-2f;
  a.weight_decay = 0.01f;
  b.lr = 2e-3f;
  b.max_coeff = 2.0f;
  const std::vector<LambStepConsts> k = {LambStepConsts::make(a, 2), LambStepConsts::make(b, 2)};
  auto p = randn(n, 1, 0.5f), m = randn(n, 2, 0.01f), v = randn(n, 3, 0.001f);
  for (auto& x : v) x = std::fabs(x);
  std::fill(p.begin() + 1, p.begin() + 34, 0.0f);  // tensor 1 is zero: ratio 1
  const auto g = randn(n, 4);
  Dev<float> dp(p), dm(m), dv(v), dg(g);
  Dev<bfloat16> dout(n);
  std::vector<kc::LambTensor<float, bfloat16>> items;
  for (const Segment& s : segs) {
    items.push_back({dp.get_ptr() + s.offset, dm.get_ptr() + s.offset, dv.get_ptr() + s.offset, dg.get_ptr() + s.offset,
                     dout.get_ptr() + s.offset, s.numel, s.group, s.tensor});
  }
  kc::Workspace ws;
  int reduce_calls = 0;
  kc::fused_lamb<float, bfloat16>(items, k, 0.5f, numels.size(), ws, nullptr,
                                  [&](double*, std::size_t count, cudaStream_t) {
                                    ++reduce_calls;
                                    CHECK(count == 2 * numels.size());
                                  });
  CHECK(reduce_calls == 1);
  std::vector<bfloat16> out(n);
  std::vector<double> sums(2 * numels.size(), 0.0);
  kh::lamb_phase1<float>(segs, k, p.data(), m.data(), v.data(), g.data(), 0.5f, sums);
  kh::lamb_phase2<bfloat16>(segs, k, p.data(), m.data(), v.data(), out.data(), sums);
  CHECK(same(dm.get(), m));
  CHECK(same(dv.get(), v));
  const auto gp = dp.get();
  const auto gout = dout.get();
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(std::fabs(gp[i] - p[i]) <= 0x1p-22f * std::fabs(p[i]) + 1e-12f);
    REQUIRE(gout[i].bits == zerotk::float_to_bf16_bits(gp[i]));
  }
}

TEST_CASE("cuda casts and scale equal the host bit for bit (vector and scalar paths)") {
  require_gpu();
  std::vector<float> x;
  for (std::uint64_t b = 0; b < (1ull << 32); b += 4099) {
    const auto u = static_cast<std::uint32_t>(b);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  Dev<float> dx(x);
  for (std::size_t shift : {0u, 1u}) {
    const std::size_t n = x.size() - shift;
    Dev<half16> dh(x.size());
    Dev<bfloat16> db(x.size());
    kc::cast(dx.get_ptr() + shift, dh.get_ptr() + shift, n);
    kc::cast(dx.get_ptr() + shift, db.get_ptr() + shift, n);
    const auto h = dh.get();
    const auto b = db.get();
    for (std::size_t i = shift; i < x.size(); ++i) {
      REQUIRE(h[i].bits == zerotk::float_to_half_bits(x[i]));
      REQUIRE(b[i].bits == zerotk::float_to_bf16_bits(x[i]));
    }
  }
  std::vector<half16> all(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) all[i] = half16::from_bits(static_cast<std::uint16_t>(i));
  Dev<half16> dall(all);
  kc::scale(dall.get_ptr(), all.size(), 0.75f);
  std::vector<half16> ref = all;
  kh::scale(ref.data(), ref.size(), 0.75f);
  // IEEE 754 leaves the payload of a NaN produced by arithmetic to the hardware: x86 keeps the
  // operand's payload and sign, NVIDIA GPUs return the canonical NaN. Every other result must match bit
  // for bit, and a NaN must stay a NaN (the overflow check looks only at the exponent).
  const auto got = dall.get();
  const auto is_nan = [](half16 h) { return (h.bits & 0x7c00u) == 0x7c00u && (h.bits & 0x03ffu) != 0; };
  std::size_t nan_payloads = 0;
  for (std::uint32_t i = 0; i < 65536; ++i) {
    if (got[i].bits == ref[i].bits) continue;
    if (is_nan(got[i]) && is_nan(ref[i])) {
      ++nan_payloads;
      continue;
    }
    FAIL_CHECK("scale(0.75) of fp16 0x" << std::hex << i << ": cuda 0x" << got[i].bits << ", host 0x" << ref[i].bits);
  }
  MESSAGE(nan_payloads << " of 2046 NaN inputs came back with another NaN payload than the host's");
}

TEST_CASE("cuda divide equals the host's average after a sum (comm::detail::divide_in_place) bit for bit") {
  // OrderedCommunicator::mean_over's division (expert gradients averaged over the data size) runs
  // on the device as kernels::cuda::divide. Every fp16 and bf16 value, and a sweep of fp32 bit
  // patterns, by divisors 2 (exact but for underflow), 3 and 6 (rounded).
  require_gpu();
  std::vector<half16> h(65536);
  std::vector<bfloat16> b(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    h[i] = half16::from_bits(static_cast<std::uint16_t>(i));
    b[i] = bfloat16::from_bits(static_cast<std::uint16_t>(i));
  }
  std::vector<float> f;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 65537) {
    const auto bits = static_cast<std::uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, 4);
    f.push_back(x);
  }
  const auto nan16 = [](std::uint16_t v, std::uint16_t exp) { return (v & exp) == exp && (v & ~exp & 0x7fffu) != 0; };
  for (int d : {2, 3, 6}) {
    CAPTURE(d);
    Dev<half16> dh(h);
    Dev<bfloat16> db(b);
    Dev<float> df(f);
    kc::divide(dh.get_ptr(), h.size(), d);
    kc::divide(db.get_ptr(), b.size(), d);
    kc::divide(df.get_ptr(), f.size(), d);
    std::vector<half16> rh = h;
    std::vector<bfloat16> rb = b;
    std::vector<float> rf = f;
    zerotk::comm::detail::divide_in_place(rh.data(), rh.size(), zerotk::DType::fp16, d);
    zerotk::comm::detail::divide_in_place(rb.data(), rb.size(), zerotk::DType::bf16, d);
    zerotk::comm::detail::divide_in_place(rf.data(), rf.size(), zerotk::DType::fp32, d);
    const auto gh = dh.get();
    const auto gb = db.get();
    const auto gf = df.get();
    for (std::size_t i = 0; i < h.size(); ++i) {  // a NaN stays a NaN; its payload is the hardware's
      if (!(nan16(gh[i].bits, 0x7c00u) && nan16(rh[i].bits, 0x7c00u))) REQUIRE(gh[i].bits == rh[i].bits);
      if (!(nan16(gb[i].bits, 0x7f80u) && nan16(rb[i].bits, 0x7f80u))) REQUIRE(gb[i].bits == rb[i].bits);
    }
    for (std::size_t i = 0; i < f.size(); ++i) {
      if (!(std::isnan(gf[i]) && std::isnan(rf[i]))) REQUIRE(std::memcmp(&gf[i], &rf[i], 4) == 0);
    }
  }
}

TEST_CASE("cuda sums of squares equal the host's bit for bit; the inf/NaN flag") {
  require_gpu();
  kc::Workspace ws;
  const auto x = randn(3 * 16384 + 77, 9);
  Dev<float> dx(x);
  Dev<double> out(1);
  kc::sum_squares(dx.get_ptr(), x.size(), out.get_ptr(), ws);
  const double host = kh::sum_squares(x.data(), x.size());
  CHECK(same(out.get(), std::vector<double>{host}));
  const auto nc = kc::norm_and_check(dx.get_ptr(), x.size(), ws);
  CHECK_FALSE(nc.nonfinite);
  CHECK(nc.sum_squares == host);
  // Per tensor, one launch per phase; each tensor its own grid, as on the host.
  std::vector<std::vector<float>> ts;
  std::vector<std::unique_ptr<Dev<float>>> dts;
  std::vector<TensorRef<const float>> refs, host_refs;
  for (std::size_t t = 0; t < 100; ++t) {
    ts.push_back(randn(t * 331 % 5000 + (t == 50 ? 40000 : 0), 100 + t, t % 7 == 0 ? 1e-20f : 1.0f));
    dts.push_back(std::make_unique<Dev<float>>(ts.back()));
    refs.push_back({dts.back()->get_ptr(), ts.back().size()});
    host_refs.push_back({ts.back().data(), ts.back().size()});
  }
  Dev<double> per(ts.size());
  kc::sum_squares<float>(refs, per.get_ptr(), ws);
  std::vector<double> want(ts.size());
  kh::sum_squares<float>(host_refs, want);
  CHECK(same(per.get(), want));
  // The flag, for every type, at the first, a middle and the last element.
  for (std::size_t at : {std::size_t{0}, std::size_t{12345}, x.size() - 1}) {
    auto y = x;
    y[at] = std::numeric_limits<float>::infinity();
    Dev<float> dy(y);
    Dev<half16> dyh(to<half16>(y));
    Dev<int> flag(std::vector<int>{0});
    kc::has_nonfinite(dx.get_ptr(), x.size(), flag.get_ptr());
    CHECK(flag.get()[0] == 0);
    kc::has_nonfinite(dyh.get_ptr(), y.size(), flag.get_ptr());
    CHECK(flag.get()[0] == 1);
    CHECK(kc::norm_and_check(dy.get_ptr(), y.size(), ws).nonfinite);
    kc::sum_squares(dy.get_ptr(), y.size(), out.get_ptr(), ws);
    CHECK(out.get()[0] == std::numeric_limits<double>::infinity());
  }
}

namespace {

/// has_nonfinite<T> over n elements starting `offset` elements into a 16-byte aligned buffer: each
/// position of the vector words and of the scalar head/tail, for +inf, -inf and NaN; 0 for the largest
/// finite values (all exponent bits but one set).
template <class T>
void nonfinite_positions(T largest, std::initializer_list<T> bad_values) {
  constexpr std::size_t n = 37;
  for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    std::vector<T> base(n + offset, largest);
    Dev<T> d(base);
    Dev<int> flag(std::vector<int>{0});
    kc::has_nonfinite(d.get_ptr() + offset, n, flag.get_ptr());
    CHECK_MESSAGE(flag.get()[0] == 0, "largest finite values flagged, offset " << offset);
    for (T bad : bad_values) {
      for (std::size_t at = 0; at < n; ++at) {
        auto y = base;
        y[offset + at] = bad;
        d.put(y);
        flag.put({0});
        kc::has_nonfinite(d.get_ptr() + offset, n, flag.get_ptr());
        CHECK_MESSAGE(flag.get()[0] == 1, "bits 0x" << std::hex << bad.bits << std::dec << " at " << at
                                                    << " (offset " << offset << ") not flagged");
      }
    }
  }
}

float float_from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace

TEST_CASE("cuda has_nonfinite finds inf and NaN at every position, vector path and scalar head/tail") {
  require_gpu();
  nonfinite_positions<half16>(half16::from_bits(0x7bffu),
                              {half16::from_bits(0x7c00u), half16::from_bits(0xfc00u), half16::from_bits(0x7e01u)});
  nonfinite_positions<bfloat16>(bfloat16::from_bits(0x7f7fu), {bfloat16::from_bits(0x7f80u),
                                                               bfloat16::from_bits(0xff80u), bfloat16::from_bits(0x7fc1u)});
  // float: the same walk (float has no .bits member).
  constexpr std::size_t n = 37;
  for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    std::vector<float> base(n + offset, std::numeric_limits<float>::max());
    Dev<float> d(base);
    Dev<int> flag(std::vector<int>{0});
    kc::has_nonfinite(d.get_ptr() + offset, n, flag.get_ptr());
    CHECK(flag.get()[0] == 0);
    for (std::uint32_t bad : {0x7f800000u, 0xff800000u, 0x7fc00001u}) {
      for (std::size_t at = 0; at < n; ++at) {
        auto y = base;
        y[offset + at] = float_from_bits(bad);
        d.put(y);
        flag.put({0});
        kc::has_nonfinite(d.get_ptr() + offset, n, flag.get_ptr());
        CHECK_MESSAGE(flag.get()[0] == 1, "float bits 0x" << std::hex << bad << std::dec << " at " << at << " not flagged");
      }
    }
  }
}

namespace {

/// Values over many binades (subnormals, zeros, large values) as T.
template <class T>
std::vector<T> norm_data(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  const int lo = std::is_same_v<T, half16> ? -24 : -149, hi = std::is_same_v<T, half16> ? 15 : 120;
  for (auto& x : v) {
    const int e = lo + static_cast<int>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
    x = rng() % 16 == 0 ? 0.0f : std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1024.0f, e);
    if (rng() % 2) x = -x;
  }
  return to<T>(v);
}

template <class T>
void two_phase_case(std::size_t n, std::uint64_t seed) {
  kc::Workspace ws;
  const auto x = norm_data<T>(n, seed);
  Dev<T> dx(x);
  // Blocks of one buffer at odd offsets and sizes (vector and scalar paths), in a shuffled order.
  std::mt19937_64 rng(seed + 1);
  std::vector<TensorRef<const T>> dev_blocks, host_blocks;
  for (std::size_t at = 0; at < n;) {
    const std::size_t len = std::min<std::size_t>(n - at, 1 + rng() % 70000);
    dev_blocks.push_back({dx.get_ptr() + at, len});
    host_blocks.push_back({x.data() + at, len});
    at += len;
  }
  std::vector<std::size_t> order(dev_blocks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<TensorRef<const T>> shuffled;
  for (std::size_t i : order) shuffled.push_back(dev_blocks[i]);

  Dev<zerotk::kernels::SquareBound> dbound(std::vector<zerotk::kernels::SquareBound>(1));
  kc::square_bound<T>(shuffled, dbound.get_ptr(), ws);
  const auto dev_bound = dbound.get()[0];
  const auto host_bound = kh::square_bound<T>(host_blocks);
  CHECK(std::memcmp(&dev_bound.max_square, &host_bound.max_square, sizeof(double)) == 0);
  CHECK(dev_bound.nonfinite == host_bound.nonfinite);

  const auto grid = zerotk::kernels::NormGrid::make(host_bound.max_square, n);
  Dev<zerotk::kernels::FoldSums> dfolds(std::vector<zerotk::kernels::FoldSums>(1));
  kc::add_squares<T>(shuffled, grid, dfolds.get_ptr(), ws);
  const auto dev_folds = dfolds.get()[0];
  zerotk::kernels::FoldSums host_folds;
  kh::add_squares<T>(host_blocks, grid, host_folds);
  CHECK(std::memcmp(dev_folds.fold, host_folds.fold, sizeof host_folds.fold) == 0);
  CHECK(zerotk::kernels::fold_finish(dev_folds) == kh::sum_squares(x.data(), n));

  // One inf: the bound says so.
  auto y = x;
  y[n / 2] = zerotk::from_float<T>(std::numeric_limits<float>::infinity());
  Dev<T> dy(y);
  Dev<zerotk::kernels::SquareBound> dbad(std::vector<zerotk::kernels::SquareBound>(1));
  kc::square_bound(dy.get_ptr(), n, dbad.get_ptr(), ws);
  CHECK(dbad.get()[0].nonfinite);
}

}  // namespace

TEST_CASE("cuda two-phase norm over a shuffled block list equals the host's bit for bit") {
  require_gpu();
  for (std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{16385}, std::size_t{1000003}}) {
    CAPTURE(n);
    two_phase_case<float>(n, 11 + n);
    two_phase_case<half16>(n, 12 + n);
    two_phase_case<bfloat16>(n, 13 + n);
  }
}

TEST_CASE("cuda flatten / unflatten of 10,000 tensors in one launch equal the host's") {
  require_gpu();
  std::vector<std::size_t> numels;
  for (std::size_t t = 0; t < 10000; ++t) numels.push_back((t * 37) % 300 + (t == 77 ? 50000 : 0));
  std::size_t total = 0;
  for (auto n : numels) total += n;
  const auto pool = randn(total, 3);
  Dev<float> dpool(pool);
  std::vector<TensorRef<const float>> hsrc, dsrc;
  std::size_t at = 0;
  for (auto n : numels) {
    hsrc.push_back({pool.data() + at, n});
    dsrc.push_back({dpool.get_ptr() + at, n});
    at += n;
  }
  const auto layout = zerotk::kernels::flat_layout(numels, 16, 8);
  std::vector<half16> hflat(layout.numel, half16::from_bits(0x7777));
  Dev<half16> dflat(hflat);
  kc::Workspace ws;
  kc::flatten<float, half16>(dsrc, dflat.get_ptr(), layout, ws);
  kh::flatten<float, half16>(hsrc, hflat.data(), layout);
  CHECK(same(dflat.get(), hflat));
  Dev<float> dback(total);
  std::vector<TensorRef<float>> ddst;
  at = 0;
  for (auto n : numels) {
    ddst.push_back({dback.get_ptr() + at, n});
    at += n;
  }
  kc::unflatten<half16, float>(dflat.get_ptr(), ddst, layout, ws);
  const auto back = dback.get();
  for (std::size_t i = 0; i < total; ++i) {
    REQUIRE(back[i] == zerotk::half_bits_to_float(zerotk::float_to_half_bits(pool[i])));
  }
}
