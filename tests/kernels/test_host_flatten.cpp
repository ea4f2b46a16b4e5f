// Flatten / unflatten: layouts (alignment, padding), zeroed gaps, conversion on the way, 10,000
// small tensors, empty tensors, and errors for layouts that do not fit.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_test_util.hpp"
#include "zerotk/kernels/host/flatten.hpp"

using namespace zerotk;
using namespace zerotk::kernels;

TEST_CASE("flat_layout: aligned offsets and a padded total") {
  const std::vector<std::size_t> numels = {5, 0, 16, 1, 33};
  const FlatLayout l = flat_layout(numels, 16, 6);
  CHECK(l.offsets == std::vector<std::size_t>{0, 16, 16, 32, 48});
  CHECK(l.numel == 84);  // 48 + 33 = 81 rounded up to a multiple of 6
  CHECK(l.slot(0) == 16);
  CHECK(l.slot(4) == 36);
  const FlatLayout packed = flat_layout(numels);
  CHECK(packed.offsets == std::vector<std::size_t>{0, 5, 5, 21, 22});
  CHECK(packed.numel == 55);
  CHECK(flat_layout(std::vector<std::size_t>{}, 16, 4).numel == 0);
  CHECK_THROWS_AS(flat_layout(numels, 0), usage_error);
}

TEST_CASE("flatten with a layout copies each tensor to its offset and zeroes the gaps; unflatten inverts") {
  test::Threads th(2);
  std::vector<std::vector<float>> ts;
  std::vector<std::size_t> numels;
  for (std::size_t t = 0; t < 40; ++t) {
    numels.push_back(t == 3 ? 0 : (t * 977) % 3001 + (t == 20 ? 100000 : 0));
    ts.push_back(test::randn(numels.back(), t));
  }
  std::vector<TensorRef<const float>> src;
  for (const auto& t : ts) src.push_back({t.data(), t.size()});
  const FlatLayout l = flat_layout(numels, 16, 8);
  std::vector<float> flat(l.numel, -1.0f);
  host::flatten<float, float>(src, flat.data(), l);
  std::vector<char> covered(l.numel, 0);
  for (std::size_t t = 0; t < ts.size(); ++t) {
    REQUIRE(test::same_bits(flat.data() + l.offsets[t], ts[t].data(), ts[t].size()));
    for (std::size_t i = 0; i < ts[t].size(); ++i) covered[l.offsets[t] + i] = 1;
  }
  for (std::size_t i = 0; i < l.numel; ++i) {
    if (!covered[i]) REQUIRE(flat[i] == 0.0f);  // padding is zero, not stale
  }
  std::vector<std::vector<float>> back(ts.size());
  std::vector<TensorRef<float>> dst;
  for (std::size_t t = 0; t < ts.size(); ++t) {
    back[t].assign(ts[t].size(), 0.0f);
    dst.push_back({back[t].data(), back[t].size()});
  }
  host::unflatten<float, float>(flat.data(), dst, l);
  for (std::size_t t = 0; t < ts.size(); ++t) REQUIRE(test::same_bits(back[t], ts[t]));
}

TEST_CASE("flatten converts fp32 into a 16-bit buffer exactly like cast") {
  std::vector<std::vector<float>> ts = {test::wide_values(1001, 1), test::wide_values(17, 2), test::wide_values(40000, 3)};
  std::vector<TensorRef<const float>> src;
  std::vector<std::size_t> numels;
  for (const auto& t : ts) {
    src.push_back({t.data(), t.size()});
    numels.push_back(t.size());
  }
  const FlatLayout l = flat_layout(numels, 32);
  std::vector<bfloat16> flat(l.numel);
  host::flatten<float, bfloat16>(src, flat.data(), l);
  for (std::size_t t = 0; t < ts.size(); ++t) {
    for (std::size_t i = 0; i < ts[t].size(); ++i) REQUIRE(flat[l.offsets[t] + i].bits == float_to_bf16_bits(ts[t][i]));
  }
  // And back to fp32: the bf16 values exactly.
  std::vector<std::vector<float>> back = {std::vector<float>(1001), std::vector<float>(17), std::vector<float>(40000)};
  std::vector<TensorRef<float>> dst;
  for (auto& b : back) dst.push_back({b.data(), b.size()});
  host::unflatten<bfloat16, float>(flat.data(), dst, l);
  for (std::size_t t = 0; t < ts.size(); ++t) {
    for (std::size_t i = 0; i < ts[t].size(); ++i) REQUIRE(back[t][i] == bf16_bits_to_float(float_to_bf16_bits(ts[t][i])));
  }
}

TEST_CASE("packed flatten / unflatten of 10,000 small tensors") {
  test::Threads th(2);
  const auto pool = test::randn(10000 * 64, 5);
  std::vector<TensorRef<const float>> src;
  std::size_t total = 0;
  for (std::size_t t = 0; t < 10000; ++t) {
    const std::size_t n = (t * 37) % 64;  // 0 .. 63 elements
    src.push_back({pool.data() + 64 * t, n});
    total += n;
  }
  std::vector<float> flat(total);
  host::flatten<float, float>(src, flat.data());
  std::size_t at = 0;
  for (const auto& s : src) {
    REQUIRE(test::same_bits(flat.data() + at, s.data, s.numel));
    at += s.numel;
  }
  std::vector<float> out(pool.size(), 0.0f);
  std::vector<TensorRef<float>> dst;
  for (std::size_t t = 0; t < 10000; ++t) dst.push_back({out.data() + 64 * t, src[t].numel});
  host::unflatten<float, float>(flat.data(), dst);
  for (std::size_t t = 0; t < 10000; ++t) REQUIRE(test::same_bits(out.data() + 64 * t, pool.data() + 64 * t, src[t].numel));
}

TEST_CASE("flatten rejects layouts that do not fit the tensors") {
  std::vector<float> a(10), b(20), flat(64);
  std::vector<TensorRef<const float>> src = {{a.data(), 10}, {b.data(), 20}};
  const FlatLayout one = flat_layout(std::vector<std::size_t>{10});
  CHECK_THROWS_AS((host::flatten<float, float>(src, flat.data(), one)), usage_error);
  const FlatLayout small = flat_layout(std::vector<std::size_t>{5, 20});  // tensor 0 needs 10
  CHECK_THROWS_AS((host::flatten<float, float>(src, flat.data(), small)), usage_error);
  std::vector<TensorRef<float>> dst = {{a.data(), 10}, {b.data(), 20}};
  CHECK_THROWS_AS((host::unflatten<float, float>(flat.data(), dst, small)), usage_error);
}
