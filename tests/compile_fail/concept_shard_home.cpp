// An OffloadParams tag whose shard home lacks gather_source() (where a bucket's all-gather reads
// this rank's block) is refused where the tag selects the home, with ShardHome's words naming the
// member (zero/concepts.hpp). The control gives the same wrapper its gather_source().
// (Specialisations: its control is a test of its own.)
#include "zerotk/engine.hpp"

template <class T, class Ops>
class WrappedHome : private zerotk::zero::ComputeShard<T, Ops> {
  using Base = zerotk::zero::ComputeShard<T, Ops>;

 public:
  using Options = typename Base::Options;
  using Base::Base;
  using Base::data;
#ifdef ZEROTK_FAILTEST_CONTROL
  using Base::gather_source;
#endif
};

struct MyHomeTag {
  static constexpr std::string_view name = "MyHome";
};
template <>
struct zerotk::OffloadParams<MyHomeTag> {
  using policy_kind = zerotk::policy::param_offload;
  using tag = MyHomeTag;
};
template <>
struct zerotk::offload::ShardHomeOf<MyHomeTag> {
  template <class T, class Ops>
  using type = WrappedHome<T, Ops>;
};

using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<3>>, zerotk::Optimizer<zerotk::AdamW>,
                         zerotk::OffloadParams<MyHomeTag>>;
#include "engine_use.hpp"
