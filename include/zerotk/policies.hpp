#pragma once
/// \file zerotk/policies.hpp
/// Policy tags and the machinery that reads an Engine's policy pack.
///
/// A policy is a class template instantiated with a small tag (`Partitioner<Stage<2>>`,
/// `LossScaler<Dynamic>`, `Optimizer<AdamW>` ...). Each policy class says which slot it fills with
/// `using policy_kind = zerotk::policy::<slot>;`. The class is also the working object: a research
/// prototype can instantiate `LossScaler<Dynamic>` alone. The Engine takes policies in any order;
/// a slot given twice, or a required slot left empty, is a compile error that says so in words.

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/macros.hpp"

namespace zerotk {

// ---- tags ---------------------------------------------------------------------------------------

/// ZeRO stage: 0 (plain data parallel), 1 (optimizer state), 2 (+ gradients), 3 (+ parameters).
template <int S>
struct Stage {
  static_assert(S >= 0 && S <= 3, "Stage<S>: ZeRO stages are 0, 1, 2 and 3");
  static constexpr int value = S;
};

/// A byte count carried as a type, e.g. Bucketer<Bytes<256 << 20>>.
template <std::size_t N>
struct Bytes {
  static constexpr std::size_t value = N;
};

/// When a ZeRO stage reduces gradients under gradient accumulation: Partitioner<Stage<S>, When>.
namespace when {
/// Backward accumulates locally over the micro-steps; one reduction at the boundary (DeepSpeed's
/// order for stages 0 and 1, and their default here).
struct at_boundary {};
/// Each micro-step's gradients are reduced as backward completes them (overlapped with backward) and
/// the reduced gradients are accumulated (stage 2 always; stages 0/1 on request: this order makes
/// stages 0, 1 and 2 bitwise identical).
struct every_micro_step {};
}  // namespace when

// Every tag carries its names: `name`, its C++ spelling (what policies are written with and errors
// say), and where a DeepSpeed config spells it otherwise, `key` (offload devices, compression
// algorithms). The config layer and the checkpoints read these; there is no other name table.

struct Dynamic { static constexpr std::string_view name = "Dynamic"; };  ///< LossScaler<Dynamic>: DeepSpeed's dynamic loss scaling
struct Static { static constexpr std::string_view name = "Static"; };    ///< LossScaler<Static>: fixed scale, overflow still skips
/// LossScaler<None> (no scaling), Offload<None> / OffloadParams<None> (no offload), GradientCompression<None>.
struct None { static constexpr std::string_view name = "None", key = "none"; };
struct Cpu { static constexpr std::string_view name = "Cpu", key = "cpu"; };     ///< Offload<Cpu>, OffloadParams<Cpu>
struct Nvme { static constexpr std::string_view name = "Nvme", key = "nvme"; };  ///< Offload<Nvme>, OffloadParams<Nvme>
struct Host { static constexpr std::string_view name = "Host"; };  ///< Device<Host>: OpenMP/SIMD kernels
struct Cuda { static constexpr std::string_view name = "Cuda"; };  ///< Device<Cuda>: CUDA kernels
/// Device<HostAsync>: a GPU's streams and events emulated on host memory (core/host_async.hpp), so the
/// device orchestration runs in CI without one.
struct HostAsync { static constexpr std::string_view name = "HostAsync"; };

/// The `optimizer.params` keys of a DeepSpeed config that an optimizer reads, as flags: the config
/// reader reads exactly its optimizer's (any other key there is unknown) and the writer writes them.
namespace optimizer_params {
inline constexpr unsigned lr = 1u << 0, betas = 1u << 1, eps = 1u << 2, weight_decay = 1u << 3,
                          bias_correction = 1u << 4, adam_w_mode = 1u << 5,
                          trust_clamp = 1u << 6,   ///< max_coeff, min_coeff
                          freeze_step = 1u << 7,
                          onebit_comm = 1u << 8,   ///< cuda_aware, comm_backend_name
                          zero_one = 1u << 9,      ///< var_freeze_step, var_update_scaler, local_step_*
                          onebit_lamb = 1u << 10;  ///< coeff_beta, factor_max, factor_min, factor_threshold
/// What every Adam-family optimizer reads.
inline constexpr unsigned adam = lr | betas | eps | weight_decay | bias_correction;
}  // namespace optimizer_params

/// The optimizer tags: `name` is DeepSpeed's "type" (matched case-insensitively by the config
/// reader); `params` the `optimizer.params` keys it reads; `one_bit`: it compresses exchanges of
/// its own in place of stage 0's gradient all-reduce; `whole_partition`: its step needs the whole
/// partition at once (LAMB's per-tensor norms), so it cannot step sub-group by sub-group;
/// `moments`: the moment vectors the state stores keep beside the fp32 master (1: m; 2: m and v);
/// `states`: its per-element states in checkpoints, in DeepSpeed's order exp_avg, exp_avg_sq,
/// exp_avg_sq_fresh (the moments, and 1-bit LAMB's fresh variance).
/// engine/compat.hpp's rules read the traits; optimizer_tags below lists every tag.
struct Adam {  ///< Adam with L2 weight decay (adam_w_mode = false)
  static constexpr std::string_view name = "Adam";
  static constexpr std::size_t moments = 2, states = 2;
  static constexpr unsigned params = optimizer_params::adam | optimizer_params::adam_w_mode;
  static constexpr bool one_bit = false, whole_partition = false;
};
struct AdamW {  ///< Adam with decoupled weight decay
  static constexpr std::string_view name = "AdamW";
  static constexpr std::size_t moments = 2, states = 2;
  static constexpr unsigned params = optimizer_params::adam | optimizer_params::adam_w_mode;
  static constexpr bool one_bit = false, whole_partition = false;
};
struct Lamb {  ///< LAMB (layer-wise trust ratio)
  static constexpr std::string_view name = "Lamb";
  static constexpr std::size_t moments = 2, states = 2;
  static constexpr unsigned params = optimizer_params::adam | optimizer_params::trust_clamp;
  static constexpr bool one_bit = false, whole_partition = true;
};
struct OneBitAdam {  ///< 1-bit Adam (compressed momentum all-reduce after warm-up)
  static constexpr std::string_view name = "OneBitAdam";
  static constexpr std::size_t moments = 2, states = 2;
  static constexpr unsigned params =
      optimizer_params::adam | optimizer_params::freeze_step | optimizer_params::onebit_comm;
  static constexpr bool one_bit = true, whole_partition = false;
};
struct OneBitLamb {  ///< 1-bit LAMB
  static constexpr std::string_view name = "OneBitLamb";
  static constexpr std::size_t moments = 2, states = 3;
  static constexpr unsigned params = optimizer_params::adam | optimizer_params::trust_clamp |
                                     optimizer_params::freeze_step | optimizer_params::onebit_comm |
                                     optimizer_params::onebit_lamb;
  static constexpr bool one_bit = true, whole_partition = true;
};
struct ZeroOneAdam {  ///< 0/1 Adam (variance freezing with 1-bit gradients, then local steps with 1-bit syncs)
  static constexpr std::string_view name = "ZeroOneAdam";
  static constexpr std::size_t moments = 2, states = 2;
  static constexpr unsigned params =
      optimizer_params::adam | optimizer_params::zero_one | optimizer_params::onebit_comm;
  static constexpr bool one_bit = true, whole_partition = false;
};

struct Lion {  ///< Lion (sign update, one moment; optim/lion.hpp)
  static constexpr std::string_view name = "Lion";
  static constexpr unsigned params = optimizer_params::lr | optimizer_params::betas | optimizer_params::weight_decay;
  static constexpr std::size_t moments = 1, states = 1;
  static constexpr bool one_bit = false, whole_partition = false;
};

/// A list of types.
template <class... Ts>
struct type_list {
  static constexpr std::size_t size = sizeof...(Ts);
};

/// Every optimizer tag, in a fixed order: the config layer's OptimizerKind is an index into it, and
/// reads each tag's name and traits (config/options.hpp). A new optimizer adds its tag here.
using optimizer_tags = type_list<Adam, AdamW, Lamb, OneBitAdam, OneBitLamb, ZeroOneAdam, Lion>;

/// Calls f(Tag{}) for the tag of `list` whose name is `name` (exact spelling); false if none is.
template <class F, class... Ts>
constexpr bool visit_named(type_list<Ts...>, std::string_view name, F&& f) {
  return ((Ts::name == name ? (f(Ts{}), true) : false) || ...);
}

namespace detail {
/// "NofM<N,M>" spelled at compile time (N and M below 100).
struct NofMName {
  char chars[16] = {};
  std::size_t size = 0;
  constexpr void put(char c) { chars[size++] = c; }
  constexpr void put_number(int v) {
    if (v >= 10) put(static_cast<char>('0' + v / 10));
    put(static_cast<char>('0' + v % 10));
  }
  constexpr NofMName(int n, int m) {
    for (char c : {'N', 'o', 'f', 'M', '<'}) put(c);
    put_number(n);
    put(',');
    put_number(m);
    put('>');
  }
};
}  // namespace detail

/// Sparsity<NofM<N, M>>: in every group of M consecutive weights along a parameter's last dimension,
/// the N of largest magnitude are kept and the others held at zero (2:4 for sparse tensor cores;
/// sparsity/nm.hpp). `name` is how errors and descriptions spell it: "NofM<2,4>".
template <int N, int M>
struct NofM {
  static_assert(N >= 1 && N < M && M <= 32, "NofM<N, M>: keep 1 <= N < M <= 32 of every M weights, e.g. NofM<2, 4>");
  static constexpr int n = N, m = M;
  static constexpr detail::NofMName spelled{N, M};
  static constexpr std::string_view name{spelled.chars, spelled.size};
};

/// GradientCompression<TopK>: the k largest |g| with error feedback (compress/topk.hpp).
struct TopK { static constexpr std::string_view name = "TopK", key = "topk"; };
/// GradientCompression<TwoBit>: 4 levels with error feedback (compress/two_bit.hpp).
struct TwoBit { static constexpr std::string_view name = "TwoBit", key = "2bit"; };
/// GradientCompression<Sign>: signs and one scale with error feedback (compress/sign.hpp).
struct Sign { static constexpr std::string_view name = "Sign", key = "1bit"; };

// ---- policy slots ---------------------------------------------------------------------------------

namespace policy {
struct partitioner { static constexpr const char* name = "Partitioner"; };
struct bucketer { static constexpr const char* name = "Bucketer"; };
struct loss_scaler { static constexpr const char* name = "LossScaler"; };
struct offload { static constexpr const char* name = "Offload"; };
struct param_offload { static constexpr const char* name = "OffloadParams"; };
struct optimizer { static constexpr const char* name = "Optimizer"; };
struct precision { static constexpr const char* name = "Precision"; };
struct device { static constexpr const char* name = "Device"; };
struct gradient_compression { static constexpr const char* name = "GradientCompression"; };
struct sparsity { static constexpr const char* name = "Sparsity"; };
}  // namespace policy

/// Precision<fp32|fp16|bf16>: the dtype of parameters and gradients the model computes with.
template <class P>
struct Precision {
  static_assert(dependent_false<P>, "Precision: use Precision<fp32>, Precision<fp16> or Precision<bf16>");
};
template <> struct Precision<fp32> { using policy_kind = policy::precision; using tag = fp32; using storage = float; static constexpr DType dtype = DType::fp32; };
template <> struct Precision<fp16> { using policy_kind = policy::precision; using tag = fp16; using storage = half; static constexpr DType dtype = DType::fp16; };
template <> struct Precision<bf16> { using policy_kind = policy::precision; using tag = bf16; using storage = bfloat16; static constexpr DType dtype = DType::bf16; };

/// Device<Host|Cuda|HostAsync>: where parameters, gradients and kernels live. `on_device`: in a
/// device's memory, reached through its streams (Cuda, and HostAsync, which emulates one); `is_cuda`:
/// the CUDA kernels and a device-memory communicator (NCCL).
template <class D>
struct Device {
  static_assert(dependent_false<D>, "Device: use Device<Host>, Device<Cuda> or Device<HostAsync>");
};
template <> struct Device<Host> { using policy_kind = policy::device; using tag = Host; static constexpr bool is_cuda = false, on_device = false; };
template <> struct Device<Cuda> { using policy_kind = policy::device; using tag = Cuda; static constexpr bool is_cuda = true, on_device = true; };
template <> struct Device<HostAsync> { using policy_kind = policy::device; using tag = HostAsync; static constexpr bool is_cuda = false, on_device = true; };

/// Offload<None|Cpu|Nvme>: where the optimizer state and fp32 master live.
template <class O>
struct Offload {
  static_assert(dependent_false<O>, "Offload: use Offload<None>, Offload<Cpu> or Offload<Nvme>");
};
template <> struct Offload<None> { using policy_kind = policy::offload; using tag = None; };
template <> struct Offload<Cpu> { using policy_kind = policy::offload; using tag = Cpu; };
template <> struct Offload<Nvme> { using policy_kind = policy::offload; using tag = Nvme; };

/// OffloadParams<None|Cpu|Nvme>: where ZeRO stage 3 keeps this rank's shard of the parameters
/// (DeepSpeed `zero_optimization.offload_param.device`). A slot of its own beside Offload<>, as
/// DeepSpeed has two blocks: the two combine freely (both: the compute space keeps no model state
/// beyond the gathered buckets). Cpu: page-locked host memory, staged into a bucket's gather buffer
/// just before its all-gather (offload/pinned_shard.hpp); needs Partitioner<Stage<3>>.
template <class O>
struct OffloadParams {
  static_assert(dependent_false<O>, "OffloadParams: use OffloadParams<None>, OffloadParams<Cpu> or OffloadParams<Nvme>");
};
template <> struct OffloadParams<None> { using policy_kind = policy::param_offload; using tag = None; };
template <> struct OffloadParams<Cpu> { using policy_kind = policy::param_offload; using tag = Cpu; };
template <> struct OffloadParams<Nvme> { using policy_kind = policy::param_offload; using tag = Nvme; };

/// GradientCompression<None|TopK|TwoBit|Sign>: the codec stage 0's gradient reduction sends instead of
/// the dense all-reduce (DeepSpeed config block `gradient_compression`, `algorithm: topk | 2bit | 1bit`;
/// zero/grads/compressed_all_reduce.hpp). Run-time knobs (topk_ratio, huffman_coding) are
/// EngineOptions::compression. Needs Partitioner<Stage<0>> (engine/compat.hpp).
template <class C>
struct GradientCompression {
  static_assert(dependent_false<C>,
                "GradientCompression: use GradientCompression<None>, <TopK>, <TwoBit> or <Sign>");
};
template <> struct GradientCompression<None> { using policy_kind = policy::gradient_compression; using tag = None; };
template <> struct GradientCompression<TopK> { using policy_kind = policy::gradient_compression; using tag = TopK; };
template <> struct GradientCompression<TwoBit> { using policy_kind = policy::gradient_compression; using tag = TwoBit; };
template <> struct GradientCompression<Sign> { using policy_kind = policy::gradient_compression; using tag = Sign; };

/// Sparsity<None|NofM<N, M>>: structured sparsity of the parameters a rule selects
/// (EngineOptions::sparsity: which parameters, when the masks are chosen). With NofM the engine
/// keeps, per ZeRO shard, a mask of the kept weights: from the step that chooses it, the pruned
/// weights' gradients are zero before the norm and their master values zero after every update
/// (NVIDIA ASP's order; engine/sparsity.hpp). Needs a host state store (engine/compat.hpp).
template <class S>
struct Sparsity {
  static_assert(dependent_false<S>, "Sparsity: use Sparsity<None> or Sparsity<NofM<N, M>>, e.g. Sparsity<NofM<2, 4>>");
};
template <> struct Sparsity<None> { using policy_kind = policy::sparsity; using tag = None; };
template <int N, int M>
struct Sparsity<NofM<N, M>> {
  using policy_kind = policy::sparsity;
  using tag = NofM<N, M>;
};

/// The tag a single-argument policy was instantiated with: policy_tag_t<LossScaler<Dynamic>> is Dynamic.
template <class P>
struct policy_tag;
template <template <class> class Policy, class Tag>
struct policy_tag<Policy<Tag>> {
  using type = Tag;
};
template <class P>
using policy_tag_t = typename policy_tag<P>::type;

// ---- reading a pack ------------------------------------------------------------------------------

/// True when P declares which slot it fills.
template <class P>
concept Policy = requires { typename P::policy_kind; };

namespace detail {
template <class Kind, class P>
inline constexpr bool is_kind_v = std::is_same_v<typename P::policy_kind, Kind>;

template <class Kind, class... Ps>
inline constexpr std::size_t count_kind_v = (std::size_t{0} + ... + (is_kind_v<Kind, Ps> ? 1 : 0));

template <class Kind, class Default, class... Ps>
struct find_kind {
  using type = Default;
};
template <class Kind, class Default, class P, class... Ps>
struct find_kind<Kind, Default, P, Ps...> {
  using type = std::conditional_t<is_kind_v<Kind, P>, P, typename find_kind<Kind, Default, Ps...>::type>;
};
}  // namespace detail

/// Marker for "slot not given, no default".
struct missing_policy {
  using policy_kind = void;
};

/// The policy filling slot `Kind` in `Ps...`, or `Default`.
template <class Kind, class Default, class... Ps>
using find_policy_t = typename detail::find_kind<Kind, Default, Ps...>::type;

template <class Kind, class... Ps>
inline constexpr std::size_t policy_count_v = detail::count_kind_v<Kind, Ps...>;

/// Checks a policy pack: everything is a policy and no slot is filled twice. Instantiate it in a
/// class that takes policies; the static_asserts name the slot.
template <class... Ps>
struct PolicyPackCheck {
  static_assert((Policy<Ps> && ...),
                "Engine: every template argument must be a zerotk policy (Partitioner<...>, Bucketer<...>, "
                "LossScaler<...>, Offload<...>, OffloadParams<...>, Optimizer<...>, Precision<...>, Device<...>, "
                "GradientCompression<...>, Sparsity<...>)");
  static_assert(policy_count_v<policy::partitioner, Ps...> <= 1, "Engine: Partitioner given more than once");
  static_assert(policy_count_v<policy::bucketer, Ps...> <= 1, "Engine: Bucketer given more than once");
  static_assert(policy_count_v<policy::loss_scaler, Ps...> <= 1, "Engine: LossScaler given more than once");
  static_assert(policy_count_v<policy::offload, Ps...> <= 1, "Engine: Offload given more than once");
  static_assert(policy_count_v<policy::param_offload, Ps...> <= 1, "Engine: OffloadParams given more than once");
  static_assert(policy_count_v<policy::optimizer, Ps...> <= 1, "Engine: Optimizer given more than once");
  static_assert(policy_count_v<policy::precision, Ps...> <= 1, "Engine: Precision given more than once");
  static_assert(policy_count_v<policy::device, Ps...> <= 1, "Engine: Device given more than once");
  static_assert(policy_count_v<policy::gradient_compression, Ps...> <= 1,
                "Engine: GradientCompression given more than once");
  static_assert(policy_count_v<policy::sparsity, Ps...> <= 1, "Engine: Sparsity given more than once");
  static constexpr bool value = true;
};

}  // namespace zerotk
