// zerotk/config.hpp without ZEROTK_HAS_JSON (a vendored copy that forgot the macro): the options
// still compile; the first call of a JSON entry point says what to define or link, not
// "'read_text_file' is not a member of 'zerotk::config'".
#include "zerotk/config.hpp"

inline void read_config() {
  zerotk::config::Config c;  // needs no JSON
  (void)c;
#ifndef ZEROTK_FAILTEST_CONTROL
  auto text = zerotk::config::read_text_file("ds_config.json");
  (void)text;
#endif
}
