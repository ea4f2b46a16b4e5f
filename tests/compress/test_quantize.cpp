// Block quantization (compress/quantize.hpp) and ZeRO++'s quantized exchanges
// (compress/quantized_collectives.hpp) on the threads communicator: the per-element rules against
// hand-computed values, error bounds, the record layout, qwZ = local quantize + dequantize of every
// block bit for bit, qgZ within its error bound of the exact average, DeepSpeed's fallback, and
// the inter-node bytes against the plain hierarchical reduce-scatter.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/compress/quantize.hpp"
#include "zerotk/compress/quantized_collectives.hpp"

namespace test_quantize {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zerotk::compress;
using quant::Format;
using quant::Scheme;

namespace {

std::vector<float> randoms(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST_CASE("quantize: symmetric and asymmetric codes by hand, int8 and int4") {
  // absmax 2, 8 bits: scale 64; 1.0 -> 64, -2 -> -128, 2 -> 128 clamped to 127, 0.0078125 (0.5 code) -> 1
  const quant::GroupParams p = quant::symmetric_params(2.0f, 8);
  CHECK(p.scale == 64.0f);
  CHECK(p.inv == 1.0f / 64);
  CHECK(quant::quantize_value(1.0f, p, 8) == 64);
  CHECK(quant::quantize_value(-2.0f, p, 8) == -128);
  CHECK(quant::quantize_value(2.0f, p, 8) == 127);
  CHECK(quant::quantize_value(0.0078125f, p, 8) == 1);    // 0.5 rounds away from zero
  CHECK(quant::quantize_value(-0.0078125f, p, 8) == -1);
  CHECK(quant::quantize_value(NAN, p, 8) == 127);
  CHECK(quant::quantize_value(1.996f, p, 8) == 127);  // 127.744 rounds to 128: clamped, not wrapped
  CHECK(quant::dequantize_value(64, p) == 1.0f);
  // 4 bits: absmax 1 -> scale 8, codes -8 .. 7
  const quant::GroupParams p4 = quant::symmetric_params(1.0f, 4);
  CHECK(quant::quantize_value(0.3f, p4, 4) == 2);   // 2.4
  CHECK(quant::quantize_value(-1.0f, p4, 4) == -8);
  CHECK(quant::quantize_value(1.0f, p4, 4) == 7);
  CHECK(quant::symmetric_params(0.0f, 8).scale == 1.0f);  // all zeros
  // asymmetric [-1, 3], 8 bits: offset 1, scale 256 / 4 = 64
  const quant::GroupParams a = quant::asymmetric_params(-1.0f, 3.0f, 8);
  CHECK(a.offset == 1.0f);
  CHECK(a.scale == 64.0f);
  CHECK(quant::quantize_value(3.0f, a, 8) == 127);
  CHECK(quant::quantize_value(-1.0f, a, 8) == -128);
  CHECK(quant::dequantize_value(-128, a) == -1.0f);
  // int4 packing: two's complement nibbles, low first
  CHECK(quant::pack4(-1, 7) == 0x7f);
  CHECK(quant::unpack4(0x7f, 0) == -1);
  CHECK(quant::unpack4(0x7f, 1) == 7);
  CHECK(quant::unpack4(0x80, 1) == -8);
}

TEST_CASE("quantize: records round trip within half a step per group; sizes; odd lengths") {
  for (const Format f : {Format{8, Scheme::symmetric, 64}, Format{8, Scheme::asymmetric, 64}, Format{4, Scheme::symmetric, 32},
                         Format{4, Scheme::asymmetric, 32}}) {
    CAPTURE(f.bits);
    CAPTURE(static_cast<int>(f.scheme));
    for (std::size_t n : {std::size_t{1}, std::size_t{31}, std::size_t{64}, std::size_t{1001}}) {
      CAPTURE(n);
      const std::vector<float> x = randoms(n, static_cast<std::uint32_t>(n), 3.0f);
      std::vector<std::uint8_t> rec(f.record_bytes(n));
      const std::size_t codes = f.bits == 8 ? n : (n + 1) / 2;
      CHECK(rec.size() == (codes + 3) / 4 * 4 + 4 * f.params_per_group() * ((n + f.group - 1) / f.group));
      quant::quantize(x.data(), n, f, rec.data());
      std::vector<float> back(n);
      quant::dequantize(rec.data(), n, f, back.data());
      for (std::size_t g = 0; g * f.group < n; ++g) {
        float lo = x[g * f.group], hi = lo, m = 0;
        for (std::size_t i = g * f.group; i < std::min(n, (g + 1) * f.group); ++i) {
          lo = std::min(lo, x[i]);
          hi = std::max(hi, x[i]);
          m = std::max(m, std::abs(x[i]));
        }
        // a step is absmax / 2^(b-1) (symmetric) or range / 2^b; the clamp at the top costs one step
        const float step = f.scheme == Scheme::symmetric ? m / (f.bits == 8 ? 128.0f : 8.0f) : (hi - lo) / (f.bits == 8 ? 256.0f : 16.0f);
        bool within = true;
        for (std::size_t i = g * f.group; i < std::min(n, (g + 1) * f.group); ++i) {
          within = within && std::abs(back[i] - x[i]) <= 1.0001f * step + 1e-6f;
        }
        CHECK(within);
      }
      std::vector<float> acc(n, 1.0f);
      quant::dequantize_add(rec.data(), n, f, acc.data());
      CHECK(acc[n - 1] == 1.0f + back[n - 1]);
    }
  }
  CHECK_THROWS_AS((Format{3, Scheme::symmetric, 64}.check("t")), usage_error);
  CHECK_THROWS_AS((Format{4, Scheme::symmetric, 33}.check("t")), usage_error);
}

TEST_CASE("qwZ: the quantized all-gather gives every rank each block's local quantize-dequantize, bit for bit") {
  constexpr std::size_t n = 5000;  // two groups of 4096 and a short one... on 4 ranks
  comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
    std::vector<std::vector<bfloat16>> blocks(4);
    for (int r = 0; r < 4; ++r) {
      const std::vector<float> x = randoms(n, 100 + static_cast<std::uint32_t>(r));
      for (float v : x) blocks[static_cast<std::size_t>(r)].push_back(bfloat16(v));
    }
    std::vector<bfloat16> out(4 * n);
    std::vector<std::uint8_t> scratch;
    QuantizedStats stats;
    quantized_all_gather(c, blocks[static_cast<std::size_t>(c.rank())].data(), out.data(), n, scratch, &stats).wait();
    for (std::size_t r = 0; r < 4; ++r) {
      std::vector<std::uint8_t> rec(kWeightFormat.record_bytes(n));
      quant::quantize(blocks[r].data(), n, kWeightFormat, rec.data());
      std::vector<bfloat16> want(n);
      quant::dequantize(rec.data(), n, kWeightFormat, want.data());
      CHECK(std::memcmp(want.data(), out.data() + r * n, n * sizeof(bfloat16)) == 0);
    }
    // int8 + one fp32 scale per 4096: 1.0015 bytes per value instead of bf16's 2
    CHECK(stats.links[0].wire_bytes == 3 * kWeightFormat.record_bytes(n));
    CHECK(kWeightFormat.record_bytes(n) == 5000 + 2 * 4);
  });
}

namespace {

comm::TopologyOptions two_nodes_of(int k) {
  comm::TopologyOptions o;
  o.levels = 2;
  o.ranks_per_node = k;
  return o;
}

}  // namespace

TEST_CASE("qgZ: the int4 reduce-scatter through 2 nodes x 4 is the exact average within its error bound, "
          "with >= 3x fewer inter-node bytes than the plain hierarchical one") {
  constexpr std::size_t n = 4096;  // per rank
  comm::run_threads(8, [&](comm::ThreadsCommunicator& c) {
    const comm::Topology topo = comm::detect_topology(c, two_nodes_of(4));
    comm::HierarchicalCommunicator h(c, topo);
    QuantizedReduceScatter q(c, topo);
    std::vector<std::vector<float>> in(8);
    for (std::size_t r = 0; r < 8; ++r) in[r] = randoms(8 * n, 7 + static_cast<std::uint32_t>(r));
    const std::size_t me = static_cast<std::size_t>(c.rank());
    std::vector<bfloat16> send(8 * n), got(n), plain(n);
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = bfloat16(in[me][i]);
    q.reduce_scatter_avg(send.data(), got.data(), n).wait();
    h.reduce_scatter(send.data(), plain.data(), n, DType::bf16, comm::ReduceOp::avg).wait();
    // A rigorous bound. Level 0 quantizes each rank's values with a step of at most A0 / 8 (A0 the
    // largest |input|), erring by at most one step (half a step, or one at the clamped top); level 1
    // requantizes each node's partial sum, whose magnitude is at most A1 = the largest exact node sum
    // + 4 such errors, erring by at most A1 / 8. The average of 8 then errs by at most
    // (8 A0 / 8 + 2 A1 / 8) / 8.
    double a0 = 0, a1 = 0;
    for (std::size_t r = 0; r < 8; ++r) {
      for (float v : in[r]) a0 = std::max(a0, std::abs(static_cast<double>(static_cast<float>(bfloat16(v)))));
    }
    for (std::size_t node = 0; node < 2; ++node) {
      for (std::size_t i = 0; i < 8 * n; ++i) {
        double sum = 0;
        for (std::size_t r = 4 * node; r < 4 * node + 4; ++r) sum += static_cast<double>(static_cast<float>(bfloat16(in[r][i])));
        a1 = std::max(a1, std::abs(sum));
      }
    }
    a1 += 4 * a0 / 8;
    const double bound = (8 * a0 / 8 + 2 * a1 / 8) / 8;
    double err = 0, sq = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double exact = 0;
      for (std::size_t r = 0; r < 8; ++r) exact += static_cast<double>(static_cast<float>(bfloat16(in[r][me * n + i])));
      exact /= 8;
      const double e = std::abs(static_cast<double>(static_cast<float>(got[i])) - exact);
      err = std::max(err, e);
      sq += e * e;
    }
    const double rms = std::sqrt(sq / n);
    CHECK(err <= bound);
    CHECK(err > 0.0);   // it is quantized
    CHECK(rms < 0.1);   // measured about 0.06: the errors are rounding noise, not a wrong or missing block
    const std::uint64_t quantized_inter = q.stats().links[1].wire_bytes, plain_inter = h.link_stats()[1].wire_bytes;
    CHECK(plain_inter == 1 * n * 2);  // (N-1) n bf16 values
    CHECK(quantized_inter == kGradientFormat.record_bytes(n));  // one int4 record of n to the other node
    CHECK(plain_inter >= 3 * quantized_inter);
    CHECK(q.stats().fallbacks == 0);
    if (c.rank() == 0) {
      MESSAGE("qgZ 2x4: largest error ", err, " (bound ", bound, "), rms ", rms, "; inter-node bytes ", quantized_inter,
              " vs plain ", plain_inter);
    }
    // An odd block: DeepSpeed's fallback, the plain reduce-scatter (bit for bit the flat one)
    std::vector<float> odd(8 * 3, 1.0f * static_cast<float>(c.rank())), o(3), want(3);
    q.reduce_scatter_avg(odd.data(), o.data(), 3).wait();
    c.reduce_scatter(odd.data(), want.data(), 3, DType::fp32, comm::ReduceOp::avg).wait();
    CHECK(o == want);
    CHECK(q.stats().fallbacks == 1);
  });
}

TEST_CASE("qgZ on a flat topology: one all-to-all level; the same on every run") {
  constexpr std::size_t n = 1000;
  std::vector<std::vector<float>> runs(2);
  for (int run = 0; run < 2; ++run) {
    comm::run_threads(4, [&](comm::ThreadsCommunicator& c) {
      QuantizedReduceScatter q(c, comm::Topology::flat(4));
      std::vector<float> send = randoms(4 * n, 3 + static_cast<std::uint32_t>(c.rank())), got(n);
      q.reduce_scatter_avg(send.data(), got.data(), n).wait();
      CHECK(q.stats().links[0].calls == 1);
      CHECK(q.stats().links[0].wire_bytes == 3 * kGradientFormat.record_bytes(n));
      if (c.rank() == 1) runs[static_cast<std::size_t>(run)] = got;
    });
  }
  CHECK(runs[0] == runs[1]);
}

}  // namespace test_quantize
