// bench/compile/umbrella_only.cpp: what `#include <zerotk/zerotk.hpp>` costs a TU that instantiates
// no engine.
#include <zerotk/zerotk.hpp>

int main() { return zerotk::kVersion > 0 ? 0 : 1; }
