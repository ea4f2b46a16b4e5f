// The libtorch adapter (zerotk/interop/torch.hpp): a torch::nn::Sequential trained with one
// loss.backward() per step on thread ranks, against a plain libtorch data-parallel loop written
// here (gradients averaged by hand, torch::optim::AdamW), across stages 0-3, with offload,
// checkpoints and their export, recomputed dropout, a modelled network link, and its errors.
// glog (through libtorch) defines CHECK too: use doctest's prefixed macros only.
#define DOCTEST_CONFIG_NO_SHORT_MACRO_NAMES
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <zerotk/comm/threads.hpp>
#include <zerotk/engines.hpp>  // the compiled engine set's types linked, when the suite links it
#include <zerotk/interop/torch.hpp>

#include "common/modelled_link.hpp"  // bench/common: the threads communicator slowed to a modelled link
#if ZEROTK_HAS_XXHASH
#include <zerotk/checkpoint.hpp>
#include <zerotk/checkpoint/export.hpp>

#include "../checkpoint/reference_dump.hpp"  // the dump read_safetensors.py compares a file with
#endif
#if ZEROTK_HAS_XXHASH && ZEROTK_HAS_JSON
#include <fstream>

#include <nlohmann/json.hpp>
#endif

using namespace zerotk;
using interop::TorchGradients;
using interop::TorchModel;

namespace {

constexpr int kIn = 8, kHidden = 24, kOut = 4, kBatch = 16;
constexpr int kVocab = 11, kDim = 6;
constexpr double kLr = 1e-2, kWeightDecay = 0.01;

/// Each parameter once (libtorch's parameters() lists a tied tensor under every name).
std::vector<torch::Tensor> unique_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    bool seen = false;
    for (const auto& q : out) seen = seen || q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    if (!seen) out.push_back(p);
  }
  return out;
}

std::vector<float> flatten(torch::nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : unique_params(m)) {
    const torch::Tensor c = p.detach().contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

/// The regression task: an MLP of Linear layers, mean squared error against a fixed function.
struct MlpTask {
  using Net = torch::nn::Sequential;
  static Net make() {
    torch::manual_seed(7);  // every rank (and the reference) starts from the same weights
    return torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::Tanh(),
                                 torch::nn::Linear(kHidden, kHidden), torch::nn::ReLU(),
                                 torch::nn::Linear(kHidden, kOut));
  }
  static torch::Tensor loss(Net& net, const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(net->forward(x), y);
  }
  /// Through the adapter: each child a unit (gathered around its forward at stage 3).
  template <class G>
  static torch::Tensor loss(G& grads, Net& net, const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(grads.forward(net, x), y);
  }
  static void draw(torch::Tensor& x, torch::Tensor& y, const torch::Tensor& w) {
    x = torch::randn({kBatch, kIn});
    y = torch::sin(x.matmul(w));
  }
  static torch::Tensor teacher() { return torch::randn({kIn, kOut}); }
};

/// A tied head: the output projection is the embedding's own tensor, registered in two modules.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(torch::Tensor w) { weight = register_parameter("weight", std::move(w)); }
  torch::Tensor forward(const torch::Tensor& h) { return h.matmul(weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);

struct TiedLmImpl : torch::nn::Module {
  TiedLmImpl() {
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    mid = register_module("mid", torch::nn::Linear(kDim, kDim));
    head = register_module("head", TiedHead(emb->weight));
  }
  torch::Tensor forward(const torch::Tensor& idx) { return head(torch::tanh(mid(emb(idx)))); }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear mid{nullptr};
  TiedHead head{nullptr};
};
TORCH_MODULE(TiedLm);

/// Next-token prediction of a fixed permutation with the tied model.
struct TiedTask {
  using Net = TiedLm;
  static Net make() {
    torch::manual_seed(11);
    return TiedLm();
  }
  static torch::Tensor loss(Net& net, const torch::Tensor& x, const torch::Tensor& y) {
    return torch::cross_entropy_loss(net->forward(x), y);
  }
  template <class G>
  static torch::Tensor loss(G&, Net& net, const torch::Tensor& x, const torch::Tensor& y) {
    return loss(net, x, y);
  }
  static void draw(torch::Tensor& x, torch::Tensor& y, const torch::Tensor& perm) {
    x = torch::randint(kVocab, {kBatch}, torch::kLong);
    y = perm.index_select(0, x);
  }
  static torch::Tensor teacher() { return torch::randperm(kVocab, torch::kLong); }
};

/// [step][rank] inputs and targets, drawn once on the main thread (libtorch's generator is global).
struct Data {
  std::vector<std::vector<torch::Tensor>> x, y;
  template <class Task>
  static Data draw(int steps, int world) {
    Data d;
    d.x.resize(static_cast<std::size_t>(steps));
    d.y.resize(static_cast<std::size_t>(steps));
    torch::manual_seed(1234);
    const torch::Tensor t = Task::teacher();
    for (auto s = 0u; s < d.x.size(); ++s)
      for (int r = 0; r < world; ++r) {
        torch::Tensor x, y;
        Task::draw(x, y, t);
        d.x[s].push_back(x);
        d.y[s].push_back(y);
      }
    return d;
  }
};

struct Run {
  std::vector<double> losses;    // [step] mean over ranks, as the engine reports it
  std::vector<float> params;     // rank 0's parameters after the last step (the engine gone), flattened
  std::size_t params_bytes = 0, grads_bytes = 0, master_bytes = 0, optim_bytes = 0;  // rank 0's ledger
  std::size_t pinned_master_bytes = 0, pinned_params_bytes = 0;  // of which in pinned host memory
  std::size_t disk_master_bytes = 0, disk_params_bytes = 0;      // and of which on disk (NVMe offload)
  std::size_t host_master_bytes = 0;                             // in plain host memory
  double psi = 0, psi_padded = 0;
  std::size_t buckets = 0;
  bool empty_outside_scopes = false;
  std::size_t hooked = 0;         // gradients the hooks handed over in the last backward
  std::uint64_t reductions_in_backward = 0;  // reduce(-scatter) / all-reduce calls issued inside it
};

template <int S, class... More>
using TorchEngine = Engine<Partitioner<Stage<S>>, Optimizer<AdamW>, More...>;

EngineOptions adamw_options() {
  EngineOptions o;
  o.stage3.param_persistence_threshold = 0;  // stage 3 really releases every parameter
  o.optimizer.lr = kLr;
  o.optimizer.weight_decay = kWeightDecay;
  o.gradient_clipping = 0;
  return o;
}

template <class C>
std::uint64_t reduction_calls(const C& comm) {
  return comm.stats()[comm::OpKind::reduce_scatter].calls + comm.stats()[comm::OpKind::all_reduce].calls;
}

/// Optional checkpoint work around a training run: load before the first step, save after the last.
struct Checkpointing {
  std::string load_dir, save_dir;
  std::size_t first_step = 0;  // the data index of the first step (a resumed run starts later)
};

template <class Task, class E>
Run train_zerotk(int world, const Data& data, EngineOptions o = adamw_options(), const Checkpointing& ck = {}) {
  std::vector<typename Task::Net> nets;
  for (int r = 0; r < world; ++r) nets.push_back(Task::make());
  Run run;
  comm::run_threads(world, [&](auto& comm) {
    at::set_num_threads(1);
    auto& net = nets[static_cast<std::size_t>(comm.rank())];
    TorchModel model(*net);
    {
      E engine(comm, model, o);
      TorchGradients grads(engine, model);
      const auto r = static_cast<std::size_t>(comm.rank());
#if ZEROTK_HAS_XXHASH
      if (!ck.load_dir.empty()) checkpoint::load(engine, comm, ck.load_dir);
#endif
      for (std::size_t s = ck.first_step; s < data.x.size(); ++s) {
        torch::Tensor loss = Task::loss(grads, net, data.x[s][r], data.y[s][r]);
        const std::uint64_t before = reduction_calls(comm);
        grads.backward(loss);
        const std::uint64_t in_backward = reduction_calls(comm) - before;
        const std::size_t hooked = grads.gradients_received();
        const StepReport rep = grads.step(loss.item<double>());
        if (comm.rank() == 0) {
          run.losses.push_back(rep.loss);
          run.hooked = hooked;
          run.reductions_in_backward = in_backward;
        }
      }
#if ZEROTK_HAS_XXHASH
      if (!ck.save_dir.empty()) checkpoint::save(engine, comm, ck.save_dir);
#endif
      bool empty = true;  // stage 3: outside scopes every parameter tensor is empty
      for (std::size_t i = 0; i < model.size(); ++i) empty = empty && model[i].tensor().numel() == 0;
      grads.release_module();  // collective at stage 3
      if (comm.rank() == 0) {
        run.empty_outside_scopes = empty;
        const auto& m = engine.memory();
        run.params_bytes = m.live(MemoryCategory::params16);
        run.grads_bytes = m.live(MemoryCategory::grads);
        run.master_bytes = m.live(MemoryCategory::master32);
        run.pinned_master_bytes = m.live(MemorySpace::pinned_host, MemoryCategory::master32);
        run.pinned_params_bytes = m.live(MemorySpace::pinned_host, MemoryCategory::params16);
        run.disk_master_bytes = m.live(MemorySpace::disk, MemoryCategory::master32);
        run.disk_params_bytes = m.live(MemorySpace::disk, MemoryCategory::params16);
        run.host_master_bytes = m.live(MemorySpace::host, MemoryCategory::master32);
        run.optim_bytes = m.live(MemoryCategory::optimizer_state);
        run.psi = static_cast<double>(engine.parameter_count());
        run.psi_padded = static_cast<double>(engine.flat_numel());
        run.buckets = engine.bucket_count();
      }
    }  // TorchGradients gave the tensors their own copies back: the module outlives the engine
    if (comm.rank() == 0) run.params = flatten(*net);
  });
  return run;
}

/// Plain libtorch data parallelism, no zerotk: every replica runs its own batch, the gradients are
/// averaged by hand over the replicas (what an all-reduce does), each replica steps torch's AdamW.
template <class Task>
Run train_reference(int world, const Data& data) {
  at::set_num_threads(1);
  std::vector<typename Task::Net> nets;
  std::vector<torch::optim::AdamW> opts;
  for (int r = 0; r < world; ++r) {
    nets.push_back(Task::make());
    opts.emplace_back(unique_params(*nets.back()),
                      torch::optim::AdamWOptions(kLr).betas({0.9, 0.999}).eps(1e-8).weight_decay(kWeightDecay));
  }
  Run run;
  for (std::size_t s = 0; s < data.x.size(); ++s) {
    double loss = 0;
    for (int r = 0; r < world; ++r) {
      const auto k = static_cast<std::size_t>(r);
      nets[k]->zero_grad();
      torch::Tensor l = Task::loss(nets[k], data.x[s][k], data.y[s][k]);
      l.backward();
      loss += l.item<double>();
    }
    const std::size_t count = unique_params(*nets[0]).size();
    for (std::size_t j = 0; j < count; ++j) {
      torch::Tensor sum = torch::zeros_like(unique_params(*nets[0])[j]);
      for (auto& n : nets) sum += unique_params(*n)[j].grad();
      const torch::Tensor avg = sum / world;
      for (auto& n : nets) unique_params(*n)[j].mutable_grad() = avg.clone();
    }
    for (auto& opt : opts) opt.step();
    run.losses.push_back(loss / world);
  }
  run.params = flatten(*nets[0]);
  return run;
}

struct Diff {
  double loss = 0, param = 0;
};
Diff max_diff(const Run& a, const Run& b) {
  Diff d;
  for (std::size_t s = 0; s < a.losses.size() && s < b.losses.size(); ++s)
    d.loss = std::max(d.loss, std::fabs(a.losses[s] - b.losses[s]));
  for (std::size_t i = 0; i < a.params.size() && i < b.params.size(); ++i)
    d.param = std::max(d.param, double(std::fabs(a.params[i] - b.params[i])));
  return d;
}

}  // namespace

DOCTEST_TEST_CASE("torch: one loss.backward() per step; stages 0, 1, 2 give bitwise the same parameters and match a "
                  "plain libtorch data-parallel AdamW loop") {
  constexpr int kWorld = 2, kSteps = 50;
  const Data data = Data::draw<MlpTask>(kSteps, kWorld);
  const Run ref = train_reference<MlpTask>(kWorld, data);
  const Run s0 = train_zerotk<MlpTask, TorchEngine<0>>(kWorld, data);
  const Run s1 = train_zerotk<MlpTask, TorchEngine<1>>(kWorld, data);
  const Run s2 = train_zerotk<MlpTask, TorchEngine<2>>(kWorld, data);

  DOCTEST_REQUIRE(s0.losses.size() == kSteps);
  DOCTEST_REQUIRE(ref.params.size() == s0.params.size());
  DOCTEST_CHECK(s0.hooked == 6);  // 3 Linear layers x (weight, bias): every gradient came through a hook
  DOCTEST_CHECK(s2.hooked == 6);
  DOCTEST_CHECK(s0.params == s1.params);
  DOCTEST_CHECK(s0.params == s2.params);
  DOCTEST_CHECK(s0.losses == s1.losses);
  DOCTEST_CHECK(s0.losses == s2.losses);

  const Diff d = max_diff(s0, ref);
  std::printf("torch MLP vs libtorch DDP + AdamW, %d steps on %d ranks: loss %.6f -> %.6f, max |loss diff| %.3g, "
              "max |param diff| %.3g\n",
              kSteps, kWorld, ref.losses.front(), ref.losses.back(), d.loss, d.param);
  DOCTEST_CHECK(ref.losses.back() < 0.7 * ref.losses.front());  // it trains
  DOCTEST_CHECK(d.loss < 1e-5);
  DOCTEST_CHECK(d.param < 1e-4);
}

DOCTEST_TEST_CASE("torch: stage 3 gathers each child around its forward and again around its backward, which runs "
                  "the child's kept graph; bitwise stage 2's parameters") {
  constexpr int kWorld = 2, kSteps = 20;
  const Data data = Data::draw<MlpTask>(kSteps, kWorld);
  const Run s2 = train_zerotk<MlpTask, TorchEngine<2>>(kWorld, data);
  const Run s3 = train_zerotk<MlpTask, TorchEngine<3>>(kWorld, data);
  const Run ref = train_reference<MlpTask>(kWorld, data);
  DOCTEST_CHECK(s3.empty_outside_scopes);
  DOCTEST_CHECK(!s2.empty_outside_scopes);
  DOCTEST_CHECK(s3.hooked == 6);  // every gradient handed over (by the children's backward)
  DOCTEST_CHECK(s3.losses == s2.losses);
  DOCTEST_CHECK(s3.params == s2.params);
  const Diff d = max_diff(s3, ref);
  std::printf("torch MLP stage 3 vs libtorch DDP + AdamW, %d steps: max |loss diff| %.3g, max |param diff| %.3g\n",
              kSteps, d.loss, d.param);
  DOCTEST_CHECK(d.loss < 1e-5);
  // Released after every scope (the backward gathers again, into whichever pool buffer is free),
  // with and without prefetch; and kept gathered from each child's forward to its backward.
  EngineOptions o = adamw_options();
  o.stage3.max_reuse_distance = 0;
  const Run released = train_zerotk<MlpTask, TorchEngine<3>>(kWorld, data, o);
  o.stage3.prefetch_bucket_size = 0;
  const Run unprefetched = train_zerotk<MlpTask, TorchEngine<3>>(kWorld, data, o);
  o.stage3.reshard_after_forward = false;
  const Run kept = train_zerotk<MlpTask, TorchEngine<3>>(kWorld, data, o);
  for (const Run* r : {&released, &unprefetched, &kept}) {
    DOCTEST_CHECK(r->empty_outside_scopes);
    DOCTEST_CHECK(r->losses == s2.losses);
    DOCTEST_CHECK(r->params == s2.params);
  }
}

DOCTEST_TEST_CASE("torch: gradient accumulation over micro-steps: stage 2 equals stage 0 reducing every micro-step") {
  EngineOptions o = adamw_options();
  o.gradient_accumulation_steps = 2;
  const Data data = Data::draw<MlpTask>(20, 2);  // 20 micro-steps = 10 optimizer steps
  using Stage0Every = Engine<Partitioner<Stage<0>, when::every_micro_step>, Optimizer<AdamW>>;
  const Run s0 = train_zerotk<MlpTask, Stage0Every>(2, data, o);
  const Run s2 = train_zerotk<MlpTask, TorchEngine<2>>(2, data, o);
  MlpTask::Net initial = MlpTask::make();
  DOCTEST_CHECK(s0.params == s2.params);
  DOCTEST_CHECK(s2.params != flatten(*initial));  // it trained
}

DOCTEST_TEST_CASE("torch: bf16 (float tensors over the engine's 16-bit storage): stages 0-3 bitwise identical") {
  const Data data = Data::draw<MlpTask>(20, 2);
  const Run s0 = train_zerotk<MlpTask, TorchEngine<0, Precision<bf16>>>(2, data);
  const Run s1 = train_zerotk<MlpTask, TorchEngine<1, Precision<bf16>>>(2, data);
  const Run s2 = train_zerotk<MlpTask, TorchEngine<2, Precision<bf16>>>(2, data);
  const Run s3 = train_zerotk<MlpTask, TorchEngine<3, Precision<bf16>>>(2, data);
  const Run f32 = train_zerotk<MlpTask, TorchEngine<2>>(2, data);
  DOCTEST_CHECK(s0.params == s1.params);
  DOCTEST_CHECK(s0.params == s2.params);
  DOCTEST_CHECK(s0.params == s3.params);
  DOCTEST_CHECK(s0.losses == s3.losses);
  const Diff d = max_diff(s2, f32);
  std::printf("torch MLP bf16 vs fp32, 20 steps: max |loss diff| %.3g, max |param diff| %.3g\n", d.loss, d.param);
  DOCTEST_CHECK(d.loss > 0);     // the 16-bit rounding is real
  DOCTEST_CHECK(d.loss < 2e-2);  // and small
  for (float v : s0.params) {    // every value the module holds afterwards is a bf16 value
    const bfloat16 b(v);
    DOCTEST_REQUIRE(float(b) == v);
  }
}

DOCTEST_TEST_CASE("torch: fp16 with dynamic loss scaling (grads.backward scales the loss): stages 0 and 3 agree") {
  const Data data = Data::draw<MlpTask>(20, 2);
  const Run s0 = train_zerotk<MlpTask, TorchEngine<0, Precision<fp16>>>(2, data);
  const Run s3 = train_zerotk<MlpTask, TorchEngine<3, Precision<fp16>>>(2, data);
  const Run f32 = train_zerotk<MlpTask, TorchEngine<0>>(2, data);
  DOCTEST_CHECK(s0.params == s3.params);
  const Diff d = max_diff(s0, f32);
  std::printf("torch MLP fp16 vs fp32, 20 steps: max |loss diff| %.3g, max |param diff| %.3g\n", d.loss, d.param);
  DOCTEST_CHECK(d.loss > 0);
  // Without the loss scale in backward the gradients come out 65536 times too small: measured then
  // 8.1e-3 (loss) and 5.7e-2 (parameters); with it 5.8e-4 and 8.3e-3.
  DOCTEST_CHECK(d.loss < 3e-3);
  DOCTEST_CHECK(d.param < 2e-2);
}

#if ZEROTK_HAS_XXHASH
DOCTEST_TEST_CASE("torch: a checkpoint saved at stage 2 on 2 ranks loads at stage 3 on 2 and on 3 ranks") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zerotk_interop_torch_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const Data data = Data::draw<MlpTask>(10, 2);
  Data first_half = data;
  first_half.x.resize(5);
  first_half.y.resize(5);
  const Run saved = train_zerotk<MlpTask, TorchEngine<2>>(2, first_half, adamw_options(), {"", dir.string(), 0});
  const Run straight = train_zerotk<MlpTask, TorchEngine<2>>(2, data);
  // Resumed at stage 3 on the same 2 ranks: bitwise the run that never stopped (stages agree bitwise).
  const Run resumed = train_zerotk<MlpTask, TorchEngine<3>>(2, data, adamw_options(), {dir.string(), "", 5});
  DOCTEST_CHECK(resumed.params == straight.params);
  DOCTEST_CHECK(resumed.params != saved.params);
  // On 3 ranks: the loaded parameters are the saved ones, and training goes on from them.
  const Data three = Data::draw<MlpTask>(0, 3);
  const Run loaded = train_zerotk<MlpTask, TorchEngine<3>>(3, three, adamw_options(), {dir.string(), "", 0});
  DOCTEST_CHECK(loaded.params == saved.params);
  const Data three_more = Data::draw<MlpTask>(4, 3);
  const Run continued = train_zerotk<MlpTask, TorchEngine<3>>(3, three_more, adamw_options(), {dir.string(), "", 0});
  DOCTEST_REQUIRE(continued.losses.size() == 4);
  for (double l : continued.losses) DOCTEST_CHECK(std::isfinite(l));
  DOCTEST_CHECK(continued.params != saved.params);
  std::filesystem::remove_all(dir);
}
#endif

DOCTEST_TEST_CASE("torch: optimizer and parameter offload (Offload<Cpu>, OffloadParams<Cpu>) change no bit") {
  const Data data = Data::draw<MlpTask>(10, 2);
  const Run s2 = train_zerotk<MlpTask, TorchEngine<2>>(2, data);
  const Run s2_off = train_zerotk<MlpTask, TorchEngine<2, Offload<Cpu>>>(2, data);
  const Run s3_off = train_zerotk<MlpTask, TorchEngine<3, Offload<Cpu>, OffloadParams<Cpu>>>(2, data);
  DOCTEST_CHECK(s2_off.params == s2.params);
  DOCTEST_CHECK(s3_off.params == s2.params);
  DOCTEST_CHECK(s3_off.empty_outside_scopes);
  // The same model states per rank, wherever they live (the ledger sums over memory spaces).
  DOCTEST_CHECK(s2_off.master_bytes + s2_off.optim_bytes == s2.master_bytes + s2.optim_bytes);
  DOCTEST_CHECK(s2.pinned_master_bytes == 0);
  DOCTEST_CHECK(s2_off.pinned_master_bytes == s2_off.master_bytes);  // all of the master in pinned memory
  DOCTEST_CHECK(s3_off.pinned_params_bytes > 0);                      // the parameter shards too
}

DOCTEST_TEST_CASE("torch: stage 3 after the forward: NaN written over the released gathered values, then another "
                  "child's values in them, change no gradient; the parameters' views read nothing meanwhile") {
  constexpr int kWorld = 2, kSteps = 5;
  const Data data = Data::draw<MlpTask>(kSteps, kWorld);
  EngineOptions o = adamw_options();
  o.stage3.prefetch_bucket_size = 0;  // nothing gathered ahead: after the forward no bucket is live
  o.stage3.max_reuse_distance = 0;    // released at once
  // [checkpointed][poisoned]: rank 0's parameters after kSteps, each child through grads.forward
  // (its graph kept) or grads.checkpoint (recomputed).
  std::vector<std::vector<float>> result[2] = {std::vector<std::vector<float>>(2), std::vector<std::vector<float>>(2)};
  std::vector<std::size_t> poisoned(2, 0), released_views(2, 0);
  std::size_t pool_bytes[2][2] = {};  // [checkpointed][poisoned] rank 0's gathered pool after the run
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed)
  for (int poison = 0; poison < 2; ++poison) {
    std::vector<MlpTask::Net> nets{MlpTask::make(), MlpTask::make()};
    comm::run_threads(kWorld, [&](auto& comm) {
      at::set_num_threads(1);
      const auto r = static_cast<std::size_t>(comm.rank());
      TorchModel model(*nets[r]);
      TorchEngine<3> engine(comm, model, o);
      TorchGradients grads(engine, model);
      for (std::size_t s = 0; s < kSteps; ++s) {
        std::vector<std::pair<float*, std::int64_t>> seen;  // gathered values the forward read
        std::vector<torch::Tensor> views;                   // views of them, as autograd saves `weight.t()`
        torch::Tensor h = data.x[s][r];
        std::size_t i = 0;
        for (auto it = nets[r]->begin(); it != nets[r]->end(); ++it, ++i) {
          torch::nn::AnyModule* m = &*it;
          const auto fn = [m, &seen, &views](const torch::Tensor& in) {  // (checkpoint's recompute adds more)
            for (const auto& p : m->ptr()->parameters()) {
              seen.emplace_back(p.data_ptr<float>(), p.numel());
              views.push_back(p.view({-1}));
            }
            return m->forward(in);
          };
          h = checkpointed ? grads.checkpoint(std::to_string(i), fn, h) : grads.forward(std::to_string(i), fn, h);
        }
        const torch::Tensor loss = torch::mse_loss(h, data.y[s][r]);
        std::size_t nulled = 0;  // released: every view of a parameter points at nothing
        for (const auto& v : views) nulled += v.storage().data() == nullptr;
        if (r == 0) released_views[static_cast<std::size_t>(checkpointed)] += nulled;
        if (poison) {
          for (const auto& [ptr, n] : seen) std::fill(ptr, ptr + n, std::numeric_limits<float>::quiet_NaN());
          if (r == 0) poisoned[static_cast<std::size_t>(checkpointed)] += seen.size();
          // The last child gathered again, outside the layer order, into the (only) pool buffer the
          // forward used: the other children's backward gather into a second one, and a tensor
          // still reading the forward's buffer would read the last child's values.
          const auto occupied = engine.gather(*model.unit("4"));
          grads.backward(loss);
        } else {
          grads.backward(loss);
        }
        static_cast<void>(grads.step(loss.item<double>()));
      }
      if (r == 0) pool_bytes[checkpointed][poison] = engine.memory().live(MemoryCategory::gathered);
      grads.release_module();
    });
    result[checkpointed][static_cast<std::size_t>(poison)] = flatten(*nets[0]);
  }
  for (int checkpointed = 0; checkpointed < 2; ++checkpointed) {
    DOCTEST_CAPTURE(checkpointed);
    const auto c = static_cast<std::size_t>(checkpointed);
    DOCTEST_CHECK(poisoned[c] == 6 * kSteps);  // every parameter's gathered values, every step
    DOCTEST_CHECK(released_views[c] == 2 * 6 * kSteps);  // both runs' views, every step
    DOCTEST_CHECK(pool_bytes[c][0] > 0);
    DOCTEST_CHECK(pool_bytes[c][1] == 2 * pool_bytes[c][0]);  // the backward's gathers needed a second buffer
    bool finite = true;
    for (float v : result[c][1]) finite = finite && std::isfinite(v);
    DOCTEST_CHECK(finite);
    DOCTEST_CHECK(result[c][1] == result[c][0]);
  }
  DOCTEST_CHECK(result[0][0] == result[1][0]);  // the kept graph and the recompute agree bitwise
  // The poisoned memory is what the forward computes from: NaN written there while a child is
  // gathered reaches the loss.
  std::vector<double> inside(kWorld, 0);
  std::vector<MlpTask::Net> nets{MlpTask::make(), MlpTask::make()};
  comm::run_threads(kWorld, [&](auto& comm) {
    at::set_num_threads(1);
    const auto r = static_cast<std::size_t>(comm.rank());
    TorchModel model(*nets[r]);
    TorchEngine<3> engine(comm, model, o);
    TorchGradients grads(engine, model);
    torch::nn::AnyModule* first = &*nets[r]->begin();
    const torch::Tensor h = grads.forward(
        "0",
        [first](const torch::Tensor& in) {
          for (const auto& p : first->ptr()->parameters())
            std::fill(p.data_ptr<float>(), p.data_ptr<float>() + p.numel(), std::numeric_limits<float>::quiet_NaN());
          return first->forward(in);
        },
        data.x[0][r]);
    inside[r] = h.sum().item<double>();
  });
  DOCTEST_CHECK(std::isnan(inside[0]));
}

DOCTEST_TEST_CASE("torch: stage 3 with reshard_after_forward = false keeps each child gathered from its forward to "
                  "its backward: the ledger's gathered pool holds all of them, and after the step no tensor has values") {
  const Data data = Data::draw<MlpTask>(3, 2);
  // [kept] rank 0, in the last step: the gathered pool's bytes and the parameter tensors holding
  // values between the forward and the backward; the tensors holding values after each step.
  std::size_t pool[2] = {}, with_values[2] = {}, after_step[2] = {};
  std::vector<float> params[2];
  for (int kept = 0; kept < 2; ++kept) {
    EngineOptions o = adamw_options();
    o.stage3.prefetch_bucket_size = 0;  // nothing gathered ahead
    o.stage3.max_reuse_distance = 0;    // nothing kept for reuse
    o.stage3.reshard_after_forward = kept == 0;
    std::vector<MlpTask::Net> nets{MlpTask::make(), MlpTask::make()};
    comm::run_threads(2, [&](auto& comm) {
      at::set_num_threads(1);
      const auto r = static_cast<std::size_t>(comm.rank());
      TorchModel model(*nets[r]);
      TorchEngine<3> engine(comm, model, o);
      TorchGradients grads(engine, model);
      const auto holding = [&] {
        std::size_t n = 0;
        for (std::size_t i = 0; i < model.size(); ++i) n += model[i].tensor().numel() > 0;
        return n;
      };
      for (std::size_t s = 0; s < data.x.size(); ++s) {
        const torch::Tensor loss = MlpTask::loss(grads, nets[r], data.x[s][r], data.y[s][r]);
        if (r == 0) pool[kept] = engine.memory().live(MemoryCategory::gathered), with_values[kept] = holding();
        grads.backward(loss);
        static_cast<void>(grads.step(loss.item<double>()));
        if (r == 0) after_step[kept] += holding();
      }
      grads.release_module();
    });
    params[kept] = flatten(*nets[0]);
  }
  DOCTEST_CHECK(with_values[0] == 0);  // released after each forward
  DOCTEST_CHECK(with_values[1] == 6);  // all three children's weights and biases, until their backward
  DOCTEST_CHECK(pool[0] > 0);
  DOCTEST_CHECK(pool[1] == 3 * pool[0]);  // a pool buffer (of the largest bucket) per child instead of one
  DOCTEST_CHECK(after_step[0] == 0);
  DOCTEST_CHECK(after_step[1] == 0);
  DOCTEST_CHECK(params[1] == params[0]);
}

namespace {
/// The task's Sequential with every child run through grads.checkpoint (activation checkpointing).
template <class E, class Task = MlpTask>
std::vector<float> train_checkpointed(const Data& data, int world = 2) {
  std::vector<typename Task::Net> nets;
  for (int r = 0; r < world; ++r) nets.push_back(Task::make());
  comm::run_threads(world, [&](auto& comm) {
    at::set_num_threads(1);
    const auto r = static_cast<std::size_t>(comm.rank());
    TorchModel model(*nets[r]);
    E engine(comm, model, adamw_options());
    TorchGradients grads(engine, model);
    for (std::size_t s = 0; s < data.x.size(); ++s) {
      torch::Tensor h = data.x[s][r];
      std::size_t i = 0;
      for (auto it = nets[r]->begin(); it != nets[r]->end(); ++it, ++i) {
        torch::nn::AnyModule* m = &*it;
        h = grads.checkpoint(std::to_string(i), [m](const torch::Tensor& in) { return m->forward(in); }, h);
      }
      const torch::Tensor loss = torch::mse_loss(h, data.y[s][r]);
      grads.backward(loss);
      DOCTEST_CHECK(grads.gradients_received() == 6);
      static_cast<void>(grads.step(loss.item<double>()));
    }
    grads.release_module();
  });
  return flatten(*nets[0]);
}
}  // namespace

DOCTEST_TEST_CASE("torch: activation checkpointing of children (grads.checkpoint) changes no bit at stages 0, 2, 3") {
  const Data data = Data::draw<MlpTask>(10, 2);
  const Run plain = train_zerotk<MlpTask, TorchEngine<0>>(2, data);
  DOCTEST_CHECK(train_checkpointed<TorchEngine<0>>(data) == plain.params);
  DOCTEST_CHECK(train_checkpointed<TorchEngine<2>>(data) == plain.params);
  DOCTEST_CHECK(train_checkpointed<TorchEngine<3>>(data) == plain.params);
}

#if ZEROTK_HAS_XXHASH && ZEROTK_HAS_JSON
namespace {
/// Reads the safetensors `file` by hand (8-byte little-endian header size, a JSON header, the data;
/// no zerotk or torch reader) and checks that it holds exactly the module's named_parameters(), each
/// F32 with the tensor's shape and bits. Returns how many matched.
std::size_t tensors_equal_module(const std::filesystem::path& file, torch::nn::Module& module) {
  std::ifstream in(file, std::ios::binary);
  std::uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const std::vector<char> body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json j = nlohmann::json::parse(header);
  std::size_t matched = 0;
  for (const auto& item : module.named_parameters()) {
    DOCTEST_REQUIRE(j.contains(item.key()));
    const auto& t = j[item.key()];
    DOCTEST_CHECK(t["dtype"] == "F32");
    const torch::Tensor p = item.value().detach().contiguous();
    DOCTEST_CHECK(t["shape"].get<std::vector<std::int64_t>>() == p.sizes().vec());
    const std::size_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    DOCTEST_REQUIRE(end - begin == static_cast<std::size_t>(p.numel()) * sizeof(float));
    DOCTEST_REQUIRE(end <= body.size());
    DOCTEST_CHECK(std::memcmp(body.data() + begin, p.data_ptr(), end - begin) == 0);
    ++matched;
  }
  DOCTEST_CHECK(j.size() - (j.contains("__metadata__") ? 1 : 0) == matched);  // nothing else in the file
  return matched;
}
}  // namespace

DOCTEST_TEST_CASE("torch: save_16bit_model at stage 3 writes safetensors that read back as the module's parameters") {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("zerotk_interop_torch_" + std::to_string(::getpid()) + ".safetensors");
  const Data data = Data::draw<MlpTask>(3, 2);
  std::vector<MlpTask::Net> nets{MlpTask::make(), MlpTask::make()};
  comm::run_threads(2, [&](auto& comm) {
    at::set_num_threads(1);
    const auto r = static_cast<std::size_t>(comm.rank());
    TorchModel model(*nets[r]);
    TorchEngine<3> engine(comm, model, adamw_options());
    TorchGradients grads(engine, model);
    for (std::size_t s = 0; s < data.x.size(); ++s) {
      const torch::Tensor loss = torch::mse_loss(grads.forward(nets[r], data.x[s][r]), data.y[s][r]);
      grads.backward(loss);
      static_cast<void>(grads.step(loss.item<double>()));
    }
    checkpoint::save_16bit_model(engine, model, comm, file);
    grads.release_module();
  });
  DOCTEST_CHECK(tensors_equal_module(file, *nets[0]) == 6);
  std::filesystem::remove(file);
}
#endif

DOCTEST_TEST_CASE("torch: tied weights (one tensor in two modules) are one parameter and train like the DDP loop") {
  constexpr int kWorld = 2, kSteps = 30;
  {
    TiedLm net = TiedTask::make();
    TorchModel model(*net);
    DOCTEST_CHECK(model.size() == 3);  // emb.weight (= head.weight), mid.weight, mid.bias
    DOCTEST_REQUIRE(model.aliases().size() == 1);
    DOCTEST_CHECK(model.aliases()[0].first == "head.weight");
    DOCTEST_CHECK(model.aliases()[0].second == "emb.weight");
  }
  const Data data = Data::draw<TiedTask>(kSteps, kWorld);
  const Run ref = train_reference<TiedTask>(kWorld, data);
  const Run s0 = train_zerotk<TiedTask, TorchEngine<0>>(kWorld, data);
  const Run s2 = train_zerotk<TiedTask, TorchEngine<2>>(kWorld, data);
  DOCTEST_CHECK(s0.params == s2.params);
  const Diff d = max_diff(s2, ref);
  std::printf("torch tied LM vs libtorch DDP + AdamW, %d steps on %d ranks: loss %.6f -> %.6f, max |loss diff| "
              "%.3g, max |param diff| %.3g\n",
              kSteps, kWorld, ref.losses.front(), ref.losses.back(), d.loss, d.param);
  DOCTEST_CHECK(ref.losses.back() < ref.losses.front());
  DOCTEST_CHECK(d.loss < 1e-5);
  DOCTEST_CHECK(d.param < 1e-4);
}

DOCTEST_TEST_CASE("torch: per-rank model states equal the ZeRO formula at stages 0-3 (fp32 AdamW: 4 + 4 + K=12)") {
  constexpr int kWorld = 4;
  const Data data = Data::draw<MlpTask>(2, kWorld);
  const auto check = [&](int stage, const Run& r) {
    const double p = r.psi_padded, n = kWorld;
    const double states = double(r.params_bytes + r.grads_bytes + r.master_bytes + r.optim_bytes);
    // fp32 working copy 4, gradients 4, fp32 master 4 and Adam's m, v 8 (the master and the moments
    // partitioned from stage 1, the gradients from stage 2), on Psi with bucket padding.
    const double formula = stage == 0   ? 20 * p
                           : stage == 1 ? 8 * p + 12 * p / n
                           : stage == 2 ? 4 * p + 16 * p / n
                                        : 20 * p / n;  // stage 3: everything partitioned
    std::printf("stage %d W=%d Psi=%.0f (padded %.0f): params %zu grads %zu master %zu optimizer %zu = %.0f B, "
                "formula %.0f B\n",
                stage, kWorld, r.psi, p, r.params_bytes, r.grads_bytes, r.master_bytes, r.optim_bytes, states, formula);
    DOCTEST_CHECK(r.psi == 916);  // 8*24+24 + 24*24+24 + 24*4+4: every trainable parameter, once
    DOCTEST_CHECK(p - r.psi < 2 * n * double(r.buckets));
    DOCTEST_CHECK(states == formula);
  };
  check(0, train_zerotk<MlpTask, TorchEngine<0>>(kWorld, data));
  check(1, train_zerotk<MlpTask, TorchEngine<1>>(kWorld, data));
  check(2, train_zerotk<MlpTask, TorchEngine<2>>(kWorld, data));
  check(3, train_zerotk<MlpTask, TorchEngine<3>>(kWorld, data));
}

DOCTEST_TEST_CASE("torch: stage 2 reduces buckets inside loss.backward(), the last layer's before autograd reaches "
                  "the first") {
  using E = TorchEngine<2, Bucketer<Bytes<1024>>>;  // 256 floats per bucket: several buckets
  const Data data = Data::draw<MlpTask>(3, 2);
  const Run run = train_zerotk<MlpTask, E>(2, data);
  DOCTEST_CHECK(run.buckets > 2);
  DOCTEST_CHECK(run.reductions_in_backward == run.buckets);  // all of them launched before backward returned

  std::vector<std::uint64_t> at_first_layer(2, 0), buckets(2, 0);
  std::vector<MlpTask::Net> nets{MlpTask::make(), MlpTask::make()};
  comm::run_threads(2, [&](auto& comm) {
    at::set_num_threads(1);
    const auto r = static_cast<std::size_t>(comm.rank());
    TorchModel model(*nets[r]);
    E engine(comm, model, adamw_options());
    TorchGradients grads(engine, model);
    // Layer 0's output gradient is computed after every later layer's parameters got theirs and
    // before layer 0's own: count the reductions issued by then.
    auto it = nets[r]->begin();
    torch::Tensor h = it->forward(data.x[0][r]);
    h.register_hook([&](const torch::Tensor&) { at_first_layer[r] = reduction_calls(comm); });
    for (++it; it != nets[r]->end(); ++it) h = it->forward(h);
    grads.backward(torch::mse_loss(h, data.y[0][r]));
    static_cast<void>(grads.step(0.0));
    buckets[r] = engine.bucket_count();
  });
  std::printf("stage 2, %llu buckets: %llu reduce-scatters issued before autograd reached layer 0\n",
              static_cast<unsigned long long>(buckets[0]), static_cast<unsigned long long>(at_first_layer[0]));
  DOCTEST_CHECK(at_first_layer[0] >= 1);
  DOCTEST_CHECK(at_first_layer[0] < buckets[0]);  // and not all: layer 0's bucket(s) came after
}

namespace {
struct OddParamsImpl : torch::nn::Module {
  explicit OddParamsImpl(int kind) {
    torch::NoGradGuard no_grad;
    if (kind == 0) register_parameter("transposed", torch::randn({4, 3}).t());
    if (kind == 1) {
      torch::Tensor base = register_parameter("base", torch::randn({10}));
      register_parameter("view", base.detach().narrow(0, 2, 5));
    }
  }
};
TORCH_MODULE(OddParams);

struct FrozenUnusedImpl : torch::nn::Module {
  FrozenUnusedImpl() {
    torch::manual_seed(3);
    used = register_module("used", torch::nn::Linear(4, 4));
    unused = register_module("unused", torch::nn::Linear(4, 4));
    used->weight.requires_grad_(false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return used(x); }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};
TORCH_MODULE(FrozenUnused);
}  // namespace

DOCTEST_TEST_CASE("torch: what cannot be bound is refused, naming the parameter") {
  using E = TorchEngine<2>;
  DOCTEST_SUBCASE("a non-float parameter") {
    torch::nn::Linear l(3, 2);
    l->to(torch::kFloat64);
    DOCTEST_CHECK_THROWS_WITH_AS(TorchModel{*l}, doctest::Contains("weight"), usage_error);
  }
  DOCTEST_SUBCASE("a non-contiguous parameter") {
    OddParams m(0);
    DOCTEST_CHECK_THROWS_WITH_AS(TorchModel{*m}, doctest::Contains("transposed"), usage_error);
  }
  DOCTEST_SUBCASE("two parameters sharing storage") {
    OddParams m(1);
    DOCTEST_CHECK_THROWS_WITH_AS(TorchModel{*m}, doctest::Contains("view"), usage_error);
  }
  DOCTEST_SUBCASE("a child name the module does not have, at stages 2 and 3 (issue 57 item 14)") {
    const auto fn = [](const torch::Tensor& t) { return t * 2; };
    auto refused = [&](auto& grads) {
      DOCTEST_CHECK_THROWS_WITH_AS(grads.forward("fc9", fn, torch::ones({1, 3})),
                                   doctest::Contains("no direct child of this name (its children: 0, 1, 2)"), usage_error);
      DOCTEST_CHECK_THROWS_WITH_AS(grads.checkpoint("fc9", fn, torch::ones({1, 3})), doctest::Contains("fc9"), usage_error);
      DOCTEST_CHECK(grads.forward("1", fn, torch::ones({1, 3})).sum().template item<float>() == 6.0f);  // a child without parameters
    };
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
      TorchModel model(*net);
      TorchEngine<2> engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      refused(grads);
    });
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
      TorchModel model(*net);
      TorchEngine<3> engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      refused(grads);
      grads.release_module();
    });
  }
  DOCTEST_SUBCASE("a child's function that uses another child's parameters, at stage 3 (issue 57 item 14)") {
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
      TorchModel model(*net);
      TorchEngine<3> engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      auto* first = net[0]->as<torch::nn::Linear>();
      auto* last = net[2]->as<torch::nn::Linear>();
      // "0"'s function runs "2" too: "2"'s parameters are released inside "0"'s gather.
      const auto both = [&](const torch::Tensor& t) { return last->forward(first->forward(t)); };
      const auto refused = doctest::Contains(
          "torch failed in the forward of child \"0\" at stage 3 (torch: ");
      const auto naming = doctest::Contains("the parameters of \"2\" are released (empty tensors)");
      DOCTEST_CHECK_THROWS_WITH_AS(grads.forward("0", both, torch::ones({1, 3})), refused, usage_error);
      DOCTEST_CHECK_THROWS_WITH_AS(grads.forward("0", both, torch::ones({1, 3})), naming, usage_error);
      DOCTEST_CHECK_THROWS_WITH_AS(grads.checkpoint("0", both, torch::ones({1, 3})), naming, usage_error);
      {
        torch::NoGradGuard no_grad;  // evaluation
        DOCTEST_CHECK_THROWS_WITH_AS(grads.forward("0", both, torch::ones({1, 3})), naming, usage_error);
      }
      // Each child in its own scope: the same function's values.
      const torch::Tensor y = grads.forward("2", [&](const torch::Tensor& t) { return last->forward(t); },
                                            grads.forward("0", [&](const torch::Tensor& t) { return first->forward(t); },
                                                          torch::ones({1, 3})));
      DOCTEST_CHECK(y.sizes() == torch::IntArrayRef({1, 2}));
      grads.release_module();
      DOCTEST_CHECK(torch::equal(both(torch::ones({1, 3})), y));
    });
    comm::run_threads(1, [&](auto& comm) {  // stage 2: every parameter is there, the function runs
      torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 2));
      TorchModel model(*net);
      TorchEngine<2> engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      auto* first = net[0]->as<torch::nn::Linear>();
      auto* last = net[2]->as<torch::nn::Linear>();
      const auto both = [&](const torch::Tensor& t) { return last->forward(first->forward(t)); };
      DOCTEST_CHECK(grads.forward("0", both, torch::ones({1, 3})).sizes() == torch::IntArrayRef({1, 2}));
    });
  }
  DOCTEST_SUBCASE("a tensor tied across two children, at stage 3") {
    comm::run_threads(1, [&](auto& comm) {
      TiedLm net = TiedTask::make();
      TorchModel model(*net);
      TorchEngine<3> engine(comm, model, adamw_options());
      DOCTEST_CHECK_THROWS_WITH_AS(TorchGradients(engine, model), doctest::Contains("head.weight"), usage_error);
    });
  }
  DOCTEST_SUBCASE("overlap_param_gather (the forward would read parameters before their gather ends)") {
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Linear l(3, 2);
      TorchModel model(*l);
      EngineOptions o = adamw_options();
      o.overlap_param_gather = true;
      E engine(comm, model, o);
      DOCTEST_CHECK_THROWS_WITH_AS(TorchGradients(engine, model), doctest::Contains("overlap_param_gather"), usage_error);
    });
  }
  DOCTEST_SUBCASE("a sparse gradient") {
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Embedding emb(torch::nn::EmbeddingOptions(5, 3).sparse(true));
      TorchModel model(*emb);
      E engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      torch::Tensor loss = emb(torch::tensor({1, 2}, torch::kLong)).sum();
      grads.backward(loss);  // the hook keeps the error; step() throws it (after agreeing across ranks)
      DOCTEST_CHECK_THROWS_WITH_AS(static_cast<void>(grads.step(0.0)), doctest::Contains("sparse"), usage_error);
    });
  }
  DOCTEST_SUBCASE("a sparse parameter") {
    torch::nn::Linear l(3, 2);
    torch::Tensor sparse = torch::eye(3).to_sparse();
    l->register_parameter("sparse", sparse);
    DOCTEST_CHECK_THROWS_WITH_AS(TorchModel{*l}, doctest::Contains("sparse"), usage_error);
  }
  DOCTEST_SUBCASE("two backward() calls before step()") {
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Linear l(3, 2);
      TorchModel model(*l);
      E engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      const torch::Tensor loss = l(torch::ones({1, 3})).sum();
      loss.backward({}, /*retain_graph=*/true);
      loss.backward();
      DOCTEST_CHECK_THROWS_WITH_AS(static_cast<void>(grads.step(0.0)), doctest::Contains("second gradient"), usage_error);
    });
  }
  DOCTEST_SUBCASE("a module converted after wrapping") {
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Linear l(3, 2);
      TorchModel model(*l);
      E engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      l->to(torch::kFloat64);
      DOCTEST_CHECK_THROWS_WITH_AS(static_cast<void>(grads.step(0.0)), doctest::Contains("weight"), usage_error);
    });
  }
  DOCTEST_SUBCASE("stage 3: a backward through the graph of a micro-step that step() already ended") {
    comm::run_threads(1, [&](auto& comm) {
      MlpTask::Net net = MlpTask::make();
      TorchModel model(*net);
      TorchEngine<3> engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      const torch::Tensor loss = torch::mse_loss(grads.forward(net, torch::ones({2, kIn})), torch::zeros({2, kOut}));
      static_cast<void>(grads.step(0.0));  // no backward: zero gradients
      DOCTEST_CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("before the last grads.step()"), usage_error);
    });
  }
  DOCTEST_SUBCASE("a tensor re-allocated after wrapping, found by its hook in backward") {
    comm::run_threads(1, [&](auto& comm) {
      torch::nn::Linear l(3, 2);
      TorchModel model(*l);
      E engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      {
        torch::NoGradGuard no_grad;
        l->bias.set_data(torch::zeros({2}));
      }
      torch::Tensor loss = l(torch::ones({1, 3})).sum();
      grads.backward(loss);
      DOCTEST_CHECK(grads.gradients_received() == 2);  // the refused one with a zero gradient
      DOCTEST_CHECK_THROWS_WITH_AS(static_cast<void>(grads.step(0.0)), doctest::Contains("bias"), usage_error);
    });
  }
}

DOCTEST_TEST_CASE("torch: frozen parameters stay the module's; an unused one gets a zero gradient") {
  FrozenUnused net;
  const torch::Tensor frozen_before = net->used->weight.detach().clone();
  const torch::Tensor unused_before = net->unused->weight.detach().clone();
  comm::run_threads(1, [&](auto& comm) {
    TorchModel model(*net);
    DOCTEST_CHECK(model.size() == 3);  // used.bias, unused.weight, unused.bias
    DOCTEST_REQUIRE(model.frozen().size() == 1);
    DOCTEST_CHECK(model.frozen()[0] == "used.weight");
    TorchEngine<2> engine(comm, model, adamw_options());
    TorchGradients grads(engine, model);
    for (int s = 0; s < 3; ++s) {
      grads.backward(torch::mse_loss(net(torch::ones({2, 4})), torch::zeros({2, 4})));
      DOCTEST_CHECK(grads.gradients_received() == 1);  // used.bias only
      static_cast<void>(grads.step(0.0));
    }
  });
  DOCTEST_CHECK(torch::equal(net->used->weight, frozen_before));
  // A zero gradient leaves Adam's update at 0: only the decoupled weight decay moves it.
  const double decay = std::pow(1.0 - kLr * kWeightDecay, 3);
  const torch::Tensor expect = unused_before * decay;
  DOCTEST_CHECK(torch::allclose(net->unused->weight, expect, 1e-6, 1e-7));
  DOCTEST_CHECK(!torch::equal(net->unused->weight, unused_before));
}

DOCTEST_TEST_CASE("torch: NVMe offload (Offload<Nvme> and OffloadParams<Nvme> at stage 3) changes no bit") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zerotk_interop_torch_nvme_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Data data = Data::draw<MlpTask>(10, 2);
  EngineOptions o = adamw_options();
  o.nvme.path = dir;        // offload_optimizer.nvme_path
  o.param_nvme.path = dir;  // offload_param.nvme_path
  const Run s2 = train_zerotk<MlpTask, TorchEngine<2>>(2, data);
  const Run nvme = train_zerotk<MlpTask, TorchEngine<3, Offload<Nvme>, OffloadParams<Nvme>>>(2, data, o);
  DOCTEST_CHECK(nvme.params == s2.params);
  DOCTEST_CHECK(nvme.losses == s2.losses);
  DOCTEST_CHECK(nvme.empty_outside_scopes);
  // The master and the parameter shards live in the swap files, not in host memory.
  DOCTEST_CHECK(nvme.disk_master_bytes > 0);
  DOCTEST_CHECK(nvme.disk_params_bytes > 0);
  DOCTEST_CHECK(nvme.host_master_bytes == 0);
  DOCTEST_CHECK(nvme.pinned_master_bytes == 0);
  DOCTEST_CHECK(std::filesystem::is_empty(dir));  // the engines removed their swap files
  std::filesystem::remove_all(dir);
}

DOCTEST_TEST_CASE("torch: on a modelled network link, stage 2's reduce-scatters start before loss.backward() returns") {
  // 10 MB/s and 20 us per operation: a 1 KiB bucket's reduce-scatter (512 wire bytes on 2 ranks)
  // keeps the link busy ~71 us, comparable to this MLP's backward, so the reductions queue on the
  // link while autograd still runs.
  using E = TorchEngine<2, Bucketer<Bytes<1024>>>;
  using Link = bench::ModelledLink<comm::ThreadsCommunicator>;
  using Clock = std::chrono::steady_clock;
  constexpr int kSteps = 3;
  const Data data = Data::draw<MlpTask>(kSteps, 2);
  std::vector<MlpTask::Net> nets{MlpTask::make(), MlpTask::make()};
  std::vector<std::vector<std::size_t>> issued(2), started(2);  // [rank][step]
  std::vector<std::size_t> buckets(2, 0);
  std::vector<double> busy_ms(2, 0), hidden_ms(2, 0);  // link time of the backward's reductions, and of it before return
  comm::run_threads(2, [&](comm::ThreadsCommunicator& threads) {
    at::set_num_threads(1);
    const auto r = static_cast<std::size_t>(threads.rank());
    Link link(threads, 0.01, std::chrono::microseconds(20));
    TorchModel model(*nets[r]);
    E engine(link, model, adamw_options());
    TorchGradients grads(engine, model);
    for (std::size_t s = 0; s < kSteps; ++s) {
      const torch::Tensor loss = MlpTask::loss(grads, nets[r], data.x[s][r], data.y[s][r]);
      const std::size_t before = link.ops().size();
      grads.backward(loss);
      const Clock::time_point returned = Clock::now();
      const std::size_t after = link.ops().size();
      std::size_t n = 0;
      for (std::size_t k = before; k < after; ++k) {
        const Link::Op& op = link.ops()[k];
        n += op.start < returned;
        busy_ms[r] += std::chrono::duration<double, std::milli>(op.done - op.start).count();
        if (op.start < returned)
          hidden_ms[r] += std::chrono::duration<double, std::milli>(std::min(op.done, returned) - op.start).count();
      }
      issued[r].push_back(after - before);
      started[r].push_back(n);
      static_cast<void>(grads.step(loss.item<double>()));
    }
    buckets[r] = engine.bucket_count();
  });
  std::printf("modelled link, stage 2, %zu buckets: per step %zu reduce-scatters issued in backward, %zu started "
              "before it returned; %.2f of %.2f ms of their link time before the return (rank 0)\n",
              buckets[0], issued[0].back(), started[0].back(), hidden_ms[0] / kSteps, busy_ms[0] / kSteps);
  DOCTEST_CHECK(buckets[0] > 2);
  for (std::size_t r = 0; r < 2; ++r) {
    for (std::size_t s = 0; s < kSteps; ++s) {
      DOCTEST_CHECK(issued[r][s] == buckets[r]);  // every reduction was issued from the hooks, none deferred to step()
      // The link is idle when backward starts (step() waited for the previous step's traffic), so
      // at least the first reduction starts on it while autograd runs: counted, not timed.
      DOCTEST_CHECK(started[r][s] >= 1);
    }
  }
}

namespace {
/// A Linear followed by dropout, one child: at stage 3 (and under grads.checkpoint) the child is
/// recomputed in backward, and its mask must be the forward's.
struct DropLinearImpl : torch::nn::Module {
  DropLinearImpl(int in, int out, double p) : p_(p) { fc = register_module("fc", torch::nn::Linear(in, out)); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::dropout(fc(x), p_, is_training()); }
  torch::nn::Linear fc{nullptr};
  double p_;
};
TORCH_MODULE(DropLinear);

/// The MLP task with dropout inside two of its parameterized children (p in percent).
template <int kDropPercent>
struct DropoutTask : MlpTask {
  static Net make() {
    torch::manual_seed(7);
    const double p = kDropPercent / 100.0;
    return torch::nn::Sequential(DropLinear(kIn, kHidden, p), torch::nn::Tanh(), DropLinear(kHidden, kHidden, p),
                                 torch::nn::ReLU(), torch::nn::Linear(kHidden, kOut));
  }
};
}  // namespace

DOCTEST_TEST_CASE("torch: a recomputed child draws the forward's dropout mask and leaves torch's generator as it was") {
  // One rank: torch's CPU generator is one per process, shared by thread ranks.
  const auto run = [](bool checkpointed) {
    std::vector<torch::Tensor> kept;  // the mask of every call of the child's forward
    torch::Tensor after;              // what the generator draws after the step
    comm::run_threads(1, [&](auto& comm) {
      at::set_num_threads(1);
      torch::manual_seed(5);
      torch::nn::Sequential net(DropLinear(kIn, kHidden, 0.5));
      TorchModel model(*net);
      TorchEngine<2> engine(comm, model, adamw_options());
      TorchGradients grads(engine, model);
      torch::nn::AnyModule* child = &*net->begin();
      const auto fn = [&](const torch::Tensor& in) {
        torch::Tensor y = child->forward(in);
        kept.push_back(y.ne(0).clone());
        return y;
      };
      const torch::Tensor x = torch::randn({kBatch, kIn});
      const torch::Tensor h = checkpointed ? grads.checkpoint("0", fn, x) : fn(x);
      grads.backward(h.square().mean());
      static_cast<void>(grads.step(0.0));
      after = torch::rand({8});
    });
    return std::pair{kept, after};
  };
  const auto [ck_masks, ck_after] = run(true);
  const auto [plain_masks, plain_after] = run(false);
  DOCTEST_REQUIRE(ck_masks.size() == 2);  // the forward and its recompute
  DOCTEST_REQUIRE(plain_masks.size() == 1);
  DOCTEST_CHECK(torch::equal(ck_masks[0], ck_masks[1]));     // the recompute drew the forward's mask
  DOCTEST_CHECK(torch::equal(ck_masks[0], plain_masks[0]));  // the one a plain forward draws
  const double kept_share = ck_masks[0].to(torch::kFloat64).mean().item<double>();
  DOCTEST_CHECK(kept_share > 0.3);  // dropout with p = 0.5 really dropped
  DOCTEST_CHECK(kept_share < 0.7);
  DOCTEST_CHECK(torch::equal(ck_after, plain_after));  // and the stream goes on as without the recompute
}

DOCTEST_TEST_CASE("torch: children with dropout at stage 3 and under grads.checkpoint train bitwise like stage 2") {
  // One rank: torch's CPU generator is one per process, so on thread ranks their dropout draws
  // interleave in scheduling order (not reproducible at any stage); one rank per process is.
  const Data data = Data::draw<MlpTask>(10, 1);
  const Run s2 = train_zerotk<DropoutTask<25>, TorchEngine<2>>(1, data);
  const Run s3 = train_zerotk<DropoutTask<25>, TorchEngine<3>>(1, data);
  const Run no_dropout = train_zerotk<DropoutTask<0>, TorchEngine<2>>(1, data);
  DOCTEST_CHECK(s3.hooked == 6);
  DOCTEST_CHECK(s3.losses == s2.losses);
  DOCTEST_CHECK(s3.params == s2.params);
  DOCTEST_CHECK((train_checkpointed<TorchEngine<2>, DropoutTask<25>>(data, 1) == s2.params));
  DOCTEST_CHECK(s2.params != no_dropout.params);  // the masks changed the training
}

namespace {
/// What one rank's step threw.
struct RankError {
  bool thrown = false;
  std::optional<ErrorKind> kind;  // nullopt: not a zerotk::error
  std::string what;
};

/// An identity whose backward throws where `fail` is set: an error of code other than the
/// adapter's, raised inside autograd (before any parameter got its gradient when it wraps the loss).
struct FailingBackward : torch::autograd::Function<FailingBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, bool fail) {
    ctx->saved_data["fail"] = fail;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    if (ctx->saved_data["fail"].toBool()) throw std::runtime_error("an autograd node's backward failed on purpose");
    return {g[0], torch::Tensor()};
  }
};

/// One micro-step of the MLP on `world` thread ranks whose loss comes from `loss_of(grads, net, x, y,
/// rank)` (which may break something on one rank); every rank catches what its grads.step() throws,
/// then all meet in a barrier: after the failed step they are still in step with each other.
template <class E, class LossOf>
std::vector<RankError> failing_step(int world, LossOf&& loss_of) {
  const Data data = Data::draw<MlpTask>(1, world);
  std::vector<MlpTask::Net> nets;
  for (int r = 0; r < world; ++r) nets.push_back(MlpTask::make());
  std::vector<RankError> out(static_cast<std::size_t>(world));
  comm::run_threads(world, [&](auto& comm) {
    at::set_num_threads(1);
    const auto r = static_cast<std::size_t>(comm.rank());
    TorchModel model(*nets[r]);
    E engine(comm, model, adamw_options());
    TorchGradients grads(engine, model);
    RankError& e = out[r];
    try {
      const torch::Tensor loss = loss_of(grads, nets[r], data.x[0][r], data.y[0][r], comm.rank());
      grads.backward(loss);
      static_cast<void>(grads.step(loss.item<double>()));
    } catch (const zerotk::error& x) {
      e = {true, x.kind(), x.what()};
    } catch (const std::exception& x) {
      e = {true, std::nullopt, x.what()};
    }
    comm.barrier().wait();
  });
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
}  // namespace

DOCTEST_TEST_CASE("torch: an error inside backward on one rank reaches every rank at step(), naming that rank and why") {
  // Without the agreement the other ranks would go on into step()'s reductions, which the failed
  // rank never joins, and wait there until the communicator's timeout (60 s by default). Here
  // each rank catches its own error: the bystanders' must be the agreed usage_error, not a
  // comm_error from a timeout or from mismatched calls.
  DOCTEST_SUBCASE("stage 2, 3 ranks: rank 1's hook finds a re-allocated tensor") {
    const auto errors = failing_step<TorchEngine<2>>(3, [](auto& grads, MlpTask::Net& net, const torch::Tensor& x,
                                                              const torch::Tensor& y, int rank) {
      if (rank == 1) {
        torch::NoGradGuard no_grad;
        net->ptr(2)->named_parameters()["bias"].set_data(torch::zeros({kHidden}));
      }
      return MlpTask::loss(grads, net, x, y);
    });
    const std::string reason = "2.bias: torch parameter no longer points at the engine's storage";
    DOCTEST_CHECK(errors[1].kind == ErrorKind::usage);
    DOCTEST_CHECK(contains(errors[1].what, "at 2.bias: torch parameter no longer points"));
    for (int r : {0, 2}) {
      DOCTEST_CAPTURE(r);
      const RankError& e = errors[static_cast<std::size_t>(r)];
      DOCTEST_CHECK(e.kind == ErrorKind::usage);
      DOCTEST_CHECK(contains(e.what, "at rank " + std::to_string(r) + ": backward failed on rank 1: " + reason));
    }
  }
  DOCTEST_SUBCASE("stage 3, 2 ranks: rank 1's recomputed child (grads.checkpoint) throws") {
    const auto errors = failing_step<TorchEngine<3>>(2, [](auto& grads, MlpTask::Net& net, const torch::Tensor& x,
                                                              const torch::Tensor& y, int rank) {
      torch::Tensor h = x;
      std::size_t i = 0;
      for (auto it = net->begin(); it != net->end(); ++it, ++i) {
        torch::nn::AnyModule* m = &*it;
        h = grads.checkpoint(std::to_string(i),
                             [m, rank, i](const torch::Tensor& in) {
                               // The recompute runs with autograd on; the forward without.
                               if (rank == 1 && i == 2 && torch::GradMode::is_enabled())
                                 throw std::runtime_error("child 2's recompute failed on purpose");
                               return m->forward(in);
                             },
                             h);
      }
      return torch::mse_loss(h, y);
    });
    DOCTEST_CHECK(!errors[1].kind);  // its own std::runtime_error, rethrown
    DOCTEST_CHECK(contains(errors[1].what, "child 2's recompute failed on purpose"));
    DOCTEST_CHECK(errors[0].kind == ErrorKind::usage);
    DOCTEST_CHECK(contains(errors[0].what, "at rank 0: backward failed on rank 1: child 2's recompute failed on purpose"));
  }
  DOCTEST_SUBCASE("stage 3, 2 ranks: an autograd node inside rank 1's child throws in the child's kept graph") {
    const auto errors = failing_step<TorchEngine<3>>(2, [](auto& grads, MlpTask::Net& net, const torch::Tensor& x,
                                                              const torch::Tensor& y, int rank) {
      torch::Tensor h = x;
      std::size_t i = 0;
      for (auto it = net->begin(); it != net->end(); ++it, ++i) {
        torch::nn::AnyModule* m = &*it;
        h = grads.forward(
            std::to_string(i),
            [m, rank, i](const torch::Tensor& in) { return FailingBackward::apply(m->forward(in), rank == 1 && i == 2); },
            h);
      }
      return torch::mse_loss(h, y);
    });
    DOCTEST_CHECK(!errors[1].kind);
    DOCTEST_CHECK(contains(errors[1].what, "an autograd node's backward failed on purpose"));
    DOCTEST_CHECK(errors[0].kind == ErrorKind::usage);
    DOCTEST_CHECK(contains(errors[0].what, "at rank 0: backward failed on rank 1: "));
  }
  DOCTEST_SUBCASE("stages 2 and 3, 2 ranks: another autograd node throws on rank 0, before any parameter's gradient") {
    const auto loss_of = [](auto& grads, MlpTask::Net& net, const torch::Tensor& x, const torch::Tensor& y, int rank) {
      return torch::mse_loss(FailingBackward::apply(MlpTask::loss(grads, net, x, y).unsqueeze(0), rank == 0), y.new_zeros({1}));
    };
    const auto two = failing_step<TorchEngine<2>>(2, loss_of);
    const auto three = failing_step<TorchEngine<3>>(2, loss_of);
    for (const auto& errors : {two, three}) {
      DOCTEST_CHECK(contains(errors[0].what, "an autograd node's backward failed on purpose"));
      DOCTEST_CHECK(errors[1].kind == ErrorKind::usage);
      DOCTEST_CHECK(contains(errors[1].what, "at rank 1: backward failed on rank 0: "));
      DOCTEST_CHECK(contains(errors[1].what, "an autograd node's backward failed on purpose"));
    }
  }
}

#if ZEROTK_HAS_XXHASH && ZEROTK_HAS_JSON
namespace {
/// Writes `flat` (flatten()'s order) into the module's parameters.
void load_flat(torch::nn::Module& m, const std::vector<float>& flat) {
  torch::NoGradGuard no_grad;
  std::size_t at = 0;
  for (auto& p : unique_params(m)) {
    std::memcpy(p.data_ptr<float>(), flat.data() + at, static_cast<std::size_t>(p.numel()) * sizeof(float));
    at += static_cast<std::size_t>(p.numel());
  }
  DOCTEST_REQUIRE(at == flat.size());
}
}  // namespace

DOCTEST_TEST_CASE("torch: a checkpoint saved from a torch model exports to safetensors holding its parameters bitwise") {
  // The checkpoint and a reference dump of the module's tensors stay in the build tree for CTest
  // interop_torch_zerotk_ckpt, which exports the same checkpoint with the zerotk-ckpt tool and reads
  // it back with tests/checkpoint/read_safetensors.py (Python's standard library only).
  const std::filesystem::path dir = std::filesystem::path(ZEROTK_TEST_BINARY_DIR) / "torch_export";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  constexpr int kSteps = 4;
  const Data data = Data::draw<MlpTask>(kSteps, 2);
  // Stage 2 on 2 ranks: each rank saves its half of the fp32 master; the export joins the halves.
  const Run saved = train_zerotk<MlpTask, TorchEngine<2>>(2, data, adamw_options(), {"", (dir / "ckpt").string(), 0});
  const checkpoint::ExportResult r = checkpoint::export_safetensors(dir / "ckpt", dir / "in_process.safetensors");
  DOCTEST_CHECK(r.tensors == 6);
  MlpTask::Net trained = MlpTask::make();  // named_parameters() and shapes of the model, values of the trained one
  load_flat(*trained, saved.params);
  DOCTEST_CHECK(tensors_equal_module(dir / "in_process.safetensors", *trained) == 6);

  zt_test::ReferenceDump ref;
  ref.metadata("format", "pt");
  ref.metadata("zerotk_tag", r.tag);
  ref.metadata("zerotk_global_steps", std::to_string(kSteps));
  ref.metadata("zerotk_world_size", "2");
  ref.metadata("zerotk_stage", "2");
  for (const auto& item : trained->named_parameters()) {
    const torch::Tensor p = item.value().detach().contiguous();
    std::vector<std::uint64_t> shape;
    for (std::int64_t d : p.sizes()) shape.push_back(static_cast<std::uint64_t>(d));
    ref.tensor(item.key(), "F32", shape, zt_test::le_bytes({p.data_ptr<float>(), static_cast<std::size_t>(p.numel())}));
  }
  ref.write(dir, "torch");
}
#endif
