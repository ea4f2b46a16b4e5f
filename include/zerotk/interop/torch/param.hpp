#pragma once
/// \file zerotk/interop/torch/param.hpp
/// The libtorch adapter's parameter: one trainable tensor of a torch module as a zerotk Parameter,
/// its data re-pointed at engine storage through one Storage the adapter owns (zerotk/interop/torch.hpp).
#include "zerotk/interop/torch/libtorch.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/core/concepts.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::interop {

/// One trainable tensor of a torch module, as a zerotk Parameter. The tensor stays the module's
/// (same TensorImpl); bind() re-points its data at engine storage.
///
/// The tensor reads the engine's memory through one torch Storage that this object owns for its
/// whole life and re-points on every bind (a non-owning pointer; null while stage 3 has the values
/// released). Every view of the tensor shares that Storage: a `weight.t()` autograd saved in a
/// child's forward reads what the tensor reads now, the values gathered again for the child's
/// backward, never the pool buffer the forward read (which may hold another child's values by
/// then); between the two it reads nothing (torch's checked accessors refuse a null storage).
class TorchParam {
 public:
  using value_type = float;

  /// Refuses what cannot live in a flat fp32 buffer in place, naming the parameter.
  TorchParam(std::string name, torch::Tensor tensor) : name_(std::move(name)), tensor_(std::move(tensor)) {
    if (tensor_.layout() != torch::kStrided) {
      throw usage_error("torch parameter is not a dense (strided) tensor; sparse parameters cannot be bound", name_);
    }
    if (tensor_.scalar_type() != torch::kFloat32) {
      throw usage_error("torch parameter must be float32 (the engine's Precision<> decides the stored type; "
                        "convert the module with module->to(torch::kFloat32) before wrapping)",
                        name_, std::string(c10::toString(tensor_.scalar_type())));
    }
    if (!tensor_.device().is_cpu()) {
      throw usage_error("torch parameter must be on the CPU (the adapter supports Device<Host> only)", name_,
                        tensor_.device().str());
    }
    if (!tensor_.is_contiguous()) {
      throw usage_error("torch parameter is not contiguous; make it contiguous before wrapping", name_);
    }
    for (std::int64_t d : tensor_.sizes()) sizes_.push_back(d);
    for (std::int64_t d : tensor_.sizes()) shape_.push_back(static_cast<std::size_t>(d));
    numel_ = static_cast<std::size_t>(tensor_.numel());
    // Not resizable: a resize_ of the bound tensor is refused by torch instead of re-allocating
    // behind the engine.
    storage_ = c10::Storage(c10::Storage::use_byte_size_t(), 0, at::DataPtr(nullptr, at::Device(at::kCPU)), nullptr,
                            /*resizable=*/false);
  }
  TorchParam(const TorchParam&) = delete;
  TorchParam& operator=(const TorchParam&) = delete;
  TorchParam(TorchParam&&) = default;
  TorchParam& operator=(TorchParam&&) = default;

  const std::string& name() const noexcept { return name_; }
  std::size_t numel() const noexcept { return numel_; }
  const std::vector<std::size_t>& shape() const noexcept { return shape_; }
  torch::Tensor& tensor() noexcept { return tensor_; }
  const torch::Tensor& tensor() const noexcept { return tensor_; }

  /// Before the engine binds: the tensor's own values (the engine adopts them). After: engine storage.
  float* data() noexcept { return bound_ ? data_ : static_cast<float*>(tensor_.data_ptr()); }
  float* grad() noexcept { return grad_; }

  /// Points the tensor at `data` (numel floats of engine storage) when it moved; `grad` is where
  /// the engine wants this parameter's gradient now.
  void bind(float* data, float* grad) {
    if (detached_) return;
    grad_ = grad;
    if (bound_ && data == data_) return;
    data_ = data;
    bound_ = true;
    torch::NoGradGuard no_grad;
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    if (data == nullptr) {  // stage 3 released the values: an empty tensor, as DeepSpeed's
      tensor_.set_data(torch::empty({0}, f32));
      point_storage_at(nullptr);  // and the views autograd saved read nothing
    } else {
      point_storage_at(data);  // the views autograd saved read the values from here on
      tensor_.set_data(torch::empty({0}, f32).set_(storage_, 0, sizes_));
    }
  }

  /// Stage 3: whether the values are gathered now (outside scopes the tensor is empty).
  bool has_values() const noexcept { return !bound_ || data_ != nullptr; }

  /// Whether the tensor still reads the engine's storage (not re-allocated by module->to(...),
  /// set_data or an assignment behind the engine's back).
  bool still_bound() const {
    if (!bound_) return true;
    if (tensor_.scalar_type() != torch::kFloat32) return false;
    if (data_ == nullptr) return tensor_.numel() == 0;
    return tensor_.data_ptr() == static_cast<void*>(data_) && tensor_.numel() == static_cast<std::int64_t>(numel_) &&
           tensor_.is_contiguous();
  }
  void require_bound() const {
    if (still_bound()) return;
    throw usage_error("torch parameter no longer points at the engine's storage: the module re-allocated it after "
                      "wrapping (module->to(...), set_data, or assigning a new tensor); convert the module before "
                      "building the engine",
                      name_,
                      std::string(c10::toString(tensor_.scalar_type())) + " tensor of " +
                          std::to_string(tensor_.numel()) + " elements");
  }

  /// Gives the tensor its own copy of the current values again and stops following the engine
  /// (its storage is about to go away). Stage 3: call it while the values are gathered.
  void unbind() {
    if (!bound_) return;
    if (data_ != nullptr && still_bound()) {
      torch::NoGradGuard no_grad;
      tensor_.set_data(tensor_.detach().clone());
    }
    point_storage_at(nullptr);  // views made while bound read nothing, not the engine's freed memory
    bound_ = false;
    detached_ = true;
    data_ = nullptr;
    grad_ = nullptr;
  }

 private:
  void point_storage_at(float* data) {
    storage_.set_data_ptr_noswap(at::DataPtr(data, at::Device(at::kCPU)));  // not owning: the engine's memory
    storage_.set_nbytes(data != nullptr ? numel_ * sizeof(float) : 0);
  }

  std::string name_;
  torch::Tensor tensor_;
  c10::Storage storage_;  // [numel] float over engine storage while bound (null when released)
  std::vector<std::int64_t> sizes_;
  std::vector<std::size_t> shape_;
  std::size_t numel_ = 0;
  float* data_ = nullptr;  // [numel] engine storage the tensor reads, once bound
  float* grad_ = nullptr;  // [numel] where the engine wants the gradient now
  bool bound_ = false;
  bool detached_ = false;  // unbind() ran: later binds are ignored
};

static_assert(Parameter<TorchParam>);

}  // namespace zerotk::interop
