// Typed wrappers, the process grid (Megatron rank order) and hierarchical all-reduce, on the
// threads back end.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

#include "reference.hpp"
#include "zerotk/comm.hpp"

namespace test_typed_grid {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using comm::ReduceOp;
using comm::ThreadsCommunicator;

TEST_CASE("typed wrappers: dtype from the element type, sizes checked before anything starts") {
  comm::run_threads(3, [](ThreadsCommunicator& c) {
    const int r = c.rank();
    std::vector<float> g(6, float(r + 1));
    comm::all_reduce(c, g, ReduceOp::avg).wait();
    CHECK(g[5] == 2.f);

    std::vector<half> flat(6);
    for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = half(float(i + r));
    comm::reduce_scatter_in_place(c, flat).wait();
    for (std::size_t i = 0; i < 2; ++i) {  // rank r's partition [2r, 2r+2): sum over ranks of (i + s)
      const std::size_t e = 2 * static_cast<std::size_t>(r) + i;
      CHECK(static_cast<float>(flat[e]) == float(3 * e + 3));
    }
    comm::all_gather_in_place(c, flat).wait();
    for (std::size_t e = 0; e < 6; ++e) CHECK(static_cast<float>(flat[e]) == float(3 * e + 3));

    std::array<std::int32_t, 3> send{r, r, r}, recv{};
    comm::all_to_all(c, send, recv).wait();
    CHECK(recv == std::array<std::int32_t, 3>{0, 1, 2});

    std::vector<std::uint8_t> bytes(4, static_cast<std::uint8_t>(r == 2 ? 9 : 0));
    comm::broadcast(c, bytes, 2).wait();
    CHECK(bytes[3] == 9);

    std::vector<double> out(r == 0 ? 2 : 0);
    comm::reduce(c, std::vector<double>{1.0, double(r)}, out, ReduceOp::max, 0).wait();
    if (r == 0) CHECK(out == std::vector<double>{1.0, 2.0});

    const std::size_t counts[3] = {0, 1, 2};
    std::vector<float> mine(static_cast<std::size_t>(r), float(r)), all(3);
    comm::all_gatherv(c, mine, all, counts).wait();
    CHECK(all == std::vector<float>{1.f, 2.f, 2.f});

    CHECK(comm::all_reduce_value(c, r == 1 ? 1 : 0, ReduceOp::max) == 1);
    CHECK(comm::all_reduce_value(c, 0.5 * r, ReduceOp::sum) == 1.5);

    std::vector<float> wrong(5), odd(7);
    CHECK_THROWS_AS(comm::all_reduce(c, g, wrong), usage_error);
    CHECK_THROWS_AS(comm::reduce_scatter(c, g, wrong), usage_error);
    CHECK_THROWS_AS(comm::all_gather(c, g, wrong), usage_error);
    CHECK_THROWS_AS(comm::reduce_scatter_in_place(c, odd), usage_error);
    CHECK_THROWS_AS(comm::all_gatherv(c, mine, wrong, counts), usage_error);
    c.barrier().wait();  // nothing was posted by the failed calls
  });
}

TEST_CASE("AnyCommunicator over the threads back end, including split") {
  comm::run_threads(4, [](ThreadsCommunicator& c) {
    comm::AnyCommunicator any(c);
    comm::AnyCommunicator pair = any.split(c.rank() / 2, 0);
    std::int32_t x = c.rank(), y = 0;
    pair.all_reduce(&x, &y, 1, DType::int32, ReduceOp::sum).wait();
    CHECK(y == (c.rank() < 2 ? 1 : 5));
    CHECK(pair.stats()[comm::OpKind::all_reduce].calls == 1);
  });
}

namespace {

struct Coordinates {
  int d, p, t;
  std::vector<std::int32_t> tensor, data, pipeline, model;  // world ranks of each group, in group order
};

/// World ranks of the members of `g`, gathered through `g` itself.
std::vector<std::int32_t> members(ThreadsCommunicator& g, int world_rank) {
  std::vector<std::int32_t> all(static_cast<std::size_t>(g.size()));
  comm::all_gather(g, std::array<std::int32_t, 1>{world_rank}, all).wait();
  return all;
}

}  // namespace

TEST_CASE("process grid: Megatron order, tensor ranks adjacent; every group holds the closed-form members") {
  struct Shape {
    int world;
    comm::GridShape shape;
    int data;  // expected (inferred)
  };
  for (const Shape& s : {Shape{8, {0, 2, 2}, 2}, Shape{12, {3, 2, 2}, 3}, Shape{6, {0, 3, 1}, 2},
                         Shape{4, {0, 1, 4}, 1}, Shape{1, {}, 1}}) {
    INFO("world ", s.world, ", pipeline ", s.shape.pipeline, ", tensor ", s.shape.tensor);
    const int dp = s.data, pp = s.shape.pipeline, tp = s.shape.tensor;
    const auto got = comm::run_threads(s.world, [&](ThreadsCommunicator& world) {
      comm::ProcessGrid grid(world, s.shape);
      Coordinates k{grid.data_index(), grid.pipeline_index(), grid.tensor_index(), {}, {}, {}, {}};
      CHECK(grid.shape().data == dp);
      CHECK(comm::ProcessGrid<ThreadsCommunicator>::world_rank_of(grid.shape(), k.d, k.p, k.t) == world.rank());
      k.tensor = members(grid.tensor(), world.rank());
      k.data = members(grid.data(), world.rank());
      k.pipeline = members(grid.pipeline(), world.rank());
      k.model = members(grid.model(), world.rank());
      return k;
    });
    for (int w = 0; w < s.world; ++w) {
      const Coordinates& k = got[static_cast<std::size_t>(w)];
      const auto at = [&](int d, int p, int t) { return (p * dp + d) * tp + t; };
      CHECK(w == at(k.d, k.p, k.t));
      std::vector<std::int32_t> tensor, data, pipeline, model;
      for (int t = 0; t < tp; ++t) tensor.push_back(at(k.d, k.p, t));
      for (int d = 0; d < dp; ++d) data.push_back(at(d, k.p, k.t));
      for (int p = 0; p < pp; ++p) pipeline.push_back(at(k.d, p, k.t));
      for (int p = 0; p < pp; ++p) {
        for (int t = 0; t < tp; ++t) model.push_back(at(k.d, p, t));
      }
      CHECK(k.tensor == tensor);
      CHECK(k.data == data);
      CHECK(k.pipeline == pipeline);
      CHECK(k.model == model);
    }
  }
  CHECK_THROWS_AS(comm::run_threads(8, [](ThreadsCommunicator& w) { comm::ProcessGrid g(w, {0, 3, 1}); }),
                  config_error);
  CHECK_THROWS_AS(comm::run_threads(4, [](ThreadsCommunicator& w) { comm::ProcessGrid g(w, {2, 1, 1}); }),
                  config_error);
}

TEST_CASE("process grid: the expert layout folds expert_tensor x expert x expert_data over each stage's ranks") {
  struct Shape {
    int world;
    comm::GridShape shape;
  };
  // (16: pipeline 2 x data 4 x tensor 2, experts 4 x expert-data 2, or expert-tensor 2 x experts 2 x
  // expert-data 2; 8: data 8, experts 8; 4: data 2 x tensor 2, experts 1, so expert-data spans 4.)
  for (const Shape& s : {Shape{16, {.data = 4, .pipeline = 2, .tensor = 2, .expert = 4}},
                         Shape{16, {.data = 4, .pipeline = 2, .tensor = 2, .expert = 2, .expert_tensor = 2}},
                         Shape{8, {.data = 8, .expert = 8}}, Shape{4, {.data = 2, .tensor = 2}}}) {
    const int et = s.shape.expert_tensor, ep = s.shape.expert, stage = s.shape.data * s.shape.tensor;
    const int edp = stage / (et * ep);
    INFO("world ", s.world, ", expert_tensor ", et, ", expert ", ep);
    comm::run_threads(s.world, [&](ThreadsCommunicator& world) {
      comm::ProcessGrid grid(world, s.shape);
      const int w = world.rank(), p = grid.pipeline_index();
      CHECK(grid.expert_data_size() == edp);
      // Megatron's folding with the pipeline outermost: w = p * stage + et_i + et * (ep_i + ep * edp_i).
      const int q = w % stage;
      CHECK(grid.expert_tensor_index() == q % et);
      CHECK(grid.expert_index() == (q / et) % ep);
      CHECK(grid.expert_data_index() == q / (et * ep));
      const auto at = [&](int t, int e, int d) { return p * stage + t + et * (e + ep * d); };
      std::vector<std::int32_t> experts, expert_data, expert_tensor;
      for (int e = 0; e < ep; ++e) experts.push_back(at(grid.expert_tensor_index(), e, grid.expert_data_index()));
      for (int d = 0; d < edp; ++d) expert_data.push_back(at(grid.expert_tensor_index(), grid.expert_index(), d));
      for (int t = 0; t < et; ++t) expert_tensor.push_back(at(t, grid.expert_index(), grid.expert_data_index()));
      CHECK(members(grid.expert(), w) == experts);
      CHECK(members(grid.expert_data(), w) == expert_data);
      CHECK(members(grid.expert_tensor(), w) == expert_tensor);
    });
  }
  // 3 experts do not divide 4 ranks per stage; the error names the sizes.
  try {
    comm::run_threads(4, [](ThreadsCommunicator& w) { comm::ProcessGrid g(w, {.data = 4, .expert = 3}); });
    FAIL("no config_error");
  } catch (const config_error& e) {
    CHECK(std::string(e.what()).find("3 x 1") != std::string::npos);
  }
}

TEST_CASE("process grid: the context layout folds inside data, context fastest (Megatron's tp-cp-dp-pp)") {
  // 16 ranks: tensor 2 x context 2 x 2 replicas x pipeline 2, so w = t + 2 (c + 2 (r + 2 p)).
  comm::run_threads(16, [](ThreadsCommunicator& world) {
    const int w = world.rank();
    comm::ProcessGrid g(world, {.pipeline = 2, .tensor = 2, .context = 2});
    CHECK(g.data().size() == 4);  // the engine's group (gradients, ZeRO): data x context
    CHECK(g.context_size() == 2);
    CHECK(g.replica_count() == 2);
    CHECK(g.tensor_index() == w % 2);
    CHECK(g.context_index() == w / 2 % 2);
    CHECK(g.replica_index() == w / 4 % 2);
    CHECK(g.pipeline_index() == w / 8);
    CHECK(g.data_index() == g.replica_index() * 2 + g.context_index());
    // The context group: the ranks differing only in their context index, ordered by it.
    CHECK(g.context().rank() == g.context_index());
    const int first = w - 2 * g.context_index();
    CHECK(members(g.context(), w) == std::vector<std::int32_t>{first, first + 2});
    // The expert layout folds over each stage's tensor x context x data ranks, as Megatron's over tp x cp x dp.
    comm::ProcessGrid e(world, {.pipeline = 2, .tensor = 2, .expert = 4, .expert_tensor = 2, .context = 2});
    CHECK(e.expert_data_size() == 1);
    CHECK(e.expert_index() == w / 2 % 4);
    // Without a context layout every context group is the rank alone, and a replica a data rank.
    comm::ProcessGrid flat(world, {.tensor = 2});
    CHECK(flat.context().size() == 1);
    CHECK(flat.replica_index() == flat.data_index());
  });
  CHECK_THROWS_WITH_AS(comm::run_threads(4, [](ThreadsCommunicator& w) { comm::ProcessGrid g(w, {.context = 3}); }),
                       doctest::Contains("GridShape::context: must divide the data ranks (4)"), config_error);
  CHECK_THROWS_WITH_AS(comm::run_threads(2, [](ThreadsCommunicator& w) { comm::ProcessGrid g(w, {.context = 0}); }),
                       doctest::Contains("(got 0)"), config_error);
}

// NodeGroups / hierarchical_all_reduce are deprecated (HierarchicalCommunicator replaces them) and
// stay tested until they are removed.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
namespace {

/// Runs a flat and a hierarchical all-reduce of the same data; returns (flat, hierarchical) per rank.
template <class T, class MakeGroups>
auto flat_and_hierarchical(int w, std::size_t n, ReduceOp op, bool exact, comm::ThreadsOptions opts,
                           MakeGroups make_groups) {
  return comm::run_threads(
      w,
      [&](ThreadsCommunicator& c) {
        auto groups = make_groups(c);
        const auto x = test::make_data<T>(3, c.rank(), n, exact);
        std::vector<T> flat(n), hier(n);
        c.all_reduce(x.data(), flat.data(), n, dtype_of_v<T>, op).wait();
        comm::hierarchical_all_reduce(groups, x.data(), hier.data(), n, dtype_of_v<T>, op).wait();
        return std::pair(flat, hier);
      },
      opts);
}

}  // namespace

TEST_CASE_TEMPLATE("hierarchical all-reduce equals the flat one bit for bit when sums are exact", T, float, half,
                   bfloat16, std::int32_t) {
  comm::ThreadsOptions opts;
  opts.ranks_per_node = 4;  // 8 ranks on 2 simulated nodes
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    INFO("op ", comm::to_string(op));
    const auto out = flat_and_hierarchical<T>(8, 1003, op, true, opts, [](ThreadsCommunicator& c) {
      comm::NodeGroups<ThreadsCommunicator> g(c);
      CHECK(g.node_count() == 2);
      CHECK(g.world_size() == 8);
      CHECK(g.is_leader() == (c.rank() % 4 == 0));
      return g;
    });
    for (const auto& [flat, hier] : out) CHECK(test::compare_bits("hierarchical", hier.data(), flat.data(), flat.size()) == "");
  }
}

TEST_CASE("hierarchical all-reduce: uneven and interleaved nodes, random data") {
  comm::ThreadsOptions opts;
  opts.ranks_per_node = 4;  // 6 ranks: nodes of 4 and 2
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    const auto uneven = flat_and_hierarchical<float>(6, 5000, op, false, opts, [](ThreadsCommunicator& c) {
      comm::NodeGroups<ThreadsCommunicator> g(c);
      CHECK(g.node_count() == 2);
      return g;
    });
    // the grouping differs from rank order: equal up to rounding
    for (const auto& [flat, hier] : uneven) {
      for (std::size_t i = 0; i < flat.size(); ++i) CHECK(hier[i] == doctest::Approx(flat[i]).epsilon(1e-5));
    }
    const auto uneven_int = flat_and_hierarchical<std::int32_t>(6, 5000, op, false, opts, [](ThreadsCommunicator& c) {
      return comm::NodeGroups<ThreadsCommunicator>(c);
    });
    for (const auto& [flat, hier] : uneven_int) CHECK(hier == flat);  // integer sums: exact, avg divided once
  }
  // nodes given by color, not contiguous: {0,3}, {1,4}, {2,5}
  const auto by_color = flat_and_hierarchical<std::int32_t>(6, 100, ReduceOp::sum, false, {}, [](ThreadsCommunicator& c) {
    return comm::NodeGroups<ThreadsCommunicator>(c, c.rank() % 3);
  });
  for (const auto& [flat, hier] : by_color) CHECK(hier == flat);
}
#pragma GCC diagnostic pop

}  // namespace test_typed_grid
