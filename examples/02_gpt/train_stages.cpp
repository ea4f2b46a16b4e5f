// examples/02_gpt/train_stages.cpp: train<E> for the engines without offload or compression, every ZeRO stage and precision (engines.hpp).
#include "train.hpp"

namespace gpt_demo {

template void train<E<0, zerotk::fp32>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<1, zerotk::fp32>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<2, zerotk::fp32>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::fp32>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<0, zerotk::bf16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<1, zerotk::bf16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<2, zerotk::bf16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<0, zerotk::fp16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<1, zerotk::fp16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<2, zerotk::fp16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::fp16>>(const TrainContext&, MpiWorld*, Summary&);

}  // namespace gpt_demo
