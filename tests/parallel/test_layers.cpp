// Column- and row-parallel linears, sequence parallel, vocab-parallel embedding and cross-entropy,
// and the tensor-parallel RNG, on thread ranks: against tensor size 1 (bitwise where the sums are
// the same), against the rank-order serial references (bitwise), and with counted communication.
#include "common.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "zerotk/comm/threads.hpp"
#include "zerotk/parallel/linear.hpp"
#include "zerotk/parallel/rng.hpp"
#include "zerotk/parallel/vocab.hpp"

using namespace zerotk;
using namespace zerotk::parallel;
using comm::OpKind;
using comm::ThreadsCommunicator;
using zt_parallel_test::max_abs_diff;
using zt_parallel_test::same_bits;
using zt_parallel_test::values;

namespace {

std::vector<float> shard(const std::vector<float>& full, MatrixShape s, TensorSplit split, int r, int t) {
  std::vector<float> out(shard_shape(s, split, t).numel());
  take_shard<float>(full, s, split, r, t, out);
  return out;
}

/// The serial reference of the column-parallel input gradient: rank r's dy_r W_r summed in rank order.
std::vector<float> column_dx_reference(const std::vector<float>& dy, const std::vector<float>& w, std::size_t n,
                                       std::size_t in, std::size_t out, int parts, int t) {
  std::vector<float> dx(n * in, 0.0f), part(n * in), scratch(out * in);
  for (int r = 0; r < t; ++r) {
    const auto wr = shard(w, {out, in}, TensorSplit::rows(parts), r, t);
    const auto dyr = shard(dy, {n, out}, TensorSplit::cols(parts), r, t);
    std::fill(scratch.begin(), scratch.end(), 0.0f);
    dense_backward(std::vector<float>(n * in, 0.0f), wr, dyr, part, std::span<float>(scratch).first(wr.size()), {}, n,
                   in, out / static_cast<std::size_t>(t));
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] = r == 0 ? part[i] : dx[i] + part[i];
  }
  return dx;
}

}  // namespace

TEST_CASE("column-parallel linear (fused QKV, 3 parts): outputs and weight gradients equal tensor size 1 bit for bit") {
  const std::size_t n = 5, in = 8, out = 3 * 8;
  const auto x = values(n * in, 1), w = values(out * in, 2), b = values(out, 3), dy = values(n * out, 4);
  std::vector<float> y1(n * out), dx1(n * in), dw1(out * in, 0.0f), db1(out, 0.0f);
  dense_forward(x, w, b, y1, n, in, out);
  dense_backward(x, w, dy, dx1, dw1, db1, n, in, out);
  for (int t : {2, 4}) {
    CAPTURE(t);
    const auto dx_ref = column_dx_reference(dy, w, n, in, out, 3, t);
    comm::run_threads(t, [&](ThreadsCommunicator& tp) {
      const int r = tp.rank();
      const ColumnParallelLinear layer({.name = "qkv", .in = in, .out = out, .tensor_size = t, .parts = 3});
      const auto wr = shard(w, layer.weight_shape(), layer.weight_split(), r, t);
      const auto br = shard(b, layer.bias_shape(), layer.bias_split(), r, t);
      std::vector<float> y(n * layer.local_out());
      layer.forward(x, n, wr, br, y);
      // This rank's output features are its q, k, v columns of the full output.
      CHECK(same_bits(y, shard(y1, {n, out}, TensorSplit::cols(3), r, t)));
      const auto dyr = shard(dy, {n, out}, TensorSplit::cols(3), r, t);
      std::vector<float> dx(n * in), dw(wr.size(), 0.0f), db(br.size(), 0.0f);
      layer.backward(tp, x, n, wr, dyr, dx, dw, db);
      CHECK(same_bits(dw, shard(dw1, layer.weight_shape(), layer.weight_split(), r, t)));
      CHECK(same_bits(db, shard(db1, layer.bias_shape(), layer.bias_split(), r, t)));
      CHECK(same_bits(dx, dx_ref));             // rank-order sum of the partial input gradients
      CHECK(max_abs_diff(dx, dx1) <= 1e-5f);    // and tensor size 1 to rounding
      CHECK(tp.stats()[OpKind::all_reduce].calls == 1);
    });
  }
}

TEST_CASE("row-parallel linear: the rank-order reference bit for bit, tensor size 1 to rounding; gradients exact") {
  const std::size_t n = 6, in = 16, out = 5;
  const auto x = values(n * in, 5), w = values(out * in, 6), b = values(out, 7), dy = values(n * out, 8);
  std::vector<float> y1(n * out), dx1(n * in), dw1(out * in, 0.0f), db1(out, 0.0f);
  dense_forward(x, w, b, y1, n, in, out);
  dense_backward(x, w, dy, dx1, dw1, db1, n, in, out);
  for (int t : {2, 4}) {
    CAPTURE(t);
    const auto ref = row_parallel_reference(x, w, b, n, in, out, t);
    comm::run_threads(t, [&](ThreadsCommunicator& tp) {
      const int r = tp.rank();
      const RowParallelLinear layer({.name = "fc2", .in = in, .out = out, .tensor_size = t});
      const auto xr = shard(x, {n, in}, TensorSplit::cols(), r, t);
      const auto wr = shard(w, layer.weight_shape(), layer.weight_split(), r, t);
      std::vector<float> y(n * out);
      layer.forward(tp, xr, n, wr, b, y);
      CHECK(same_bits(y, ref));
      CHECK(max_abs_diff(y, y1) <= 1e-5f);
      std::vector<float> dx(xr.size()), dw(wr.size(), 0.0f), db(out, 0.0f);
      layer.backward(xr, n, wr, dy, dx, dw, db);
      CHECK(same_bits(dx, shard(dx1, {n, in}, TensorSplit::cols(), r, t)));
      CHECK(same_bits(dw, shard(dw1, layer.weight_shape(), layer.weight_split(), r, t)));
      CHECK(same_bits(db, db1));  // replicated bias: every tensor rank the same gradient
      CHECK(tp.stats()[OpKind::all_reduce].calls == 1);
    });
  }
}

TEST_CASE("one MLP block's communication, counted: 1 + 1 all-reduce each way; under sequence parallel gathers and "
          "reduce-scatters instead, bytes exact") {
  const std::size_t n = 8, d = 6, h = 12;
  const int t = 2;
  const auto x = values(n * d, 30), w1 = values(h * d, 31), w2 = values(d * h, 32), b2 = values(d, 33);
  const auto dy = values(n * d, 34);
  std::vector<std::vector<float>> plain;  // without sequence parallel: rank 0's output, input gradient, bias gradient
  for (bool sp : {false, true}) {
    CAPTURE(sp);
    const auto got = comm::run_threads(t, [&](ThreadsCommunicator& tp) {
      const int r = tp.rank();
      const ColumnParallelLinear fc1({.name = "fc1", .in = d, .out = h, .tensor_size = t, .sequence_parallel = sp});
      const RowParallelLinear fc2({.name = "fc2", .in = h, .out = d, .tensor_size = t, .sequence_parallel = sp});
      const auto w1r = shard(w1, fc1.weight_shape(), fc1.weight_split(), r, t);
      const auto w2r = shard(w2, fc2.weight_shape(), fc2.weight_split(), r, t);
      const std::size_t rows = sp ? n / t : n;  // the tokens this rank holds outside the region
      const auto x_mine = sp ? shard(x, {n, d}, TensorSplit::rows(), r, t) : x;
      std::vector<float> x_all(n * d);
      if (sp) {
        GatherFirstDim::forward(tp, std::span<const float>(x_mine), std::span<float>(x_all));
      } else {
        x_all = x_mine;
        CopyToRegion::forward(tp, std::span<float>(x_all));
      }
      std::vector<float> hid(n * fc1.local_out()), y(n * d), y_mine(rows * d);
      fc1.forward(x_all, n, w1r, {}, hid);
      fc2.forward(tp, hid, n, w2r, b2, y, sp ? std::span<float>(y_mine) : std::span<float>());
      if (!sp) y_mine = y;
      const auto after_forward = tp.stats();
      // Backward: the output gradient of this rank's tokens.
      const auto dy_mine = sp ? shard(dy, {n, d}, TensorSplit::rows(), r, t) : dy;
      std::vector<float> dy_all(n * d);
      if (sp) {
        ReduceScatterFirstDim::backward(tp, std::span<const float>(dy_mine), std::span<float>(dy_all));
      } else {
        dy_all = dy_mine;
      }
      std::vector<float> dhid(hid.size()), dw2(w2r.size(), 0.0f), db2(d, 0.0f), dw1(w1r.size(), 0.0f), dx(n * d),
          dx_mine(rows * d);
      fc2.backward(hid, n, w2r, dy_all, dhid, dw2, db2, sp ? std::span<const float>(dy_mine) : std::span<const float>());
      fc1.backward(tp, x_all, n, w1r, dhid, dx, dw1, {}, sp ? std::span<float>(dx_mine) : std::span<float>());
      if (!sp) dx_mine = dx;
      const auto db2_local = db2;
      if (sp) sum_replicated_grads(tp, std::span<float>(db2));
      const auto& s = tp.stats();
      const std::uint64_t act = n * d * sizeof(float);  // one activation of all tokens
      if (sp) {
        CHECK(after_forward[OpKind::all_gather].calls == 1);
        CHECK(after_forward[OpKind::reduce_scatter].calls == 1);
        CHECK(after_forward[OpKind::all_gather].payload_bytes == act);
        CHECK(s[OpKind::all_gather].calls == 2);
        CHECK(s[OpKind::reduce_scatter].calls == 2);
        CHECK(s[OpKind::reduce_scatter].payload_bytes == 2 * act);
        CHECK(s[OpKind::all_reduce].calls == 1);  // the bias gradient, once per step
      } else {
        CHECK(after_forward[OpKind::all_reduce].calls == 1);
        CHECK(after_forward[OpKind::all_reduce].payload_bytes == act);
        CHECK(s[OpKind::all_reduce].calls == 2);
        CHECK(s[OpKind::all_gather].calls + s[OpKind::reduce_scatter].calls == 0);
      }
      return std::vector<std::vector<float>>{y_mine, dx_mine, db2, db2_local};
    });
    // Both layouts give the same tokens' outputs and input gradients; the bias gradient is the same on
    // every rank only after the sum under sequence parallel (each rank saw its own tokens).
    if (!sp) {
      plain = {got[0][0], got[0][1], got[0][2]};
      CHECK(same_bits(got[0][2], got[1][2]));
    } else {
      for (int r = 0; r < t; ++r) {
        const std::size_t m = n / t * d;
        CHECK(same_bits(got[r][0], std::span<const float>(plain[0]).subspan(m * r, m)));
        CHECK(same_bits(got[r][1], std::span<const float>(plain[1]).subspan(m * r, m)));
      }
      CHECK(same_bits(got[0][2], got[1][2]));
      CHECK_FALSE(same_bits(got[0][3], got[1][3]));  // without sum_replicated_grads the ranks would diverge
      CHECK(max_abs_diff(got[0][2], plain[2]) <= 1e-5f);
    }
  }
}

TEST_CASE("a layer whose split does not divide names itself, the dimension and the sizes") {
  CHECK_THROWS_WITH_AS(ColumnParallelLinear({.name = "block3.mlp.fc1", .in = 8, .out = 30, .tensor_size = 4}),
                       doctest::Contains("dim 0 (rows) = 30 is not divisible by the tensor size 4"), usage_error);
  CHECK_THROWS_WITH_AS(RowParallelLinear({.name = "block3.mlp.fc2", .in = 30, .out = 8, .tensor_size = 4}),
                       doctest::Contains("block3.mlp.fc2.weight"), usage_error);
  CHECK_THROWS_WITH_AS(VocabParallelEmbedding("wte", 10, 4, 4), doctest::Contains("not divisible by the tensor size 4"),
                       usage_error);
}

TEST_CASE("vocab-parallel embedding: the full lookup bit for bit; the gradient lands in the owner's rows only") {
  const std::int64_t vocab = 12;
  const std::size_t d = 3;
  const std::vector<std::int32_t> ids{0, 5, 11, 5, 7, 2};
  const auto table = values(static_cast<std::size_t>(vocab) * d, 40), dout = values(ids.size() * d, 41);
  std::vector<float> dtable1(table.size(), 0.0f);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    for (std::size_t k = 0; k < d; ++k) dtable1[static_cast<std::size_t>(ids[i]) * d + k] += dout[i * d + k];
  }
  for (int t : {2, 3}) {
    const auto got = comm::run_threads(t, [&](ThreadsCommunicator& tp) {
      const VocabParallelEmbedding emb("wte", vocab, d, t);
      const auto tr = shard(table, emb.table_shape(), emb.table_split(), tp.rank(), t);
      std::vector<float> out(ids.size() * d);
      emb.forward(tp, ids, tr, out);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        for (std::size_t k = 0; k < d; ++k) CHECK(out[i * d + k] == table[static_cast<std::size_t>(ids[i]) * d + k]);
      }
      std::vector<float> dtr(tr.size(), 0.0f);
      emb.backward(tp, ids, dout, dtr);
      CHECK(tp.stats()[OpKind::all_reduce].calls == 1);
      const std::vector<std::int32_t> bad{3, 12};
      CHECK_THROWS_WITH_AS(emb.forward(tp, bad, tr, std::span<float>(out).first(2 * d)), doctest::Contains("ids[1] = 12"),
                           usage_error);
      return dtr;
    });
    std::vector<float> merged(table.size(), 0.0f);
    for (int r = 0; r < t; ++r) put_shard<float>(got[r], {static_cast<std::size_t>(vocab), d}, TensorSplit::rows(), r, t, merged);
    CHECK(same_bits(merged, dtable1));
  }
}

TEST_CASE("vocab-parallel cross-entropy: the rank-order reference bit for bit, tensor size 1 to rounding, 3 all-reduces") {
  const std::int64_t vocab = 16;
  const std::size_t n = 7, V = 16;
  const std::vector<std::int32_t> targets{0, 15, 3, 8, 7, 12, 1};
  auto logits = values(n * V, 50);
  for (auto& l : logits) l *= 6.0f;
  const auto dloss = values(n, 51);
  // Tensor size 1: the whole row on one rank.
  std::vector<float> loss1(n), grad1(n * V);
  comm::run_threads(1, [&](ThreadsCommunicator& one) {
    VocabParallelCrossEntropy xe;
    xe.forward(one, logits, targets, vocab, loss1);
    xe.backward(one, logits, targets, vocab, dloss, grad1);
  });
  for (int t : {2, 4}) {
    CAPTURE(t);
    const auto ref = VocabParallelCrossEntropy::reference(logits, targets, vocab, t);
    const auto got = comm::run_threads(t, [&](ThreadsCommunicator& tp) {
      const auto lr = shard(logits, {n, V}, TensorSplit::cols(), tp.rank(), t);
      VocabParallelCrossEntropy xe;
      std::vector<float> loss(n), grad(lr.size());
      xe.forward(tp, lr, targets, vocab, loss);
      CHECK(same_bits(loss, ref));
      CHECK(max_abs_diff(loss, loss1) <= 1e-5f);
      CHECK(tp.stats()[OpKind::all_reduce].calls == 3);
      CHECK(tp.stats()[OpKind::all_reduce].payload_bytes == 3 * n * sizeof(float));
      xe.backward(tp, lr, targets, vocab, dloss, grad);
      CHECK(tp.stats()[OpKind::all_reduce].calls == 3);  // backward talks to no one
      return grad;
    });
    std::vector<float> merged(n * V);
    for (int r = 0; r < t; ++r) put_shard<float>(got[r], {n, V}, TensorSplit::cols(), r, t, merged);
    CHECK(max_abs_diff(merged, grad1) <= 1e-6f);
    // Each row of the gradient sums to zero (softmax minus one-hot), up to rounding.
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      for (std::size_t j = 0; j < V; ++j) s += merged[i * V + j];
      CHECK(std::abs(s) <= 1e-6);
    }
  }
}

TEST_CASE("tensor-parallel RNG: one shared stream, one per rank in regions, and split dropout equal to unsplit") {
  const auto streams = comm::run_threads(4, [](ThreadsCommunicator& tp) {
    const TensorParallelRng rng(1234, tp.rank());
    return std::pair{rng.shared(), rng.region()};
  });
  for (int r = 1; r < 4; ++r) {
    CHECK(streams[r].first == streams[0].first);
    CHECK_FALSE(streams[r].second == streams[0].second);
  }
  CHECK(TensorParallelRng(1234, 2).region() == TensorParallelRng(1234 + 1, 1).region());  // Megatron: seed + 2718 + rank
  CHECK_FALSE(TensorParallelRng(1234, 0).shared().at(1) == TensorParallelRng(1234, 0).shared().at(2));

  // Dropout of a [rows, cols] activation split by columns over 2 and 4 ranks equals the unsplit one.
  const std::size_t rows = 50, cols = 40;
  const auto x = values(rows * cols, 60);
  const RngStream s = TensorParallelRng(99, 0).shared().at(7);
  std::vector<float> whole = x;
  dropout(s, whole, 0.25f, 0);
  for (int t : {2, 4}) {
    std::vector<float> merged(x.size());
    for (int r = 0; r < t; ++r) {
      auto part = shard(x, {rows, cols}, TensorSplit::cols(), r, t);
      dropout_split_cols(s, part, 0.25f, cols, r, t);
      put_shard<float>(part, {rows, cols}, TensorSplit::cols(), r, t, merged);
    }
    CHECK(same_bits(merged, whole));
  }
  // The keep rate is 1 - p (100000 draws: 5 standard deviations is 0.0067).
  std::size_t kept = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) kept += s.keep(i, 0.25f) ? 1 : 0;
  CHECK(std::abs(static_cast<double>(kept) / 100000.0 - 0.75) < 0.0067);
  std::vector<float> bad(4);
  CHECK_THROWS_AS(dropout(s, bad, 1.0f, 0), usage_error);
  CHECK_THROWS_AS(dropout_split_cols(s, bad, 0.1f, 6, 0, 4), usage_error);
}
