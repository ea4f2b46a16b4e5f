#pragma once
/// \file zerotk/interop/torch/libtorch.hpp
/// The libtorch headers the adapter's files use, behind the one check that libtorch is there.
#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_TORCH
#error "zerotk/interop/torch.hpp needs libtorch: link the CMake target zerotk::torch (it defines ZEROTK_HAS_TORCH=1), or, in a vendored copy, define ZEROTK_HAS_TORCH=1 and put libtorch (Debian: libtorch-dev) on the include path"
#endif

#include <torch/torch.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
