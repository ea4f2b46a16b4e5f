// A Device tag whose Ops lacks fence() (how the communicator is ordered after the compute stream)
// is refused where the tag selects the Ops, with EngineOps' words naming the member
// (device/concepts.hpp). The control gives the same wrapper its fence(). (Specialisations: its
// control is a test of its own.)
#include "zerotk/engine.hpp"

struct MyDevice {
  static constexpr std::string_view name = "MyDevice";
};
template <>
struct zerotk::Device<MyDevice> {
  using policy_kind = zerotk::policy::device;
  using tag = MyDevice;
  static constexpr bool is_cuda = false;
};
template <>
class zerotk::device::Ops<MyDevice> : private zerotk::device::Ops<zerotk::Host> {
  using Base = zerotk::device::Ops<zerotk::Host>;

 public:
  using Base::Space;
  template <class T>
  using Buffer = Base::Buffer<T>;
  template <class C>
  static Ops create(C&, void*) {
    return {};
  }
  using Base::accumulate;
  using Base::add_squares;
  using Base::all_reduce;
  using Base::allocate;
  using Base::cast;
  using Base::copy;
  using Base::copy_from_host;
  using Base::copy_to_host;
  using Base::divide;
  using Base::register_host;
  using Base::square_bound;
  using Base::step;
  using Base::unregister_host;
  using Base::zero;
#ifdef ZEROTK_FAILTEST_CONTROL
  using Base::fence;
#endif
};

using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
                         zerotk::Device<MyDevice>>;
#include "engine_use.hpp"
