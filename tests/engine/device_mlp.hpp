#pragma once
// The MLP of engine_fixture.hpp over parameters an engine binds to a device's memory, for the tests
// that run an engine on a device (Device<Cuda>: tests/cuda/engine_gpu_fixture.cuh; Device<HostAsync>:
// tests/device/test_host_async_engine.cpp). Each layer copies its device values into a host Dense<T>,
// runs it there, and copies its gradients back, every copy on the engine's compute stream. The device
// is a `Copies` type: Copies(void* stream), to_host(dst, src, bytes), to_device(dst, src, bytes)
// (both queued on the stream) and sync() (the host waits for the stream).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine_fixture.hpp"

namespace zt_test {

template <class T, class Copies>
struct DeviceDense {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  Dense<T> host;
  zerotk::Param<T> w, b;
  std::vector<T> values, grads;  // host storage of host.w, host.b
  Copies copies;
  bool poison_next_backward = false;

  DeviceDense(const Dense<T>& shape, void* stream)
      : host(shape.w.name().substr(0, shape.w.name().find('.')), shape.in, shape.out, shape.relu),
        w(host.w.name(), {host.w.dim(0), host.w.dim(1)}),
        b(host.b.name(), {host.b.dim(0)}),
        values(host.w.numel() + host.b.numel()),
        grads(values.size()),
        copies(stream) {}

  void bind_host() {
    host.w.bind(values.data(), grads.data());
    host.b.bind(values.data() + host.w.numel(), grads.data() + host.w.numel());
  }

  template <class V>
  void parameters(V&& visit) {
    visit(w.name(), w);
    visit(b.name(), b);
  }

  output_type forward(const input_type& x) {
    bind_host();
    copies.to_host(values.data(), w.data(), w.numel() * sizeof(T));
    copies.to_host(values.data() + w.numel(), b.data(), b.numel() * sizeof(T));
    copies.sync();
    return host.forward(x);
  }

  input_type backward(const output_type& dy) {
    bind_host();
    copies.to_host(grads.data(), w.grad(), w.numel() * sizeof(T));
    copies.to_host(grads.data() + w.numel(), b.grad(), b.numel() * sizeof(T));
    copies.sync();
    host.poison_next_backward = std::exchange(poison_next_backward, false);
    input_type dx = host.backward(dy);
    copies.to_device(w.grad(), grads.data(), w.numel() * sizeof(T));
    copies.to_device(b.grad(), grads.data() + w.numel(), b.numel() * sizeof(T));
    copies.sync();
    return dx;
  }
};

/// Mlp's interface (layers, parameters, init, values) over device parameters.
template <class T, class Copies>
struct DeviceMlp {
  std::vector<DeviceDense<T, Copies>> layers;
  Copies copies;

  explicit DeviceMlp(void* stream) : copies(stream) {
    const Mlp<T> shape;
    layers.reserve(shape.layers.size());
    for (const auto& l : shape.layers) layers.emplace_back(l, stream);
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
  /// Mlp::init's values (same seed, same rounding), copied into the bound device parameters.
  void init(std::uint32_t seed) {
    Mlp<T> ref;
    std::vector<T> storage(4096), unused(4096);
    std::size_t off = 0;
    ref.parameters([&](std::string_view, auto& p) {
      p.bind(storage.data() + off, unused.data() + off);
      off += p.numel();
    });
    ref.init(seed);
    off = 0;
    parameters([&](std::string_view, zerotk::Param<T>& p) {
      copies.to_device(p.data(), storage.data() + off, p.numel() * sizeof(T));
      off += p.numel();
    });
    copies.sync();
  }
  std::vector<float> values() {
    std::vector<float> v;
    parameters([&](std::string_view, zerotk::Param<T>& p) {
      std::vector<T> h(p.numel());
      copies.to_host(h.data(), p.data(), h.size() * sizeof(T));
      copies.sync();
      for (const T& x : h) v.push_back(zerotk::to_float(x));
    });
    return v;
  }
};

}  // namespace zt_test
