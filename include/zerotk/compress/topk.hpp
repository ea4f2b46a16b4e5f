#pragma once
/// \file zerotk/compress/topk.hpp
/// Top-k sparsification with error feedback: keep the k largest |y|, send them as (index, value)
/// pairs, and keep everything else in the error buffer.
///
///   y     = x + err                                          fp32
///   k     = topk_count(topk_ratio, n): ceil(topk_ratio * n), at least 1 and at most n for n > 0
///   kept  = the k indices of largest |y|; among equal |y| the lower indices first (deterministic)
///   err_j = 0 for kept j, y_j otherwise                      exact: D + err == y bit for bit
///
/// Payload: [u32 n][u32 k][k x u32 index, ascending][k x fp32 value], little-endian.
/// payload_bytes(n) = 8 + 8 k. Indices are u32, so n < 2^32 (checked).
/// `indices_to_gaps` / `gaps_to_indices` turn the index field into gaps in place (first index, then
/// differences): small numbers whose high bytes are 0, which compress/huffman.hpp then codes tightly.
///
/// Selection is a radix select on the magnitude bits (abs_key: |y|'s bits order finite floats by
/// magnitude): a histogram of the top 11 bits over all n, the elements of the boundary bin collected,
/// two more histograms (11 and 9 bits) over those alone, which fixes the exact k-th key and how many
/// elements equal to it are kept; then one pass emits the kept indices in ascending order. Three
/// streaming passes over y, no sort, no copy of y (std::nth_element reorders a copy; see
/// bench/compress).
///
/// TopKCodec::encode runs its three passes over kernels/host/parallel.hpp's threads, in the same
/// contiguous shares each pass: one histogram and one candidate list per share, combined in share
/// order; each share's place in the payload and its part of the kept ties follow from its counts, so
/// the payload and the error are the same on any thread count. (topk::select, the selection alone,
/// stays on one thread.)

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "zerotk/compress/codec.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/kernels/host/parallel.hpp"

namespace zerotk::compress {

/// k for a ratio and n: ceil(ratio * n) with the product in fp64, where a product within 4 ulp of an
/// integer counts as that integer (so 0.07 * 100 keeps 7, although the fp64 product is
/// 7.000000000000001, while 0.5000001 * 2^30 still rounds up); then clamped to [1, n]. 0 for n = 0.
/// `ratio` must be in (0, 1].
inline std::size_t topk_count(double ratio, std::size_t n) {
  if (n == 0) return 0;
  const double p = ratio * static_cast<double>(n);
  const double r = std::nearbyint(p);
  const double k = std::fabs(p - r) <= 4 * std::numeric_limits<double>::epsilon() * std::max(1.0, p) ? r : std::ceil(p);
  if (k < 1.0) return 1;
  if (k >= static_cast<double>(n)) return n;
  return static_cast<std::size_t>(k);
}

namespace topk {

/// The k-th largest key and how many elements with exactly that key are kept (the first ones).
struct Threshold {
  std::uint32_t key = 0;
  std::size_t take_equal = 0;
};

namespace detail {

inline constexpr unsigned kBins1 = 2048;  // key bits 30..20 (bit 31 of an abs_key is 0)
inline constexpr unsigned kBins2 = 2048;  // key bits 19..9
inline constexpr unsigned kBins3 = 512;   // key bits 8..0

/// The bin, from the top, where the running count reaches `need` (1 <= need <= total), and how
/// many of `need` fall into that bin.
template <std::size_t B>
inline std::pair<unsigned, std::size_t> pick_bin(const std::array<std::size_t, B>& hist, std::size_t need) {
  for (std::size_t b = B; b-- > 0;) {
    if (hist[b] >= need) return {static_cast<unsigned>(b), need};
    need -= hist[b];
  }
  return {0, need};  // not reached when need <= total
}

/// From the candidates (every index whose key's top bits are b1, in one list or in several) and the
/// count still needed among them, the exact threshold.
inline Threshold refine(const float* y, std::span<const std::vector<std::uint32_t>> lists, unsigned b1,
                        std::size_t need) {
  std::array<std::size_t, kBins2> h2{};
  for (const auto& cand : lists) {
    for (std::uint32_t i : cand) ++h2[(compress::detail::abs_key(y[i]) >> 9) & 0x7ffu];
  }
  const auto [b2, need2] = pick_bin(h2, need);
  const std::uint32_t prefix = (b1 << 11) | b2;
  std::array<std::size_t, kBins3> h3{};
  for (const auto& cand : lists) {
    for (std::uint32_t i : cand) {
      const std::uint32_t key = compress::detail::abs_key(y[i]);
      if ((key >> 9) == prefix) ++h3[key & 0x1ffu];
    }
  }
  const auto [b3, need3] = pick_bin(h3, need2);
  return Threshold{(prefix << 9) | b3, need3};
}

inline void collect(const float* y, std::size_t n, unsigned b1, std::vector<std::uint32_t>& cand) {
  for (std::size_t i = 0; i < n; ++i) {
    if ((compress::detail::abs_key(y[i]) >> 20) == b1) cand.push_back(static_cast<std::uint32_t>(i));
  }
}

}  // namespace detail

/// The threshold of the k largest |y| of finite y[0..n), 1 <= k <= n < 2^32. `hist` is the top-11-bit
/// histogram of y's keys when the caller already has it (nullptr: computed here).
inline Threshold threshold(const float* y, std::size_t n, std::size_t k,
                           const std::array<std::size_t, detail::kBins1>* hist = nullptr) {
  std::array<std::size_t, detail::kBins1> h1{};
  if (hist == nullptr) {
    for (std::size_t i = 0; i < n; ++i) ++h1[compress::detail::abs_key(y[i]) >> 20];
    hist = &h1;
  }
  const auto [b1, need] = detail::pick_bin(*hist, k);
  std::vector<std::uint32_t> cand;
  cand.reserve((*hist)[b1]);
  detail::collect(y, n, b1, cand);
  return detail::refine(y, std::span(&cand, 1), b1, need);
}

/// Writes the kept indices (ascending) to idx[0..k) and, when `values` is not null, y at them.
/// Returns the count written (k).
inline std::size_t emit(const float* y, std::size_t n, Threshold t, std::uint32_t* idx, float* values) {
  std::size_t out = 0, equal = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t key = compress::detail::abs_key(y[i]);
    if (key > t.key || (key == t.key && equal++ < t.take_equal)) {
      idx[out] = static_cast<std::uint32_t>(i);
      if (values != nullptr) values[out] = y[i];
      ++out;
    }
  }
  return out;
}

/// The selection alone: ascending indices of the k largest |y| of finite y[0..n) into idx[0..k).
inline void select(const float* y, std::size_t n, std::size_t k, std::uint32_t* idx) {
  if (k == 0) return;
  if (k >= n) {
    for (std::size_t i = 0; i < n; ++i) idx[i] = static_cast<std::uint32_t>(i);
    return;
  }
  emit(y, n, threshold(y, n, k), idx, nullptr);
}

/// k from a payload's header, after checking that the payload is 8 + 8 k bytes long.
inline std::size_t kept_of(std::span<const std::uint8_t> payload, const char* where) {
  if (payload.size() < 8) throw usage_error("top-k payload shorter than its 8-byte header", where, std::to_string(payload.size()));
  const std::size_t k = compress::detail::load_le32(payload.data() + 4);
  if (payload.size() != 8 + 8 * k) {
    throw usage_error("top-k payload size is not 8 + 8 k for k = " + std::to_string(k), where,
                      std::to_string(payload.size()));
  }
  return k;
}

/// In place on a payload: the index field becomes first index, then differences (>= 1).
inline void indices_to_gaps(std::span<std::uint8_t> payload) {
  const std::size_t k = kept_of(payload, "compress::topk::indices_to_gaps");
  std::uint32_t prev = 0;
  for (std::size_t j = 0; j < k; ++j) {
    std::uint8_t* p = payload.data() + 8 + 4 * j;
    const std::uint32_t cur = compress::detail::load_le32(p);
    compress::detail::store_le32(p, cur - prev);
    prev = cur;
  }
}

/// The inverse of indices_to_gaps.
inline void gaps_to_indices(std::span<std::uint8_t> payload) {
  const std::size_t k = kept_of(payload, "compress::topk::gaps_to_indices");
  std::uint32_t acc = 0;
  for (std::size_t j = 0; j < k; ++j) {
    std::uint8_t* p = payload.data() + 8 + 4 * j;
    acc += compress::detail::load_le32(p);
    compress::detail::store_le32(p, acc);
  }
}

}  // namespace topk

/// Options of the top-k codec. `topk_ratio` in (0, 1]: the share of values kept.
struct TopKOptions {
  double topk_ratio = 0.01;
};

/// Top-k with error feedback (models ErrorFeedbackCodec).
class TopKCodec {
 public:
  static constexpr std::size_t kHeaderBytes = 8;  // u32 n, u32 k
  static constexpr std::size_t kBytesPerKept = 8;  // u32 index + fp32 value

  explicit TopKCodec(TopKOptions o = {}) : ratio_(o.topk_ratio) {
    if (!(ratio_ > 0.0 && ratio_ <= 1.0)) {
      throw config_error("topk_ratio must be in (0, 1]", "compress::TopKOptions::topk_ratio", to_text(ratio_));
    }
  }

  double topk_ratio() const noexcept { return ratio_; }
  std::size_t kept(std::size_t n) const { return topk_count(ratio_, n); }

  /// 8 + 8 * kept(n).
  std::size_t payload_bytes(std::size_t n) const { return kHeaderBytes + kBytesPerKept * kept(n); }

  std::size_t encode(std::span<const float> x, std::span<float> err, std::span<std::uint8_t> out) const {
    constexpr const char* kWhere = "compress::TopKCodec::encode";
    const std::size_t n = x.size();
    check_n(n, kWhere);
    const std::size_t k = kept(n);
    detail::check_encode_sizes(kWhere, n, err.size(), out.size(), payload_bytes(n));
    using Hist = std::array<std::size_t, topk::detail::kBins1>;
    const int shares = kernels::host::share_count(n);
    const auto ns = static_cast<std::size_t>(shares);
    // Pass 1 (read only): histogram of the keys of y = x + err, per share; inf/NaN land in bins >= 0x7f8.
    std::vector<Hist> hist(ns, Hist{});
    kernels::host::for_each_share_indexed(n, shares, [&](int s, std::size_t b, std::size_t e) {
      Hist& h = hist[static_cast<std::size_t>(s)];
      for (std::size_t i = b; i < e; ++i) ++h[detail::abs_key(x[i] + err[i]) >> 20];
    });
    Hist h1{};
    for (const Hist& h : hist) {
      for (std::size_t bin = 0; bin < h1.size(); ++bin) h1[bin] += h[bin];
    }
    for (std::size_t bin = detail::kNonfiniteKey >> 20; bin < h1.size(); ++bin) {
      if (h1[bin] != 0) detail::throw_nonfinite(kWhere, x, err);
    }
    // Pass 2: err = y, each share collecting its elements of the boundary bin (ascending).
    std::vector<std::vector<std::uint32_t>> cand(ns);
    unsigned b1 = 0;
    std::size_t need = 0;
    if (k > 0) {
      std::tie(b1, need) = topk::detail::pick_bin(h1, k);
      for (std::size_t s = 0; s < ns; ++s) cand[s].reserve(hist[s][b1]);
    }
    kernels::host::for_each_share_indexed(n, shares, [&](int s, std::size_t b, std::size_t e) {
      std::vector<std::uint32_t>& c = cand[static_cast<std::size_t>(s)];
      for (std::size_t i = b; i < e; ++i) {
        const float y = x[i] + err[i];
        err[i] = y;
        if (k > 0 && (detail::abs_key(y) >> 20) == b1) c.push_back(static_cast<std::uint32_t>(i));
      }
    });
    detail::store_le32(out.data(), static_cast<std::uint32_t>(n));
    detail::store_le32(out.data() + 4, static_cast<std::uint32_t>(k));
    if (k == 0) return kHeaderBytes;
    const topk::Threshold t = topk::detail::refine(err.data(), cand, b1, need);
    // Each share's first output slot and its part of the kept ties: the ties go to the lowest indices,
    // so to the shares in order.
    std::vector<std::size_t> first(ns), ties(ns);
    for (std::size_t s = 0, o = 0, ties_left = t.take_equal; s < ns; ++s) {
      std::size_t above = 0, equal = 0;
      for (std::size_t bin = b1 + 1; bin < hist[s].size(); ++bin) above += hist[s][bin];
      for (const std::uint32_t i : cand[s]) {
        const std::uint32_t key = detail::abs_key(err[i]);
        above += key > t.key;
        equal += key == t.key;
      }
      first[s] = o;
      ties[s] = std::min(equal, ties_left);
      ties_left -= ties[s];
      o += above + ties[s];
    }
    // Pass 3: emit the kept (index, value) pairs and clear their error.
    std::uint8_t* idx = out.data() + kHeaderBytes;
    std::uint8_t* val = idx + 4 * k;
    kernels::host::for_each_share_indexed(n, shares, [&](int s, std::size_t b, std::size_t e) {
      const auto us = static_cast<std::size_t>(s);
      std::size_t o = first[us], equal = 0;
      for (std::size_t i = b; i < e; ++i) {
        const std::uint32_t key = detail::abs_key(err[i]);
        if (key > t.key || (key == t.key && equal++ < ties[us])) {
          detail::store_le32(idx + 4 * o, static_cast<std::uint32_t>(i));
          detail::store_le_f32(val + 4 * o, err[i]);
          err[i] = 0.0f;
          ++o;
        }
      }
    });
    return payload_bytes(n);
  }

  /// decoded = 0 except the kept values. Rejects a payload whose header, size or indices (in range,
  /// strictly ascending) do not fit decoded.size().
  void decode(std::span<const std::uint8_t> in, std::span<float> decoded) const {
    const std::size_t k = checked_kept(in, decoded.size(), "compress::TopKCodec::decode");
    std::fill(decoded.begin(), decoded.end(), 0.0f);
    const std::uint8_t* idx = in.data() + kHeaderBytes;
    const std::uint8_t* val = idx + 4 * k;
    for (std::size_t j = 0; j < k; ++j) decoded[detail::load_le32(idx + 4 * j)] = detail::load_le_f32(val + 4 * j);
  }

  /// sum[i] += v for each kept (i, v); the other entries of sum are left as they are (so a -0 stays
  /// -0 where decode + add would give +0). The same checks as decode, all before the first write.
  void decode_add(std::span<const std::uint8_t> in, std::span<float> sum) const {
    const std::size_t k = checked_kept(in, sum.size(), "compress::TopKCodec::decode_add");
    const std::uint8_t* idx = in.data() + kHeaderBytes;
    const std::uint8_t* val = idx + 4 * k;
    for (std::size_t j = 0; j < k; ++j) sum[detail::load_le32(idx + 4 * j)] += detail::load_le_f32(val + 4 * j);
  }

 private:
  /// k of a payload for n values, after checking its size, header and indices.
  std::size_t checked_kept(std::span<const std::uint8_t> in, std::size_t n, const char* where) const {
    check_n(n, where);
    detail::check_payload_size(where, in.size(), payload_bytes(n), n);
    const std::size_t hn = detail::load_le32(in.data()), k = detail::load_le32(in.data() + 4);
    if (hn != n || k != kept(n)) {
      throw usage_error("payload header (n, k) does not match n = " + std::to_string(n) + ", k = " + std::to_string(kept(n)),
                        where, std::to_string(hn) + ", " + std::to_string(k));
    }
    const std::uint8_t* idx = in.data() + kHeaderBytes;
    for (std::size_t j = 0, prev = 0; j < k; ++j) {
      const std::size_t i = detail::load_le32(idx + 4 * j);
      if (i >= n || (j > 0 && i <= prev)) {
        throw usage_error("payload index out of range or not ascending at entry " + std::to_string(j), where,
                          std::to_string(i));
      }
      prev = i;
    }
    return k;
  }

  static void check_n(std::size_t n, const char* where) {
    if (n > std::numeric_limits<std::uint32_t>::max()) {
      throw usage_error("top-k indices are u32: n must be < 2^32", where, std::to_string(n));
    }
  }
  double ratio_;
};

}  // namespace zerotk::compress
