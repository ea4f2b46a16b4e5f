// examples/02_gpt/train_offload.cpp: train<E> for the offload engines (--offload-optimizer, --offload-param) (engines.hpp).
#include "train.hpp"

namespace gpt_demo {

template void train<E<1, zerotk::bf16, OptCpu>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<2, zerotk::bf16, OptCpu>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, OptCpu>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, ParamCpu>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, OptCpu, ParamCpu>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::fp32, OptCpu, ParamCpu>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, OptNvme>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, OptNvme, ParamCpu>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, OptNvme, ParamNvme>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, OptCpu, ParamNvme>>(const TrainContext&, MpiWorld*, Summary&);
template void train<E<3, zerotk::bf16, ParamNvme>>(const TrainContext&, MpiWorld*, Summary&);

}  // namespace gpt_demo
