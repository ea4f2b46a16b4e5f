#pragma once
// Deterministic inputs and serial references for communicator tests (threads here, MPI in
// tests/mpi). Every rank can regenerate every other rank's input from (seed, rank, index), so a
// rank checks its own outputs without communicating.
//
// Reference semantics (docs/comm.md): ranks combine in order 0..W-1; fp16/bf16 accumulate in fp32
// and round once; int32/uint8 sums wrap; max/min propagate the first NaN; avg = sum / W.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"

namespace zerotk::test {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Element `i` of rank `rank`'s input for case `seed`. `exact`: integers in [-8, 8], whose sums over
/// a few ranks are exact in every dtype and every combining order (for back ends that do not combine
/// in rank order); otherwise values in [-4, 4) using every mantissa bit, so rounding order shows.
template <class T>
T value(std::uint64_t seed, int rank, std::size_t i, bool exact) {
  const std::uint64_t h = mix(seed ^ mix((static_cast<std::uint64_t>(rank) << 40) + i));
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    return static_cast<std::uint8_t>(exact ? h % 17 : h);
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return exact ? static_cast<std::int32_t>(h % 17) - 8 : static_cast<std::int32_t>(static_cast<std::uint32_t>(h));
  } else if constexpr (std::is_same_v<T, double>) {
    return exact ? static_cast<double>(static_cast<int>(h % 17) - 8) : static_cast<double>(h >> 11) * 0x1p-53 * 8.0 - 4.0;
  } else {
    const float f = exact ? static_cast<float>(static_cast<int>(h % 17) - 8)
                          : static_cast<float>(static_cast<double>(h >> 11) * 0x1p-53 * 8.0 - 4.0);
    return from_float<T>(f);
  }
}

/// n floats in [-scale, scale) from a 32-bit linear congruential stream seeded by `seed` and
/// `salt` (the engine-level tests' model values: tensor parallel, experts, context parallel; each
/// file keeps its own salt, so its values are what they were).
inline std::vector<float> lcg_values(std::size_t n, std::uint32_t seed, float scale, std::uint32_t salt) {
  std::vector<float> v(n);
  std::uint32_t s = seed * 2654435761u + salt;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

template <class T>
std::vector<T> make_data(std::uint64_t seed, int rank, std::size_t n, bool exact) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(seed, rank, i, exact);
  return v;
}

template <class T>
constexpr bool is_float_like = std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
auto load(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return to_float(x);
  }
}
template <class T, class A>
T store(A a) {
  if constexpr (std::is_same_v<T, double>) {
    return a;
  } else {
    return from_float<T>(a);
  }
}

/// Serial reference of a reduction of `in[0..W)[0..n)` in rank order.
template <class T>
std::vector<T> reduce_ref(const std::vector<std::vector<T>>& in, std::size_t n, comm::ReduceOp op) {
  using comm::ReduceOp;
  const int w = static_cast<int>(in.size());
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (is_float_like<T> || std::is_same_v<T, double>) {
      using A = std::conditional_t<std::is_same_v<T, double>, double, float>;  // fp32 accumulation for 16-bit
      A acc = load(in[0][i]);
      for (int r = 1; r < w; ++r) {
        const A x = load(in[static_cast<std::size_t>(r)][i]);
        if (op == ReduceOp::sum || op == ReduceOp::avg) {
          acc += x;
        } else if (!std::isnan(acc)) {
          if (std::isnan(x) || (op == ReduceOp::max ? x > acc : x < acc)) acc = x;
        }
      }
      if (op == ReduceOp::avg) acc /= static_cast<A>(w);
      out[i] = store<T>(acc);
    } else {
      std::int64_t acc = in[0][i];
      for (int r = 1; r < w; ++r) {
        const std::int64_t x = in[static_cast<std::size_t>(r)][i];
        if (op == ReduceOp::sum || op == ReduceOp::avg) {
          acc += x;
        } else if (op == ReduceOp::max ? x > acc : x < acc) {
          acc = x;
        }
      }
      // sums wrap to the element width; avg divides the wrapped sum, truncating toward zero
      const T wrapped = static_cast<T>(static_cast<std::make_unsigned_t<T>>(static_cast<std::uint64_t>(acc)));
      out[i] = op == ReduceOp::avg ? static_cast<T>(wrapped / w) : wrapped;
    }
  }
  return out;
}

/// Index of the first element whose bits differ, or n.
template <class T>
std::size_t first_difference(const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(T)) != 0) return i;
  }
  return n;
}

template <class T>
double as_double(T x) {
  if constexpr (is_float_like<T> && !std::is_same_v<T, float>) {
    return static_cast<double>(to_float(x));
  } else {
    return static_cast<double>(x);
  }
}

/// "" when equal bit for bit, else a description of the first difference.
template <class T>
std::string compare_bits(const std::string& what, const T* got, const T* want, std::size_t n) {
  const std::size_t i = first_difference(got, want, n);
  if (i == n) return {};
  return what + ": element " + std::to_string(i) + " of " + std::to_string(n) + " is " + std::to_string(as_double(got[i])) +
         ", expected " + std::to_string(as_double(want[i]));
}

/// An all_to_all_v case for world `w`: rank `from` sends v_count(...) elements to rank `to` (0 to
/// `most`, some blocks empty), element i of that block being value(seed, from, to * 2^20 + i), so
/// every rank can build both its own send buffer and what it must receive.
inline std::size_t v_count(std::uint64_t seed, int from, int to, std::size_t most) {
  const std::uint64_t h = mix(seed ^ mix((static_cast<std::uint64_t>(from) << 20) + static_cast<std::uint64_t>(to) + 1));
  return h % 4 == 0 ? 0 : static_cast<std::size_t>(h >> 8) % (most + 1);
}

template <class T>
struct VCase {
  std::vector<std::size_t> send_counts, recv_counts;
  std::vector<T> send, want;  // this rank's send buffer and the receive buffer it must end with
};

template <class T>
VCase<T> v_case(std::uint64_t seed, int rank, int w, std::size_t most) {
  VCase<T> c;
  const auto block = [&](int from, int to) {
    const std::size_t n = v_count(seed, from, to, most);
    std::vector<T> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = value<T>(seed, from, (static_cast<std::size_t>(to) << 20) + i, false);
    return b;
  };
  for (int d = 0; d < w; ++d) {
    const auto b = block(rank, d);
    c.send_counts.push_back(b.size());
    c.send.insert(c.send.end(), b.begin(), b.end());
  }
  for (int s = 0; s < w; ++s) {
    const auto b = block(s, rank);
    c.recv_counts.push_back(b.size());
    c.want.insert(c.want.end(), b.begin(), b.end());
  }
  return c;
}

}  // namespace zerotk::test
