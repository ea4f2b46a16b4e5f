// Crash consistency: a child process trains and saves in a loop and is SIGKILLed at a random instant
// (a seeded random delay in microseconds: fault injection, not timing). After every kill, `latest`
// names a complete checkpoint that verifies and loads, and every tag directory a reader can see is
// complete: a save in progress is only ever visible as a temporary (.tmp.<tag>).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_crash {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

namespace {

using E1 = Engine<Partitioner<Stage<1>>, Optimizer<AdamW>, Precision<fp32>>;

/// The child: trains one step and saves as `<prefix><step>`, forever. Writes one byte to `ready_fd`
/// after its first commit.
[[noreturn]] void save_forever(const fs::path& dir, const std::string& prefix, int ready_fd) {
  int rc = 0;
  try {
    RunConfig cfg;
    cfg.world = 1;
    comm::run_threads(1, [&](auto& comm) {
      Mlp<float> model;
      E1 engine(comm, model, engine_options(cfg));
      model.init(42);
      engine.initialize_master();
      for (int s = 0;; ++s) {
        train_steps(engine, model, 0, cfg, s, s + 1, nullptr);
        checkpoint::save(engine, comm, dir, {.tag = prefix + std::to_string(s + 1)});
        const char c = 1;
        if (s == 0 && ::write(ready_fd, &c, 1) != 1) throw std::runtime_error("pipe");
      }
    });
  } catch (...) {
    rc = 1;
  }
  ::_exit(rc);  // never back into doctest
}

/// Starts a saving child, waits for its first commit, kills it after `delay_us`. True if it was killed
/// by the signal (not dead of an error of its own).
bool run_and_kill(const fs::path& dir, const std::string& prefix, long delay_us) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    save_forever(dir, prefix, fds[1]);
  }
  ::close(fds[1]);
  char c = 0;
  const bool ready = ::read(fds[0], &c, 1) == 1;
  ::close(fds[0]);
  if (ready) {
    const timespec ts{delay_us / 1000000, (delay_us % 1000000) * 1000};
    ::nanosleep(&ts, nullptr);
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return ready && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

/// Loads `dir` (latest) into a fresh single-rank engine; returns its global step count.
std::int64_t load_steps(const fs::path& dir) {
  std::int64_t steps = -1;
  comm::run_threads(1, [&](auto& comm) {
    RunConfig cfg;
    cfg.world = 1;
    Mlp<float> model;
    E1 engine(comm, model, engine_options(cfg));
    checkpoint::load(engine, comm, dir);
    steps = engine.global_steps();
  });
  return steps;
}

}  // namespace

TEST_CASE("SIGKILL at a random instant during repeated saves: latest always names a complete checkpoint") {
  ScratchDir d("crash");
  std::mt19937 rng(20261122);
  std::uniform_int_distribution<long> delay_us(0, 30000);
  const auto t0 = std::chrono::steady_clock::now();
  int trials = 0, interrupted = 0;
  std::set<std::string> latest_tags;
  while (trials < 100 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
    // Even trials save new tags (a kill can land between any two steps of a first commit); odd
    // trials save step1, step2, ... again (the atomic replacement of an existing tag).
    const std::string prefix = trials % 2 == 0 ? "t" + std::to_string(trials) + "_step" : "step";
    REQUIRE_MESSAGE(run_and_kill(d.path(), prefix, delay_us(rng)), "the saving child died of its own error, not the kill");
    ++trials;
    const std::string tag = checkpoint::read_latest(d.path());
    bool temp_left = false;
    for (const auto& e : fs::directory_iterator(d.path())) {
      const std::string name = e.path().filename().string();
      if (name.starts_with(".tmp.")) temp_left = true;
      if (name.starts_with(".") || !e.is_directory()) continue;
      CHECK_NOTHROW_MESSAGE(checkpoint::verify(d.path(), name), "trial " << trials << ": visible tag " << name);
    }
    interrupted += temp_left ? 1 : 0;
    const checkpoint::Manifest m = checkpoint::verify(d.path());
    CHECK(m.tag == tag);
    CHECK(tag.ends_with("step" + std::to_string(m.global_steps)));
    CHECK(load_steps(d.path()) == m.global_steps);
    latest_tags.insert(tag);
    for (const auto& e : fs::directory_iterator(d.path())) {  // keep what later trials verify small
      const std::string name = e.path().filename().string();
      if (name.starts_with("t") && name != tag) fs::remove_all(e.path());
    }
  }
  MESSAGE(trials << " kills; " << interrupted << " left a save's temporary directory behind (killed mid-save); "
                 << latest_tags.size() << " distinct tags in latest");
  CHECK(trials > 0);
}

}  // namespace test_crash
