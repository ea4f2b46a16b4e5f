// An Offload tag whose state store lacks sub_groups() is refused where the tag selects the store,
// with StateStore's words naming the member (offload/concepts.hpp). The control gives the same
// wrapper its sub_groups(). (Specialisations: its control is a test of its own.)
#include "zerotk/engine.hpp"

template <class Opt, class Ops>
class WrappedStore : private zerotk::offload::Resident<Opt, Ops> {
  using Base = zerotk::offload::Resident<Opt, Ops>;

 public:
  using typename Base::optimizer_type;
  using typename Base::space;
  static constexpr bool kStateInHostMemory = Base::kStateInHostMemory;
  static constexpr bool kCanDelayUpdate = false;
  using Base::Base;
  using Base::abort_step;
  using Base::commit_step;
  using Base::exp_avg;
  using Base::exp_avg_sq;
  using Base::load_optimizer_state;
  using Base::master;
  using Base::master_from;
  using Base::master_from_host;
  using Base::master_into;
  using Base::master_into_host;
  using Base::master_to_host;
  using Base::optimizer;
  using Base::optimizer_state;
  using Base::owned_numel;
  using Base::step;
#ifdef ZEROTK_FAILTEST_CONTROL
  using Base::sub_groups;
#endif
};

struct MyStoreTag {
  static constexpr std::string_view name = "MyStore";
};
template <>
struct zerotk::Offload<MyStoreTag> {
  using policy_kind = zerotk::policy::offload;
  using tag = MyStoreTag;
};
template <>
struct zerotk::offload::StoreOf<MyStoreTag> {
  template <class Opt, class Ops>
  using type = WrappedStore<Opt, Ops>;
};

using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<1>>, zerotk::Optimizer<zerotk::AdamW>,
                         zerotk::Offload<MyStoreTag>>;
#include "engine_use.hpp"
