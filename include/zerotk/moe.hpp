#pragma once
/// \file zerotk/moe.hpp
/// Mixture of experts' building blocks over the user's buffers: the top-k router, the balance terms
/// and the token dispatcher (docs/moe.md).
#include "zerotk/moe/balance.hpp"
#include "zerotk/moe/dispatcher.hpp"
#include "zerotk/moe/router.hpp"
