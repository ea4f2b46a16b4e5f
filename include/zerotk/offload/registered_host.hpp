#pragma once
/// \file zerotk/offload/registered_host.hpp
/// RegisteredHost: page-locked host memory registered with the compute space for as long as it
/// lives (Ops::register_host: cudaHostRegister on Device<Cuda>, so the device's copies to and from
/// it are direct DMA; nothing on the host devices). Declare it after the buffer it registers, so
/// the registration is undone before the buffer is freed. Offload's stagings and host homes use it
/// (offload/sub_group_steps.hpp, offload/pinned_shard.hpp, offload/nvme_shard.hpp).

#include <cstddef>

namespace zerotk::offload {

template <class Ops>
class RegisteredHost {
 public:
  /// Registers [p, p + bytes) with `ops`'s device (nothing for zero bytes). Throws on refusal.
  RegisteredHost(Ops& ops, void* p, std::size_t bytes) : ops_(&ops), p_(bytes ? p : nullptr) {
    if (p_) ops_->register_host(p_, bytes);
  }
  RegisteredHost(const RegisteredHost&) = delete;
  RegisteredHost& operator=(const RegisteredHost&) = delete;
  ~RegisteredHost() {
    if (p_) ops_->unregister_host(p_);
  }

 private:
  Ops* ops_;
  void* p_;
};

}  // namespace zerotk::offload
