#pragma once
/// \file zerotk/plan/context.hpp
/// Context parallelism in the planner (docs/context.md, SEMANTICS.md section 17): the elements
/// each rank sends per transformer layer under Ulysses (a2a), the ring (p2p) and both (a2a+p2p),
/// the ring's bytes under a block-sparse layout (what context::MaskedRing sends), and the sequence
/// share per rank at which the ring's transfers hide behind its attention compute.
///
/// Per layer per rank, B micro batch, N sequence, h hidden, h_kv = h x kv_heads / heads, P ranks:
///   a2a      forward B N (2h + 2h_kv)(P-1)/P^2; forward + backward twice that
///   p2p      forward 2 B N h_kv (P-1)/P; forward + backward 6 B N h_kv (P-1)/P
///   a2a+p2p  (A x R = P) a2a B N (2h + 2h_kv)(A-1)/(P A) + ring 2 B N h_kv (R-1)/(R A) forward;
///            forward + backward twice the a2a part and three times the ring part
/// The ring's step hides its transfer when its attention (4 n^2 h FLOPs for n = N/P queries and
/// keys, forward) takes at least as long as moving one K and V block (2 n h_kv b bytes):
/// n >= (b h_kv / 2h)(F / BW).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/context/sparsity.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::plan {

enum class CpMode : std::uint8_t { a2a, p2p, a2a_p2p };

constexpr std::string_view to_string(CpMode m) noexcept {
  return m == CpMode::a2a ? "a2a" : m == CpMode::p2p ? "p2p" : "a2a+p2p";
}

struct ContextShape {
  std::size_t micro_batch = 1, sequence = 0, hidden = 0, heads = 1, kv_heads = 0;  ///< kv_heads 0: heads
  std::size_t cp = 1;
  CpMode mode = CpMode::a2a;
  std::size_t a2a = 0;  ///< a2a+p2p: the Ulysses degree A (P / A ranks in the ring)

  std::size_t h_kv() const noexcept { return hidden * (kv_heads ? kv_heads : heads) / heads; }
  std::size_t ring() const noexcept { return mode == CpMode::a2a ? 1 : mode == CpMode::p2p ? cp : cp / a2a; }
  std::size_t ulysses() const noexcept { return mode == CpMode::a2a ? cp : mode == CpMode::p2p ? 1 : a2a; }

  /// Throws config_error naming the flag of an impossible combination.
  void validate() const {
    if (cp < 1) throw config_error("must be >= 1", "--cp", std::to_string(cp));
    if (sequence == 0 || sequence % cp != 0) {
      throw config_error("the sequence must divide by the context ranks (each holds N / P tokens)", "--cp",
                         std::to_string(cp) + " for --seq " + std::to_string(sequence));
    }
    if (kv_heads != 0 && (kv_heads > heads || heads % kv_heads != 0)) {
      throw config_error("must divide --heads (" + std::to_string(heads) + ")", "--kv-heads", std::to_string(kv_heads));
    }
    if (mode == CpMode::a2a_p2p && (a2a < 1 || cp % a2a != 0)) {
      throw config_error("a2a+p2p needs the Ulysses degree A dividing --cp (" + std::to_string(cp) + ")", "--a2a",
                         std::to_string(a2a));
    }
  }
};

/// Elements one rank sends per layer: the all-to-all's and the ring's parts, forward and forward + backward.
struct ContextTraffic {
  std::uint64_t a2a_forward = 0, ring_forward = 0;
  std::uint64_t forward() const noexcept { return a2a_forward + ring_forward; }
  std::uint64_t forward_backward() const noexcept { return 2 * a2a_forward + 3 * ring_forward; }
};

/// SEMANTICS.md section 17's counts (exact when the degrees divide the heads and the sequence).
inline ContextTraffic context_traffic(const ContextShape& s) {
  s.validate();
  const std::uint64_t B = s.micro_batch, N = s.sequence, h = s.hidden, kv = s.h_kv(), P = s.cp;
  const std::uint64_t A = s.ulysses(), R = s.ring();
  ContextTraffic t;
  t.a2a_forward = B * N * (2 * h + 2 * kv) * (A - 1) / (P * A);
  t.ring_forward = 2 * B * N * kv * (R - 1) / (R * A);
  return t;
}

/// The ring's forward elements per rank when it sends only the blocks `layout` needs
/// (context::MaskedRing), the most any rank sends: B x (needed blocks) x block x h_kv x 2. The
/// layout covers the whole sequence; ring rank r holds tokens [r N/R, (r + 1) N/R).
inline std::uint64_t masked_ring_forward(const ContextShape& s, const context::BlockLayout& layout, bool causal) {
  s.validate();
  const std::size_t R = s.ring(), block = static_cast<std::size_t>(layout.block_size());
  const std::size_t n = s.sequence / R;
  if (n % block != 0 || static_cast<std::size_t>(layout.blocks()) * block != s.sequence) {
    throw config_error("each ring rank's tokens must be whole layout blocks", "--sparse-attention block",
                       std::to_string(block) + " for " + std::to_string(n) + " tokens a ring rank");
  }
  const auto needs = context::ring_needs(layout, static_cast<int>(R), causal);
  std::uint64_t most = 0;  // blocks the busiest rank sends
  for (std::size_t from = 0; from < R; ++from) {
    std::uint64_t blocks = 0;
    for (std::size_t to = 0; to < R; ++to) blocks += to == from ? 0 : needs[from * R + to].size();
    most = std::max<std::uint64_t>(most, blocks);
  }
  // Under a2a+p2p each ring rank holds 1/A of the KV heads.
  return 2 * s.micro_batch * most * block * s.h_kv() / s.ulysses();
}

/// The tokens per ring rank from which the ring's transfers hide behind its attention:
/// (b h_kv / 2h)(F / BW), for `bytes` per element, `flops` FLOP/s and `bandwidth` bytes/s.
inline double ring_hiding_tokens(const ContextShape& s, double bytes, double flops, double bandwidth) {
  return bytes * static_cast<double>(s.h_kv()) / (2.0 * static_cast<double>(s.hidden)) * flops / bandwidth;
}

}  // namespace zerotk::plan
