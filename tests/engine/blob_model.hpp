#pragma once
// A model of uneven large fp16 (or, for emulated 16-bit, float) parameters for the memory, volume and
// ledger checks (no compute needed), a one-parameter "layer" view for scopes over one of them, and
// a training step over it.
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "zerotk/core/param.hpp"

namespace zt_test {

template <class T>
struct BasicBlob {
  std::vector<zerotk::Param<T>> ps;
  explicit BasicBlob(const std::vector<std::size_t>& sizes) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ps.emplace_back("p" + std::to_string(i), std::initializer_list<std::size_t>{sizes[i]});
    }
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& p : ps) visit(p.name(), p);
  }
};

template <class T>
struct BasicOneParam {
  zerotk::Param<T>* p;
  template <class V>
  void parameters(V&& v) {
    v(p->name(), *p);
  }
};

using Blob = BasicBlob<zerotk::half>;
using OneParam = BasicOneParam<zerotk::half>;

/// Sizes nothing divides evenly, with one tiny parameter.
inline const std::vector<std::size_t> kBlob = {40001, 123457, 77777, 250003, 9, 99991};

/// One training step over the blob in `order` (default: visiting order): each parameter's forward
/// scope (checking it is fetched inside), the backward scopes in reverse, step().
template <class E, class T>
void blob_step(E& engine, BasicBlob<T>& model, std::vector<int> order = {}) {
  if (order.empty()) {
    for (std::size_t i = 0; i < model.ps.size(); ++i) order.push_back(static_cast<int>(i));
  }
  for (int i : order) {
    BasicOneParam<T> one{&model.ps[static_cast<std::size_t>(i)]};
    auto s = engine.forward(one);
    CHECK(one.p->data() != nullptr);  // fetched for the scope
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    BasicOneParam<T> one{&model.ps[static_cast<std::size_t>(*it)]};
    auto s = engine.backward(one);
  }
  engine.step(0.0);
}

}  // namespace zt_test
