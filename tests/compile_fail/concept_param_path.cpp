// A partitioner whose parameter path lacks commit_update()/abort_update() (how a step's output is
// made current or taken back) is refused where the stage selects the path, with ParamPath's words
// naming the member (zero/concepts.hpp). The control gives the same wrapper both.
#include "zerotk/engine.hpp"

template <class T, class Ops>
class WrappedParams : private zerotk::zero::BucketGather<T, Ops> {
  using Base = zerotk::zero::BucketGather<T, Ops>;

 public:
  static constexpr bool kResident = true;
  using value_type = T;
  using Options = typename Base::Options;
  using Base::Base;
  using Base::drain_quietly;
  using Base::optimizer_out;
  using Base::owned_values;
  using Base::params;
  using Base::pending;
  using Base::publish;
  using Base::read_owned;
  using Base::set_partition_source;
  using Base::synchronize;
  using Base::values;
  using Base::wait;
#ifdef ZEROTK_FAILTEST_CONTROL
  using Base::abort_update;
  using Base::commit_update;
#endif
};

struct WrappedStage1 : zerotk::Partitioner<zerotk::Stage<1>> {
  template <class T, class Ops>
  using params = WrappedParams<T, Ops>;
};

using E = zerotk::Engine<WrappedStage1, zerotk::Optimizer<zerotk::AdamW>>;
#include "engine_use.hpp"
