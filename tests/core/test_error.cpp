#include <doctest/doctest.h>

#include <string>

#include "zerotk/core/error.hpp"

using namespace zerotk;

TEST_CASE("errors carry kind, rule, location and value in what()") {
  try {
    throw config_error("must be >= 0", "/fp16/loss_scale", "-1");
  } catch (const error& e) {
    CHECK(e.kind() == ErrorKind::config);
    CHECK(e.message() == "must be >= 0");
    CHECK(e.where() == "/fp16/loss_scale");
    CHECK(e.value() == "-1");
    CHECK(std::string(e.what()) == "zerotk config error at /fp16/loss_scale: must be >= 0 (got -1)");
  }
}

TEST_CASE("each error type is catchable as its own type and as zerotk::error") {
  CHECK_THROWS_AS(throw comm_error("timeout", "ranks 0,2"), comm_error);
  CHECK_THROWS_AS(throw io_error("short read", "ckpt/rank0.bin:4096"), error);
  CHECK_THROWS_AS(throw numerics_error("loss scale already at minimum"), std::runtime_error);
  usage_error u("step() before backward()");
  CHECK(std::string(u.what()) == "zerotk usage error: step() before backward()");
  CHECK(u.kind() == ErrorKind::usage);
  CHECK(to_text(3.5) == "3.5");
}

TEST_CASE("throw_error throws the typed error of a kind (a kind passed on from another rank)") {
  CHECK_THROWS_AS(throw_error(ErrorKind::config, "m"), config_error);
  CHECK_THROWS_AS(throw_error(ErrorKind::comm, "m"), comm_error);
  CHECK_THROWS_AS(throw_error(ErrorKind::io, "m"), io_error);
  CHECK_THROWS_AS(throw_error(ErrorKind::numerics, "m"), numerics_error);
  CHECK_THROWS_AS(throw_error(ErrorKind::usage, "m"), usage_error);
  try {
    throw_error(ErrorKind::io, "short read", "rank1.bin:64", "12 bytes");
  } catch (const error& e) {
    CHECK(e.kind() == ErrorKind::io);
    CHECK(std::string(e.what()) == "zerotk io error at rank1.bin:64: short read (got 12 bytes)");
  }
}
