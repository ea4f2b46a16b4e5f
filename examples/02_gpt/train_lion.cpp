// examples/02_gpt/train_lion.cpp: train<E> for the engines that step with Lion (--optimizer lion) (engines.hpp).
#include "train.hpp"

namespace gpt_demo {

template void train<LionE<1>>(const TrainContext&, MpiWorld*, Summary&);
template void train<LionE<2>>(const TrainContext&, MpiWorld*, Summary&);
template void train<LionE<3>>(const TrainContext&, MpiWorld*, Summary&);
template void train<LionE<3, OptCpu>>(const TrainContext&, MpiWorld*, Summary&);

}  // namespace gpt_demo
