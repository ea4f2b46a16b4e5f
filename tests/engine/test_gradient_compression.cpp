// GradientCompression<TopK|TwoBit|Sign> (zero/grads/compressed_all_reduce.hpp) on the threads
// communicator, against independent references:
// - the path alone equals a serial reference of all W ranks (each rank's encode with error feedback,
//   the dense decodes summed in rank order in fp32, / W, rounded once), bit for bit, gradients and
//   error buffers, over several boundaries (W = 1..4, buckets whose sizes nothing divides, fp32 and
//   bf16 gradients);
// - Huffman frames change the bytes on the wire and nothing else (bitwise the same results);
// - wire bytes: the path's count equals the communicator's, and the closed form;
// - an inf on one rank makes every rank's gradient NaN and leaves every error buffer unchanged;
// - in the engine, top-k with ratio 1 (lossless) equals the dense all-reduce bit for bit, and
//   StepReport's dense/wire bytes follow the formulas.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <vector>

#include "engine_fixture.hpp"
#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/device/ordered.hpp"
#include "zerotk/engine.hpp"
#include "zerotk/zero/grads/compressed_all_reduce.hpp"

namespace test_gradient_compression {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using HostOps = device::Ops<Host>;
using zt_test::same_bits;

namespace {

/// Parameter sizes and the bucket capacity in elements.
struct Shape {
  std::vector<std::size_t> numels;
  std::size_t bucket;
};
const Shape kSmall{{1000, 37, 4099, 3}, 2048};     // buckets whose sizes nothing divides
const Shape kLarge{{20000, 37, 30011}, 1u << 15};  // payloads large enough for Huffman to pay

/// Rank r's gradient value i at boundary s: smooth plus a few large outliers, never zero.
float grad_value(int r, int s, std::size_t i) {
  const float base = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(r) + 2.1f * static_cast<float>(s));
  const float big = (i * 7919u + static_cast<std::size_t>(r) * 31u + static_cast<std::size_t>(s)) % 97u == 0 ? 25.0f : 1.0f;
  return base * big * 1e-2f + 1e-4f;
}

template <class T>
struct PathRun {
  std::vector<std::vector<T>> grads;       // [boundary] rank 0's reduced gradients
  std::vector<std::vector<float>> errors;  // [rank] error buffers after the last boundary
  std::vector<std::vector<T>> all_ranks;   // [rank] last boundary's gradients
  std::uint64_t wire = 0, counted = 0, dense = 0, frames = 0, payloads = 0;  // rank 0's
};

/// `boundaries` boundaries of the compressed path alone on `world` threads. `inf_at`: rank 1 puts an
/// inf into its gradient at that boundary (-1: never).
template <class T, class Tag>
PathRun<T> run_path(int world, int boundaries, compress::GradientCompressionOptions o, int inf_at = -1,
                    const Shape& shape = kSmall) {
  PathRun<T> out;
  out.errors.resize(static_cast<std::size_t>(world));
  out.all_ranks.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
    HostOps ops;
    MemoryLedger ledger;
    device::OrderedCommunicator<HostOps> oc(c, ops);
    const std::vector<std::uint32_t> groups(shape.numels.size(), 0);
    zero::BucketLayout layout(shape.numels, groups, world, shape.bucket);
    zero::PathContext<HostOps> ctx;
    ctx.layout = &layout;
    ctx.ops = &ops;
    ctx.comm = &oc;
    ctx.ledger = &ledger;
    ctx.compression = &o;
    zero::CompressedAllReduce<T, HostOps, Tag> path(ctx);
    std::vector<std::vector<T>> mine;
    const std::uint64_t wire0 = c.stats().total_wire_bytes();
    for (int s = 0; s < boundaries; ++s) {
      for (std::size_t k = 0; k < layout.buckets().size(); ++k) {
        path.open(k, true);
        const zero::Bucket& b = layout.buckets()[k];
        T* g = path.bucket_grads(k);
        for (std::size_t i = 0; i < b.numel; ++i) g[i] = static_cast<T>(grad_value(c.rank(), s, b.flat_offset + i));
      }
      if (s == inf_at && c.rank() == 1 % world) path.bucket_grads(0)[3] = static_cast<T>(std::numeric_limits<float>::infinity());
      path.end_micro_step(true);
      const T* g = path.owned().working;
      mine.emplace_back(g, g + layout.flat_numel());
    }
    std::lock_guard lock(mu);
    const auto r = static_cast<std::size_t>(c.rank());
    out.errors[r].assign(path.error_feedback().begin(), path.error_feedback().end());
    out.all_ranks[r] = mine.back();
    if (r == 0) {
      out.grads = std::move(mine);
      out.wire = path.wire_bytes();
      out.counted = c.stats().total_wire_bytes() - wire0;
      out.dense = path.dense_bytes();
      out.frames = path.frame_bytes_sent();
      out.payloads = path.payload_bytes_sent();
    }
  });
  return out;
}

/// The serial reference: every rank's error buffer, per bucket y = x + e -> codec payload; the
/// reduced gradient is (decode(p_0) + ... + decode(p_{W-1})) / W in fp32 (dense decodes, summed in
/// rank order), rounded once to T. Boundaries listed in `skip` are ones some rank's inf poisoned:
/// they change no error buffer.
template <class T, class Tag>
PathRun<T> reference(int world, int boundaries, compress::GradientCompressionOptions o, int skip = -1,
                     const Shape& shape = kSmall) {
  const auto codec = zero::CodecOf<Tag>::make(o);
  const std::vector<std::uint32_t> groups(shape.numels.size(), 0);
  zero::BucketLayout layout(shape.numels, groups, world, shape.bucket);
  const std::size_t n = layout.flat_numel();
  PathRun<T> out;
  std::vector<std::vector<float>> err(static_cast<std::size_t>(world), std::vector<float>(n, 0.0f));
  for (int s = 0; s < boundaries; ++s) {
    std::vector<T> reduced(n);
    if (s == skip) {
      out.grads.emplace_back(n, static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
      continue;
    }
    for (const zero::Bucket& b : layout.buckets()) {
      std::vector<float> sum(b.numel, 0.0f);
      for (int r = 0; r < world; ++r) {
        std::vector<float> x(b.numel);
        for (std::size_t i = 0; i < b.numel; ++i) {
          x[i] = static_cast<float>(static_cast<T>(grad_value(r, s, b.flat_offset + i)));
        }
        std::vector<std::uint8_t> payload(codec.payload_bytes(b.numel));
        codec.encode(x, std::span<float>(err[static_cast<std::size_t>(r)].data() + b.flat_offset, b.numel), payload);
        std::vector<float> d(b.numel);
        codec.decode(payload, d);
        for (std::size_t i = 0; i < b.numel; ++i) sum[i] = r == 0 ? d[i] : sum[i] + d[i];
      }
      for (std::size_t i = 0; i < b.numel; ++i) {
        reduced[b.flat_offset + i] = static_cast<T>(sum[i] / static_cast<float>(world));
      }
    }
    out.grads.push_back(std::move(reduced));
  }
  out.errors = std::move(err);
  return out;
}

template <class T, class Tag>
void check_against_reference(compress::GradientCompressionOptions o) {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    const PathRun<T> got = run_path<T, Tag>(world, 3, o);
    const PathRun<T> want = reference<T, Tag>(world, 3, o);
    REQUIRE(got.grads.size() == want.grads.size());
    for (std::size_t s = 0; s < got.grads.size(); ++s) {
      CAPTURE(s);
      CHECK(same_bits(got.grads[s], want.grads[s]));
    }
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(same_bits(got.errors[static_cast<std::size_t>(r)], want.errors[static_cast<std::size_t>(r)]));
      CHECK(same_bits(got.all_ranks[static_cast<std::size_t>(r)], got.grads.back()));  // every rank the same
    }
    // Error feedback is doing something: a lossy codec leaves a residual.
    bool residual = false;
    for (float e : got.errors[0]) residual = residual || e != 0.0f;
    CHECK(residual);
  }
}

}  // namespace

TEST_CASE("GradientCompression path: top-k, 2-bit and sign equal the serial reference bit for bit (fp32, W = 1..4)") {
  check_against_reference<float, TopK>({.topk_ratio = 0.05, .huffman_coding = false});
  check_against_reference<float, TopK>({.topk_ratio = 0.3, .huffman_coding = false});
  check_against_reference<float, TwoBit>({});
  check_against_reference<float, Sign>({});
}

TEST_CASE("GradientCompression path: bf16 and fp16 gradients are widened, summed in fp32 and rounded once") {
  check_against_reference<bfloat16, TopK>({.topk_ratio = 0.05, .huffman_coding = false});
  check_against_reference<half, TwoBit>({});
}

TEST_CASE("GradientCompression path: Huffman frames give the same bits with fewer bytes where they pay") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const PathRun<float> plain = run_path<float, TopK>(world, 3, {.topk_ratio = 0.05, .huffman_coding = false}, -1, kLarge);
    const PathRun<float> coded = run_path<float, TopK>(world, 3, {.topk_ratio = 0.05, .huffman_coding = true}, -1, kLarge);
    for (std::size_t s = 0; s < 3; ++s) CHECK(same_bits(plain.grads[s], coded.grads[s]));
    CHECK(same_bits(plain.errors[1], coded.errors[1]));
    CHECK(coded.payloads == plain.payloads);
    CHECK(plain.frames == plain.payloads);
    CHECK(coded.frames < coded.payloads);  // the two large buckets' top-k payloads code smaller
    CHECK(coded.counted == coded.wire);
    CHECK(coded.wire < plain.wire);
    const PathRun<float> two = run_path<float, TwoBit>(world, 2, {.topk_ratio = 0.01, .huffman_coding = true}, -1, kLarge);
    const PathRun<float> two_plain = run_path<float, TwoBit>(world, 2, {}, -1, kLarge);
    CHECK(same_bits(two.grads[1], two_plain.grads[1]));
    CHECK(two.frames < two.payloads);
    // Small payloads go raw (a mode byte more) where a Huffman header would not pay.
    const PathRun<float> small = run_path<float, Sign>(world, 1, {.topk_ratio = 0.01, .huffman_coding = true});
    const PathRun<float> small_plain = run_path<float, Sign>(world, 1, {});
    CHECK(same_bits(small.grads[0], small_plain.grads[0]));
    const std::vector<std::uint32_t> groups(kSmall.numels.size(), 0);
    const zero::BucketLayout layout(kSmall.numels, groups, world, kSmall.bucket);
    CHECK(small.frames <= small.payloads + layout.buckets().size());  // at most a mode byte per bucket
  }
}

TEST_CASE("GradientCompression path: wire bytes are the communicator's and the closed form") {
  const compress::GradientCompressionOptions o{.topk_ratio = 0.05, .huffman_coding = false};
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    const int boundaries = 2;
    const PathRun<float> got = run_path<float, TopK>(world, boundaries, o);
    const compress::TopKCodec codec({o.topk_ratio});
    const std::vector<std::uint32_t> groups(kSmall.numels.size(), 0);
    const zero::BucketLayout layout(kSmall.numels, groups, world, kSmall.bucket);
    std::uint64_t want = 0, dense = 0, payloads = 0;
    const auto w = static_cast<std::uint64_t>(world);
    for (const zero::Bucket& b : layout.buckets()) {
      want += world > 1 ? (w - 1) * codec.payload_bytes(b.numel) : 0;
      dense += comm::ring_wire_bytes(comm::OpKind::all_reduce, 4 * b.numel, world);
      payloads += codec.payload_bytes(b.numel);
    }
    want += comm::ring_wire_bytes(comm::OpKind::all_reduce, sizeof(double), world);  // the finite flag
    CHECK(got.wire == boundaries * want);
    CHECK(got.counted == got.wire);
    CHECK(got.dense == boundaries * dense);
    CHECK(got.payloads == boundaries * payloads);
  }
}

TEST_CASE("GradientCompression path: an inf on one rank poisons every rank's gradient and changes no error") {
  const compress::GradientCompressionOptions o{.topk_ratio = 0.05, .huffman_coding = false};
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const PathRun<float> got = run_path<float, TopK>(world, 3, o, /*inf_at=*/1);
    const PathRun<float> want = reference<float, TopK>(world, 3, o, /*skip=*/1);
    for (float g : got.grads[1]) REQUIRE(std::isnan(g));
    CHECK(same_bits(got.grads[0], want.grads[0]));
    CHECK(same_bits(got.grads[2], want.grads[2]));  // the errors after boundary 0 carried on
    for (int r = 0; r < world; ++r) CHECK(same_bits(got.errors[static_cast<std::size_t>(r)], want.errors[static_cast<std::size_t>(r)]));
  }
}

namespace {

using zt_test::Mlp;

template <class... Extra>
using FlatEngine = Engine<Partitioner<Stage<0>>, Optimizer<AdamW>, Precision<fp32>, Extra...>;

EngineOptions engine_options(double ratio, bool huffman) {
  EngineOptions o;
  o.reduce_bucket_size = 64;  // fp32 elements
  o.optimizer.lr = 1e-2;
  o.compression.topk_ratio = ratio;
  o.compression.huffman_coding = huffman;
  return o;
}

}  // namespace

TEST_CASE("GradientCompression in the engine: top-k at ratio 1 is lossless and equals the dense all-reduce bit for bit") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    const zt_test::ThreadsRun dense = zt_test::train_threads<FlatEngine<>>(world, 5, engine_options(1.0, false));
    const zt_test::ThreadsRun topk = zt_test::train_threads<FlatEngine<GradientCompression<TopK>>>(world, 5, engine_options(1.0, false));
    const zt_test::ThreadsRun huff = zt_test::train_threads<FlatEngine<GradientCompression<TopK>>>(world, 5, engine_options(1.0, true));
    for (int r = 0; r < world; ++r) {
      CHECK(same_bits(topk.finals[static_cast<std::size_t>(r)], dense.finals[0]));
      CHECK(same_bits(huff.finals[static_cast<std::size_t>(r)], dense.finals[0]));
    }
    CHECK(!same_bits(dense.finals[0], zt_test::train_threads<FlatEngine<>>(world, 4, engine_options(1.0, false)).finals[0]));
    for (std::size_t s = 0; s < dense.reports.size(); ++s) {
      // The dense run sends what it would send; the compressed one reports the same dense count.
      CHECK(dense.reports[s].comm_dense_bytes == dense.reports[s].comm_wire_bytes);
      CHECK(topk.reports[s].comm_dense_bytes == dense.reports[s].comm_wire_bytes);
      // ... while it sent frames (8 bytes per value at ratio 1: more than the dense all-reduce).
      if (world > 1) CHECK(topk.reports[s].comm_wire_bytes > dense.reports[s].comm_wire_bytes);
    }
  }
}

TEST_CASE("GradientCompression in the engine: top-k 5% trains, every rank agrees, and sends fewer bytes") {
  const int world = 4;
  const zt_test::ThreadsRun dense = zt_test::train_threads<FlatEngine<>>(world, 6, engine_options(1.0, false));
  const zt_test::ThreadsRun topk = zt_test::train_threads<FlatEngine<GradientCompression<TopK>>>(world, 6, engine_options(0.05, false));
  const zt_test::ThreadsRun sign = zt_test::train_threads<FlatEngine<GradientCompression<Sign>>>(world, 6, engine_options(0.05, false));
  for (int r = 1; r < world; ++r) {
    CHECK(same_bits(topk.finals[static_cast<std::size_t>(r)], topk.finals[0]));
    CHECK(same_bits(sign.finals[static_cast<std::size_t>(r)], sign.finals[0]));
  }
  CHECK(!same_bits(topk.finals[0], dense.finals[0]));
  for (const zt_test::ThreadsRun* run : {&topk, &sign}) {
    for (const StepReport& rep : run->reports) {
      CHECK(rep.comm_wire_bytes < rep.comm_dense_bytes);
      CHECK(rep.compression_ratio() > 1.0);
      CHECK(std::isfinite(rep.grad_norm));
      CHECK(!rep.skipped);
    }
  }
  // The loss falls with compression as without.
  CHECK(topk.reports.back().loss < topk.reports.front().loss);
  CHECK(dense.reports.back().loss < dense.reports.front().loss);
}

TEST_CASE("GradientCompression in the engine: load_state restores the error feedback; without it, zero") {
  // A: 6 steps straight. B: 3 steps, state(), load_state(it), 3 more. C: a fresh engine loads B's
  // state and trains the same 3 steps. A, B and C are equal (the error feedback is the state's
  // rank-local part); D loads the state without it and ends elsewhere (errors from zero).
  using E = FlatEngine<GradientCompression<TopK>>;
  const int world = 2;
  const EngineOptions o = engine_options(0.05, true);
  const zt_test::ResumeRuns runs = zt_test::resume_runs<E>(world, o, 3, 3);
  for (std::size_t r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(runs.had_rank_local[r] == 1);
    CHECK(same_bits(runs.a[r], runs.b[r]));
    CHECK(same_bits(runs.b[r], runs.c[r]));
    CHECK_FALSE(same_bits(runs.a[r], runs.d[r]));
  }
}

}  // namespace test_gradient_compression
