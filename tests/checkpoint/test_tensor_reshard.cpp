// Checkpoints of parameters split across a tensor group (checkpoint/grid.hpp): saved at tensor 2 x
// data 2, loaded at tensor 1 x data 4, tensor 4 x data 1, on a plain communicator, and on the same
// grid; exported as whole tensors, and per tensor rank for K = 1, 2, 4 (export_tensor_parallel:
// each file the matching slice of the whole, also from a tensor 1 checkpoint given split rules).
//
// The model's gradients depend only on each element's index in the whole parameter and the step, and
// are small dyadic numbers (data-parallel averages are exact), with clipping off: every element then
// trains the same whatever the grid, stage or world size, so a run that saved and loaded elsewhere
// must end bit for bit where one uninterrupted run on another grid ends. That checks the masters, both
// Adam moments and the step count after every merge and split, element by element.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/checkpoint/grid.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/io/durable_file.hpp"
#include "zerotk/parallel/split.hpp"

namespace test_tensor_reshard {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using parallel::MatrixShape;
using parallel::TensorSplit;

namespace {

constexpr int kSteps = 3;

struct Spec {
  const char* name;
  MatrixShape full;
  TensorSplit split;
  bool matrix;  // 2-D (else a vector)
};
// Column-parallel rows, a fused QKV (3 stacked parts), a row-parallel weight's columns, replicated vectors.
const Spec kSpecs[] = {{"col.weight", {8, 6}, TensorSplit::rows(), true},  {"col.bias", {8, 1}, TensorSplit::rows(), false},
                       {"qkv.weight", {12, 4}, TensorSplit::rows(3), true}, {"row.weight", {6, 8}, TensorSplit::cols(), true},
                       {"norm.weight", {6, 1}, TensorSplit::replicated(), false}, {"row.bias", {6, 1}, TensorSplit::replicated(), false}};

TensorSplit split_of(std::string_view name) {
  for (const Spec& s : kSpecs) {
    if (name == s.name) return s.split;
  }
  return {};
}

std::uint32_t name_hash(std::string_view s) {
  std::uint32_t h = 2166136261u;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return h;
}

/// Element `full` of parameter `name` at step `step`: a multiple of 1/64 in [-8/64, 8/64].
float grad_of(std::string_view name, std::size_t full, int step) {
  return static_cast<float>(static_cast<int>((name_hash(name) + full * 7 + static_cast<std::size_t>(step) * 13) % 17) - 8) / 64.0f;
}

/// This tensor rank's shards (whole parameters at tensor size 1), initialised from the whole values.
struct SplitModel {
  int rank, size;
  std::vector<Param<float>> ps;
  std::vector<std::vector<float>> init;
  SplitModel(int r, int t) : rank(r), size(t) {
    for (const Spec& s : kSpecs) {
      const int n = s.split.is_split() ? t : 1;
      const MatrixShape sh = parallel::shard_shape(s.full, s.split, n);
      if (s.matrix) {
        ps.emplace_back(s.name, std::initializer_list<std::size_t>{sh.rows, sh.cols});
      } else {
        ps.emplace_back(s.name, std::initializer_list<std::size_t>{sh.rows});
      }
      std::vector<float> v(sh.numel());
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = 0.25f * static_cast<float>((name_hash(s.name) + 3 * parallel::full_index(i, s.full, s.split, r % n, n)) % 9);
      }
      init.push_back(std::move(v));
    }
    for (std::size_t k = 0; k < ps.size(); ++k) ps[k].bind(init[k].data(), nullptr);  // adopted by the engine
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& p : ps) visit(p.name(), p);
  }
  template <class E>
  void step(E& engine, int s) {
    { auto f = engine.forward(*this); }
    {
      auto b = engine.backward(*this);
      for (std::size_t k = 0; k < ps.size(); ++k) {
        const Spec& spec = kSpecs[k];
        const int n = spec.split.is_split() ? size : 1;
        for (std::size_t i = 0; i < ps[k].numel(); ++i) {
          ps[k].grads()[i] += grad_of(spec.name, parallel::full_index(i, spec.full, spec.split, rank % n, n), s);
        }
      }
    }
    engine.step(0.0);
  }
};

/// The same names and element count as SplitModel's whole parameters, row.weight 8 x 6 instead of 6 x 8.
struct OtherModel {
  Param<float> a{"col.weight", {8, 6}}, b{"col.bias", {8}}, q{"qkv.weight", {12, 4}}, r{"row.weight", {8, 6}},
      n{"norm.weight", {6}}, rb{"row.bias", {6}};
  template <class V>
  void parameters(V&& v) {
    for (Param<float>* p : {&a, &b, &q, &r, &n, &rb}) v(p->name(), *p);
  }
};

using Whole = std::map<std::string, std::vector<float>>;

/// Merges every tensor rank's shards into whole parameters (under `mu`).
void merge_into(Whole& out, SplitModel& m, std::mutex& mu) {
  std::lock_guard lock(mu);
  for (std::size_t k = 0; k < m.ps.size(); ++k) {
    const Spec& s = kSpecs[k];
    auto& w = out[s.name];
    w.resize(s.full.numel());
    const int n = s.split.is_split() ? m.size : 1;
    parallel::put_shard<float>(std::span<const float>(m.ps[k].data(), m.ps[k].numel()), s.full, s.split, m.rank % n, n, w);
  }
}

zerotk::EngineOptions options(int tensor) {
  zerotk::EngineOptions o;
  o.optimizer.lr = 1e-2f;
  o.optimizer.weight_decay = 0.01f;
  o.gradient_clipping = 0.0;  // each element on its own: the premise of the bitwise comparisons
  o.reduce_bucket_size = 40;  // several buckets and fragments
  o.stage3.param_persistence_threshold = 0;
  if (tensor > 1) o.tensor_split = split_of;
  return o;
}

template <int S>
using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<S>>, zerotk::Optimizer<zerotk::AdamW>, zerotk::Precision<zerotk::fp32>>;

/// `steps` steps on tensor x data thread ranks from the initial values, or after loading `load_dir`;
/// saves into `save_dir` at the end when given. Returns the whole parameters.
template <int S>
Whole run(int tensor, int data, int steps, const std::filesystem::path& save_dir = {}, const std::filesystem::path& load_dir = {},
          bool* resharded = nullptr) {
  Whole out;
  std::mutex mu;
  comm::run_threads(tensor * data, [&](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, {.tensor = tensor});
    SplitModel model(grid.tensor_index(), tensor);
    E<S> engine(grid, model, options(tensor));
    int first = 0;
    if (!load_dir.empty()) {
      const checkpoint::LoadResult r = checkpoint::load(engine, grid, load_dir);
      first = static_cast<int>(r.global_steps);
      if (resharded != nullptr && world.rank() == 0) *resharded = r.resharded;
    }
    for (int s = first; s < first + steps; ++s) model.step(engine, s);
    if (!save_dir.empty()) checkpoint::save(engine, grid, save_dir);
    auto g = engine.gather(model);
    if (grid.data_index() == 0) merge_into(out, model, mu);
  });
  return out;
}

/// The tensors of a safetensors file (fp32), found by name in its JSON header.
Whole read_safetensors(const std::filesystem::path& file) {
  const std::vector<std::byte> bytes = io::read_file(file);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian on this machine, as the format is
  const std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  Whole out;
  for (const Spec& s : kSpecs) {
    const std::size_t at = header.find("\"" + std::string(s.name) + "\"");
    REQUIRE(at != std::string::npos);
    const std::size_t offsets = header.find("\"data_offsets\":[", at) + 16;
    const std::uint64_t a = std::stoull(header.substr(offsets)), b = std::stoull(header.substr(header.find(',', offsets) + 1));
    REQUIRE(b - a == s.full.numel() * 4);
    std::vector<float> v(s.full.numel());
    std::memcpy(v.data(), bytes.data() + 8 + n + a, b - a);
    out[s.name] = std::move(v);
  }
  return out;
}

/// Tensor `name` of a safetensors file as fp32 (its byte count / 4 values).
std::vector<float> read_tensor(const std::filesystem::path& file, const std::string& name) {
  const std::vector<std::byte> bytes = io::read_file(file);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  const std::size_t at = header.find("\"" + name + "\":{");
  REQUIRE_MESSAGE(at != std::string::npos, name);
  const std::size_t offsets = header.find("\"data_offsets\":[", at) + 16;
  const std::uint64_t a = std::stoull(header.substr(offsets)), b = std::stoull(header.substr(header.find(',', offsets) + 1));
  std::vector<float> v((b - a) / 4);
  std::memcpy(v.data(), bytes.data() + 8 + n + a, b - a);
  return v;
}

/// Tensor rank k of K's shard of whole parameter `s`, cut with plain loops (Megatron's layout: each
/// fused part's rows, or columns, in K equal pieces, the parts' pieces one after the other).
std::vector<float> slice(const Spec& s, const std::vector<float>& whole, int k, int K) {
  if (!s.split.is_split()) return whole;
  const std::size_t R = s.full.rows, C = s.full.cols, P = static_cast<std::size_t>(s.split.parts), n = static_cast<std::size_t>(K);
  std::vector<float> out;
  if (s.split.dim == parallel::SplitDim::rows) {
    const std::size_t piece = R / P / n;
    for (std::size_t p = 0; p < P; ++p) {
      for (std::size_t r = p * (R / P) + static_cast<std::size_t>(k) * piece, e = r + piece; r < e; ++r) {
        for (std::size_t c = 0; c < C; ++c) out.push_back(whole[r * C + c]);
      }
    }
  } else {
    const std::size_t piece = C / P / n;
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t p = 0; p < P; ++p) {
        for (std::size_t c = p * (C / P) + static_cast<std::size_t>(k) * piece, e = c + piece; c < e; ++c) out.push_back(whole[r * C + c]);
      }
    }
  }
  return out;
}

bool same(const Whole& a, const Whole& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    if (!zt_test::same_bits(v, b.at(k))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a tensor 2 x data 2 checkpoint loads at tensor 1 x data 4, tensor 4 x data 1 and on a plain communicator, bitwise") {
  // The premise: uninterrupted runs on different grids and stages agree bit for bit.
  const Whole reference = run<2>(1, 4, 2 * kSteps);
  CHECK(same(run<2>(2, 2, 2 * kSteps), reference));
  CHECK(same(run<1>(4, 1, 2 * kSteps), reference));
  const Whole halfway = run<0>(1, 1, kSteps);
  CHECK_FALSE(same(halfway, reference));  // it trains

  zt_test::ScratchDir dir("tensor_reshard");
  const Whole saved = run<2>(2, 2, kSteps, dir.path());
  CHECK(same(saved, halfway));

  const checkpoint::Manifest m = checkpoint::verify(dir.path());
  CHECK(m.world_size == 4);
  CHECK(m.parameter_count == 8 * 6 + 8 + 12 * 4 + 6 * 8 + 6 + 6);  // every element once
  std::size_t shards = 0;
  for (const auto& p : m.shards.params) shards += p.is_shard() ? 1 : 0;
  CHECK(shards == 2 * 4);  // 4 split parameters, 2 shards each; the replicated ones once

  // Exported: whole tensors, bitwise the merged shards.
  checkpoint::export_safetensors(dir.path(), dir / "model.safetensors");
  CHECK(same(read_safetensors(dir / "model.safetensors"), saved));

  // Exported for K tensor ranks (the inference hand-off): file k holds rank k's shard of each split
  // parameter, cut by the declared split, and the replicated ones whole.
  for (const int K : {1, 2, 4}) {
    CAPTURE(K);
    const checkpoint::ExportResult r = checkpoint::export_tensor_parallel(dir.path(), dir / "tp.safetensors", K);
    REQUIRE(r.files.size() == static_cast<std::size_t>(K));
    CHECK(r.files.back().filename() == "tp-tp" + std::to_string(K - 1) + "-of-" + std::to_string(K) + ".safetensors");
    for (int k = 0; k < K; ++k) {
      for (const Spec& sp : kSpecs) {
        CAPTURE(sp.name);
        const std::vector<float> got = read_tensor(r.files[static_cast<std::size_t>(k)], sp.name);
        CHECK(got.size() == (sp.split.is_split() ? sp.full.numel() / static_cast<std::size_t>(K) : sp.full.numel()));
        CHECK(zt_test::same_bits(got, slice(sp, saved.at(sp.name), k, K)));
      }
    }
  }
  // A size a split cannot take is refused naming the parameter, before any file is written.
  CHECK_THROWS_WITH_AS(checkpoint::export_tensor_parallel(dir.path(), dir / "three.safetensors", 3),
                       doctest::Contains("col.weight [8, 6]"), usage_error);
  CHECK_FALSE(std::filesystem::exists(dir / "three-tp0-of-3.safetensors"));
  CHECK_THROWS_WITH_AS(
      checkpoint::export_tensor_parallel(dir.path(), dir / "x.safetensors", 2, {.splits = {{"col.*", TensorSplit::rows()}}}),
      doctest::Contains("records its parameters' tensor splits"), usage_error);
  {  // Saved at tensor 1 (no splits recorded): refused without rules, and with them the same files.
    zt_test::ScratchDir one("tensor_reshard_one");
    CHECK(same(run<2>(1, 4, kSteps, one.path()), halfway));
    CHECK_THROWS_WITH_AS(checkpoint::export_tensor_parallel(one.path(), one / "tp.safetensors", 2),
                         doctest::Contains("saved at tensor 1 and records no tensor splits"), usage_error);
    const checkpoint::ExportOptions rules{.splits = {{"col.*", TensorSplit::rows()},
                                                     {"qkv.weight", TensorSplit::rows(3)},
                                                     {"row.weight", TensorSplit::cols()}}};
    const checkpoint::ExportResult r = checkpoint::export_tensor_parallel(one.path(), one / "tp.safetensors", 2, rules);
    const checkpoint::ExportResult from_two = checkpoint::export_tensor_parallel(dir.path(), dir / "tp.safetensors", 2);
    for (std::size_t k = 0; k < 2; ++k) {
      for (const Spec& sp : kSpecs) CHECK(zt_test::same_bits(read_tensor(r.files[k], sp.name), read_tensor(from_two.files[k], sp.name)));
    }
  }

  bool resharded = false;
  SUBCASE("tensor 1 x data 4 at stage 3") {
    CHECK(same(run<3>(1, 4, kSteps, {}, dir.path(), &resharded), reference));
    CHECK(resharded);
  }
  SUBCASE("tensor 4 x data 1 at stage 1") {
    CHECK(same(run<1>(4, 1, kSteps, {}, dir.path(), &resharded), reference));
    CHECK(resharded);
  }
  SUBCASE("the same grid: every rank reads its own file") {
    CHECK(same(run<2>(2, 2, kSteps, {}, dir.path(), &resharded), reference));
    CHECK_FALSE(resharded);
  }
  SUBCASE("a plain communicator of 2 ranks at stage 0") {
    Whole out;
    std::mutex mu;
    comm::run_threads(2, [&](comm::ThreadsCommunicator& c) {
      SplitModel model(0, 1);
      E<0> engine(c, model, options(1));
      const checkpoint::LoadResult r = checkpoint::load(engine, c, dir.path());
      CHECK(r.saved_world_size == 4);
      for (int s = kSteps; s < 2 * kSteps; ++s) model.step(engine, s);
      if (c.rank() == 0) merge_into(out, model, mu);
    });
    CHECK(same(out, reference));
  }
}

TEST_CASE("tensor checkpoints: a whole shape that differs, or a split the shape cannot take, is an error naming the parameter") {
  zt_test::ScratchDir dir("tensor_reshard_bad");
  run<2>(2, 1, 1, dir.path());
  // Another model: the same names and element count, row.weight 8 x 6 instead of 6 x 8 (whole).
  comm::run_threads(1, [&](comm::ThreadsCommunicator& c) {
    OtherModel other;
    E<1> engine(c, other, options(1));
    try {
      checkpoint::load(engine, c, dir.path());
      FAIL("loaded a checkpoint of another model");
    } catch (const usage_error& e) {
      CHECK(std::string(e.what()).find("\"row.weight\" fp32 [6,8]") != std::string::npos);
      CHECK(std::string(e.what()).find("\"row.weight\" fp32 [8,6]") != std::string::npos);
    }
  });
  // A column split of a vector: refused at construction, on every rank, naming it.
  comm::run_threads(2, [&](comm::ThreadsCommunicator& world) {
    comm::ProcessGrid grid(world, {.tensor = 2});
    SplitModel model(grid.tensor_index(), 2);
    zerotk::EngineOptions o = options(2);
    o.tensor_split = [](std::string_view name) { return name == "norm.weight" ? TensorSplit::cols() : split_of(name); };
    try {
      E<1> engine(grid, model, o);
      FAIL("built an engine with a column split of a vector");
    } catch (const usage_error& e) {
      CHECK(e.where() == "norm.weight");
      CHECK(e.message().find("a column split needs a parameter of 2 dimensions") != std::string::npos);
    }
  });
}

}  // namespace test_tensor_reshard

namespace test_grid_table_order {

using namespace zerotk;

// Rank r's table of a model "a", its experts, "b": rank r holds experts [r * per, (r + 1) * per) of
// 4 (ranks past the 4 / per expert ranks repeat them), each parameter 2 elements, all in one group
// that the rank owns whole. Fragment i is parameter i's.
engine::ShardTable expert_table(int rank, int per) {
  engine::ShardTable t;
  const auto param = [&](const std::string& name) {
    engine::ShardParam p;
    p.name = name;
    p.shape = {2};
    p.numel = 2;
    p.dtype = "fp32";
    t.params.push_back(p);
  };
  param("a");
  const int first = rank * per % 4;
  for (int e = first; e < first + per; ++e) param("e" + std::to_string(e));
  param("b");
  std::vector<zero::Fragment> frags;
  for (std::uint32_t i = 0; i < t.params.size(); ++i) frags.push_back({i, 0, 2, 2 * i});
  // A rank's table lists every rank of its group (the grid table takes this rank's row): here each
  // row as this rank's own.
  t.fragments = {std::vector<std::vector<zero::Fragment>>(4, frags)};
  t.owned_numel = {std::vector<std::uint64_t>(4, 2 * t.params.size())};
  return t;
}

// The names in the grid table's order, and each rank's fragments by name.
std::pair<std::vector<std::string>, std::vector<std::vector<std::string>>> gathered(int per) {
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> owned;
  comm::run_threads(4, [&](comm::ThreadsCommunicator& world) {
    const engine::ShardTable t = checkpoint::gather_grid_table(world, expert_table(world.rank(), per), world.rank());
    if (world.rank() == 0) {
      for (const engine::ShardParam& p : t.params) names.push_back(p.name);
      for (const auto& rank : t.fragments.at(0)) {
        owned.emplace_back();
        for (const zero::Fragment& f : rank) owned.back().push_back(t.params.at(f.param).name);
      }
    }
    return 0;
  });
  return {names, owned};
}

TEST_CASE("grid table: entries in one order whatever the expert size, fragments following their entries") {
  const auto [one, one_owned] = gathered(1);  // expert parallel 4: one expert a rank
  const auto [two, two_owned] = gathered(2);  // expert parallel 2: two, ranks 2 and 3 repeating 0 and 1
  const std::vector<std::string> expected{"a", "e0", "e1", "e2", "e3", "b"};
  CHECK(one == expected);
  CHECK(two == expected);
  REQUIRE(one_owned.size() == 4);
  CHECK(one_owned[1] == std::vector<std::string>{"a", "e1", "b"});
  CHECK(one_owned[3] == std::vector<std::string>{"a", "e3", "b"});
  REQUIRE(two_owned.size() == 4);
  CHECK(two_owned[1] == std::vector<std::string>{"a", "e2", "e3", "b"});
  CHECK(two_owned[2] == std::vector<std::string>{"a", "e0", "e1", "b"});
}

}  // namespace test_grid_table_order
