#pragma once
/// \file zerotk/comm/any.hpp
/// AnyCommunicator: any zerotk::comm::Communicator behind one type, so the Engine's type depends only
/// on its policies and not on the back end. One virtual call per collective (collectives move buckets
/// of megabytes; the call is noise). It models Communicator itself.
///
///   zerotk::comm::AnyCommunicator any(my_mpi_comm);            // refers to it (caller keeps it alive)
///   zerotk::comm::AnyCommunicator own(std::move(sub_comm));    // owns it

#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "zerotk/comm/communicator.hpp"

namespace zerotk::comm {

class AnyCommunicator {
 public:
  /// Refers to `c`; the caller keeps it alive for the AnyCommunicator's lifetime.
  // The self-exclusion comes first so that checking Communicator<AnyCommunicator> (which asks
  // whether it is movable) never recurses into these constructors (EDG/nvcc would report it).
  template <class C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, AnyCommunicator> && Communicator<C>)
  explicit AnyCommunicator(C& c) : impl_(std::make_shared<Ref<C>>(c)) {}

  /// Takes ownership of `c`.
  template <class C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, AnyCommunicator> && !std::is_lvalue_reference_v<C> &&
             Communicator<C>)
  explicit AnyCommunicator(C&& c) : impl_(std::make_shared<Owned<C>>(std::move(c))) {}

  int rank() const { return impl_->rank(); }
  int size() const { return impl_->size(); }

  Work all_reduce(const void* s, void* r, std::size_t n, DType t, ReduceOp op) { return impl_->all_reduce(s, r, n, t, op); }
  Work reduce_scatter(const void* s, void* r, std::size_t n, DType t, ReduceOp op) {
    return impl_->reduce_scatter(s, r, n, t, op);
  }
  Work all_gather(const void* s, void* r, std::size_t n, DType t) { return impl_->all_gather(s, r, n, t); }
  Work all_gatherv(const void* s, std::size_t n, void* r, std::span<const std::size_t> counts, DType t) {
    return impl_->all_gatherv(s, n, r, counts, t);
  }
  Work broadcast(void* b, std::size_t n, DType t, int root) { return impl_->broadcast(b, n, t, root); }
  Work reduce(const void* s, void* r, std::size_t n, DType t, ReduceOp op, int root) {
    return impl_->reduce(s, r, n, t, op, root);
  }
  Work all_to_all(const void* s, void* r, std::size_t n, DType t) { return impl_->all_to_all(s, r, n, t); }
  Work all_to_all_v(const void* s, std::span<const std::size_t> sc, void* r, std::span<const std::size_t> rc, DType t) {
    return impl_->all_to_all_v(s, sc, r, rc, t);
  }
  Work send(const void* b, std::size_t n, DType t, int peer, int tag) { return impl_->send(b, n, t, peer, tag); }
  Work recv(void* b, std::size_t n, DType t, int peer, int tag) { return impl_->recv(b, n, t, peer, tag); }
  Work barrier() { return impl_->barrier(); }
  AnyCommunicator split(int color, int key) { return impl_->split(color, key); }
  const CommStats& stats() const { return impl_->stats(); }

 private:
  struct Iface {
    virtual ~Iface() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual Work all_reduce(const void*, void*, std::size_t, DType, ReduceOp) = 0;
    virtual Work reduce_scatter(const void*, void*, std::size_t, DType, ReduceOp) = 0;
    virtual Work all_gather(const void*, void*, std::size_t, DType) = 0;
    virtual Work all_gatherv(const void*, std::size_t, void*, std::span<const std::size_t>, DType) = 0;
    virtual Work broadcast(void*, std::size_t, DType, int) = 0;
    virtual Work reduce(const void*, void*, std::size_t, DType, ReduceOp, int) = 0;
    virtual Work all_to_all(const void*, void*, std::size_t, DType) = 0;
    virtual Work all_to_all_v(const void*, std::span<const std::size_t>, void*, std::span<const std::size_t>, DType) = 0;
    virtual Work send(const void*, std::size_t, DType, int, int) = 0;
    virtual Work recv(void*, std::size_t, DType, int, int) = 0;
    virtual Work barrier() = 0;
    virtual AnyCommunicator split(int, int) = 0;
    virtual const CommStats& stats() const = 0;
  };

  template <class C>
  struct Forward : Iface {
    virtual C& get() = 0;
    virtual const C& get() const = 0;
    int rank() const override { return static_cast<int>(get().rank()); }
    int size() const override { return static_cast<int>(get().size()); }
    Work all_reduce(const void* s, void* r, std::size_t n, DType t, ReduceOp op) override { return get().all_reduce(s, r, n, t, op); }
    Work reduce_scatter(const void* s, void* r, std::size_t n, DType t, ReduceOp op) override {
      return get().reduce_scatter(s, r, n, t, op);
    }
    Work all_gather(const void* s, void* r, std::size_t n, DType t) override { return get().all_gather(s, r, n, t); }
    Work all_gatherv(const void* s, std::size_t n, void* r, std::span<const std::size_t> c, DType t) override {
      return get().all_gatherv(s, n, r, c, t);
    }
    Work broadcast(void* b, std::size_t n, DType t, int root) override { return get().broadcast(b, n, t, root); }
    Work reduce(const void* s, void* r, std::size_t n, DType t, ReduceOp op, int root) override {
      return get().reduce(s, r, n, t, op, root);
    }
    Work all_to_all(const void* s, void* r, std::size_t n, DType t) override { return get().all_to_all(s, r, n, t); }
    Work all_to_all_v(const void* s, std::span<const std::size_t> sc, void* r, std::span<const std::size_t> rc,
                      DType t) override {
      return get().all_to_all_v(s, sc, r, rc, t);
    }
    Work send(const void* b, std::size_t n, DType t, int p, int tag) override { return get().send(b, n, t, p, tag); }
    Work recv(void* b, std::size_t n, DType t, int p, int tag) override { return get().recv(b, n, t, p, tag); }
    Work barrier() override { return get().barrier(); }
    AnyCommunicator split(int color, int key) override { return AnyCommunicator(get().split(color, key)); }
    const CommStats& stats() const override { return get().stats(); }
  };

  template <class C>
  struct Ref final : Forward<C> {
    explicit Ref(C& c) : c_(&c) {}
    C& get() override { return *c_; }
    const C& get() const override { return *c_; }
    C* c_;
  };

  template <class C>
  struct Owned final : Forward<C> {
    explicit Owned(C&& c) : c_(std::move(c)) {}
    C& get() override { return c_; }
    const C& get() const override { return c_; }
    C c_;
  };

  explicit AnyCommunicator(std::shared_ptr<Iface> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Iface> impl_;
};

static_assert(Communicator<AnyCommunicator>);

}  // namespace zerotk::comm
