// zerotk/config/reader.hpp in a build without nlohmann-json (its ZEROTK_HAS_* macro is 0): the first error must say what
// to define or link.
#include "zerotk/config/reader.hpp"
