// A partitioner whose gradient path lacks owned() (what the norm and the optimizer read) is refused
// where the stage selects the path, with GradientPath's words naming the member (zero/concepts.hpp).
// The control gives the same wrapper its owned().
#include "zerotk/engine.hpp"

template <class T, class Ops>
class WrappedGrads : private zerotk::zero::PooledBuckets<T, Ops> {
  using Base = zerotk::zero::PooledBuckets<T, Ops>;

 public:
  using value_type = T;
  using Base::Base;
  using Base::bucket_grads;
  using Base::clear_accumulated;
  using Base::dense_bytes;
  using Base::drain_quietly;
  using Base::end_micro_step;
  using Base::error_feedback;
  using Base::gather_source;
  using Base::load_error_feedback;
  using Base::open;
  using Base::ready;
  using Base::reset;
  using Base::wire_bytes;
#ifdef ZEROTK_FAILTEST_CONTROL
  using Base::owned;
#endif
};

struct WrappedStage2 : zerotk::Partitioner<zerotk::Stage<2>> {
  template <class T, class Ops>
  using grads = WrappedGrads<T, Ops>;
};

using E = zerotk::Engine<WrappedStage2, zerotk::Optimizer<zerotk::AdamW>>;
#include "engine_use.hpp"
