#pragma once
// A plain attention kernel for the context tests (test_ring.cpp, test_context_engine.cpp): the
// user's kernel that context/ring.hpp and context/ulysses.hpp leave to the user. fp32, in a fixed
// order, so it gives the same bits wherever it runs on the same rows.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace zt_test {

inline constexpr float kNoKeys = -std::numeric_limits<float>::infinity();

// `heads` heads of d elements per token, laid out [token x head x d]. Queries at positions qp
// attend keys at positions kp with kp <= qp (causal) or all (not); head a of the queries reads
// head a of the keys and values.
struct AttentionKernel {
  std::size_t d = 4;
  std::size_t heads = 1;
  bool causal = true;
  float scale() const { return 1.f / std::sqrt(static_cast<float>(d)); }
  bool sees(std::size_t qp, std::size_t kp) const { return !causal || kp <= qp; }
  std::size_t at(std::size_t token, std::size_t head) const { return (token * heads + head) * d; }

  // o_b (normalized over the block) and lse_b per (query, head): [nq x heads x d], [nq x heads].
  void forward(std::span<const float> q, const std::vector<std::size_t>& qp, std::span<const float> k,
               std::span<const float> v, const std::vector<std::size_t>& kp, std::vector<float>& o_b,
               std::vector<float>& lse_b) const {
    const std::size_t nq = qp.size(), nk = kp.size();
    o_b.assign(nq * heads * d, 0.f), lse_b.assign(nq * heads, kNoKeys);
    std::vector<float> s(nk);
    for (std::size_t t = 0; t < nq; ++t) {
      for (std::size_t a = 0; a < heads; ++a) {
        float top = kNoKeys;
        for (std::size_t j = 0; j < nk; ++j) {
          if (!sees(qp[t], kp[j])) continue;
          float dot = 0;
          for (std::size_t i = 0; i < d; ++i) dot += q[at(t, a) + i] * k[at(j, a) + i];
          s[j] = dot * scale();
          top = std::max(top, s[j]);
        }
        if (top == kNoKeys) continue;
        float sum = 0;
        for (std::size_t j = 0; j < nk; ++j) {
          if (sees(qp[t], kp[j])) sum += std::exp(s[j] - top);
        }
        for (std::size_t j = 0; j < nk; ++j) {
          if (!sees(qp[t], kp[j])) continue;
          const float p = std::exp(s[j] - top) / sum;
          for (std::size_t i = 0; i < d; ++i) o_b[at(t, a) + i] += p * v[at(j, a) + i];
        }
        lse_b[t * heads + a] = top + std::log(sum);
      }
    }
  }

  // Adds this block's contributions to dq, dk, dv, given the final o, lse and d_o.
  void backward(std::span<const float> q, const std::vector<std::size_t>& qp, std::span<const float> k,
                std::span<const float> v, const std::vector<std::size_t>& kp, std::span<const float> o,
                std::span<const float> lse, std::span<const float> d_o, std::span<float> dq, std::span<float> dk,
                std::span<float> dv) const {
    for (std::size_t t = 0; t < qp.size(); ++t) {
      for (std::size_t a = 0; a < heads; ++a) {
        const std::size_t qa = at(t, a);
        float D = 0;
        for (std::size_t i = 0; i < d; ++i) D += d_o[qa + i] * o[qa + i];
        for (std::size_t j = 0; j < kp.size(); ++j) {
          if (!sees(qp[t], kp[j])) continue;
          const std::size_t ka = at(j, a);
          float dot = 0, dp = 0;
          for (std::size_t i = 0; i < d; ++i) dot += q[qa + i] * k[ka + i], dp += d_o[qa + i] * v[ka + i];
          const float p = std::exp(dot * scale() - lse[t * heads + a]);
          const float ds = p * (dp - D) * scale();
          for (std::size_t i = 0; i < d; ++i) {
            dv[ka + i] += p * d_o[qa + i];
            dq[qa + i] += ds * k[ka + i];
            dk[ka + i] += ds * q[qa + i];
          }
        }
      }
    }
  }
};

}  // namespace zt_test
