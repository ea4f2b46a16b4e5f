// examples/02_gpt/train_compressed.cpp: train<E> for the engines that compress their exchanges (--optimizer onebitadam, zerooneadam, onebitlamb; --compress) (engines.hpp).
#include "train.hpp"

namespace gpt_demo {

template void train<OneBit<zerotk::fp32>>(const TrainContext&, MpiWorld*, Summary&);
template void train<OneBit<zerotk::bf16>>(const TrainContext&, MpiWorld*, Summary&);
template void train<ZeroOne>(const TrainContext&, MpiWorld*, Summary&);
template void train<OneBitLambE>(const TrainContext&, MpiWorld*, Summary&);
template void train<Compressed<zerotk::TopK>>(const TrainContext&, MpiWorld*, Summary&);
template void train<Compressed<zerotk::TwoBit>>(const TrainContext&, MpiWorld*, Summary&);
template void train<Compressed<zerotk::Sign>>(const TrainContext&, MpiWorld*, Summary&);

}  // namespace gpt_demo
