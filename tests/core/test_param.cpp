#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/macros.hpp"
#include "zerotk/core/param.hpp"
#if ZEROTK_HAS_EIGEN
#include "zerotk/core/eigen.hpp"
#endif

using namespace zerotk;

namespace {
struct TwoLayer {
  Param<float> w{"fc.weight", {3, 4}};
  Param<float> b{"fc.bias", {3}};
  template <class Visit>
  void parameters(Visit&& visit) {
    visit("fc.weight", w);
    visit("fc.bias", b);
  }
};

struct Identity : TwoLayer {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  output_type forward(const input_type& x) { return x; }
  input_type backward(const output_type& dy) { return dy; }
};

struct NotAParam {
  using value_type = double;  // zerotk stores float, half or bfloat16 only
  std::size_t numel() const { return 1; }
  void bind(double*, double*) {}
  double* data() { return nullptr; }
  double* grad() { return nullptr; }
};
}  // namespace

static_assert(Module<TwoLayer>);
static_assert(!Layer<TwoLayer>);
static_assert(Layer<Identity>);
static_assert(!Parameter<NotAParam>);
static_assert(!Module<int>);

TEST_CASE("Param: shape, numel, binding") {
  Param<float> p{"w", {2, 3, 4}};
  CHECK(p.name() == "w");
  CHECK(p.rank() == 3);
  CHECK(p.numel() == 24);
  CHECK(p.dim(1) == 3);
  CHECK_FALSE(p.is_bound());
  CHECK(p.values().empty());
  std::vector<float> data(24, 1.0f), grad(24, 0.0f);
  p.bind(data.data(), grad.data());
  CHECK(p.is_bound());
  p.values()[5] = 7.0f;
  CHECK(data[5] == 7.0f);
  CHECK(p.grads().size() == 24);

  Param<float> scalar{"s", {}};
  CHECK(scalar.numel() == 1);
  Param<half> empty{"e", {0, 5}};
  CHECK(empty.numel() == 0);
  CHECK_THROWS_AS((Param<float>{"too_many", {1, 2, 3, 4, 5}}), usage_error);
}

TEST_CASE("Module visits named parameters in order") {
  TwoLayer m;
  std::vector<std::string> names;
  std::size_t total = 0;
  for_each_parameter(m, [&](std::string_view name, auto& p) {
    names.emplace_back(name);
    total += p.numel();
  });
  CHECK(names == std::vector<std::string>{"fc.weight", "fc.bias"});
  CHECK(total == 15);
}

#if ZEROTK_HAS_EIGEN
TEST_CASE("EigenParam maps engine storage as a row-major matrix") {
  EigenParam<float> w{"w", 2, 3};
  CHECK(w.numel() == 6);
  CHECK_THROWS_AS(w.matrix(), usage_error);
  std::vector<float> data{1, 2, 3, 4, 5, 6}, grad(6);
  w.bind(data.data(), grad.data());
  CHECK(w.matrix()(1, 0) == 4.0f);
  w.grad_matrix()(0, 2) = 9.0f;
  CHECK(grad[2] == 9.0f);
  Eigen::Vector3f x(1, 1, 1);
  Eigen::Vector2f y = w.matrix() * x;
  CHECK(y(0) == 6.0f);
  CHECK(y(1) == 15.0f);
}
#endif
