// A Layer needs backward(dy): activation checkpointing recomputes forward and then runs backward.
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/param.hpp"
struct Dense {
  using input_type = float;
  using output_type = float;
  zerotk::Param<float> w{"w", {1}};
  template <class V>
  void parameters(V&& v) { v("w", w); }
  float forward(float x) { return x; }
#ifdef ZEROTK_FAILTEST_CONTROL
  float backward(float dy) { return dy; }
#endif
};
template <zerotk::Layer L>
void recompute(L&) {}
int main() {
  Dense d;
  recompute(d);
}
