// A checkpoint that cannot be loaded is an error naming the file (or manifest key) and both values,
// on every rank, and leaves every engine as it was; save and load only at an optimizer boundary;
// ranks that disagree on the tag; a failure on one rank reaches all of them.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "checkpoint_fixture.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_errors {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

namespace {

using E2 = Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp16>>;

RunConfig config(int world) {
  RunConfig cfg;
  cfg.world = world;
  cfg.gas = 1;
  return cfg;
}

/// A checkpoint of Mlp<half> after two steps, tag global_step2, saved by engine type E on `world` ranks.
template <class E = E2>
void save_reference(const fs::path& dir, int world = 2, checkpoint::ModelStructure structure = {}) {
  const RunConfig cfg = config(world);
  comm::run_threads(world, [&](auto& comm) {
    Mlp<half> model;
    E engine(comm, model, engine_options(cfg));
    model.init(42);
    engine.initialize_master();
    engine.set_scheduler(warmup_schedule());
    train_steps(engine, model, comm.rank(), cfg, 0, 2, nullptr);
    checkpoint::save(engine, comm, dir, {.client_state = bytes_of("client"), .model_structure = structure});
  });
}

struct FailedLoad {
  std::vector<std::string> what;  // [rank] the error's text ("no error" if load succeeded)
  std::vector<ErrorKind> kind;
  bool unchanged = true;  // every rank's state and parameters bitwise as before the load
};

/// Loads `dir` into engines (E2, Mlp<half>) that have trained one step from other values.
FailedLoad try_load(const fs::path& dir, int world = 2, checkpoint::LoadOptions opt = {}, bool scheduler = true) {
  FailedLoad r;
  r.what.assign(static_cast<std::size_t>(world), "");
  r.kind.assign(static_cast<std::size_t>(world), ErrorKind::config);
  std::mutex mu;
  const RunConfig cfg = config(world);
  comm::run_threads(world, [&](auto& comm) {
    Mlp<half> model;
    E2 engine(comm, model, engine_options(cfg));
    model.init(7);
    engine.initialize_master();
    if (scheduler) engine.set_scheduler(warmup_schedule());
    train_steps(engine, model, comm.rank(), cfg, 0, 1, nullptr);
    const EngineState before = engine.state();
    const std::vector<float> params = model.values();
    std::string what = "no error";
    ErrorKind kind = ErrorKind::config;
    try {
      checkpoint::load(engine, comm, dir, opt);
    } catch (const zerotk::error& e) {
      what = e.what();
      kind = e.kind();
    }
    engine.synchronize();
    const bool same = same_state(engine.state(), before) && same_bits(model.values(), params);
    std::lock_guard lock(mu);
    r.what[static_cast<std::size_t>(comm.rank())] = what;
    r.kind[static_cast<std::size_t>(comm.rank())] = kind;
    r.unchanged = r.unchanged && same;
  });
  return r;
}

void flip_byte(const fs::path& p, std::size_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x04));
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

/// A two-layer model of other sizes than Mlp.
struct Small {
  std::vector<Dense<half>> layers;
  Small() {
    layers.emplace_back("fc0", 4, 3, true);
    layers.emplace_back("fc1", 3, 2, false);
  }
  template <class V>
  void parameters(V&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
};

}  // namespace

TEST_CASE("a corrupt, truncated or missing file: an io_error naming it; the other rank names the failing rank") {
  ScratchDir d("corrupt");
  save_reference(d.path());
  const fs::path t = d / "global_step2";
  REQUIRE(fs::exists(t / "rank1.bin"));
  const std::string p0 = (t / "rank0.bin").string(), p1 = (t / "rank1.bin").string();

  SUBCASE("a flipped byte in rank 1's file") {
    flip_byte(t / "rank1.bin", fs::file_size(t / "rank1.bin") / 2);
    const FailedLoad r = try_load(d.path());
    CHECK(r.what[1].find(p1 + ": checksum differs from the manifest's") != std::string::npos);
    CHECK(r.what[1].find("computed ") != std::string::npos);
    CHECK(r.what[1].find(", manifest says ") != std::string::npos);
    CHECK(r.kind[1] == ErrorKind::io);
    CHECK(r.what[0].find("failed on rank 1: " + p1 + ": checksum differs from the manifest's") != std::string::npos);
    CHECK(r.unchanged);
  }
  SUBCASE("rank 0's file truncated") {
    fs::resize_file(t / "rank0.bin", fs::file_size(t / "rank0.bin") - 5);
    const FailedLoad r = try_load(d.path());
    CHECK(r.what[0].find(p0 + ": truncated: shorter than the manifest records") != std::string::npos);
    CHECK(r.what[1].find("failed on rank 0: " + p0 + ": truncated") != std::string::npos);
    CHECK(r.unchanged);
  }
  SUBCASE("rank 1's file missing") {
    fs::remove(t / "rank1.bin");
    const FailedLoad r = try_load(d.path());
    CHECK(r.what[1].find(p1 + ": cannot open (got No such file or directory") != std::string::npos);
    CHECK(r.unchanged);
  }
  SUBCASE("a flipped digit in the manifest (still parseable)") {
    const std::string m = io::read_text_file(t / "manifest.txt");
    flip_byte(t / "manifest.txt", m.find("global_steps 2") + 13);  // 2 -> 6
    const FailedLoad r = try_load(d.path());
    for (const std::string& w : r.what) {
      CHECK(w.find((t / "manifest.txt").string() + ": checksum: manifest checksum mismatch") != std::string::npos);
    }
    CHECK(r.unchanged);
  }
  SUBCASE("a flipped byte in the client state") {
    flip_byte(t / "client_state.bin", 30);
    const FailedLoad r = try_load(d.path());
    for (const std::string& w : r.what) {
      CHECK(w.find((t / "client_state.bin").string() + ": checksum differs") != std::string::npos);
    }
    CHECK(r.unchanged);
  }
}

TEST_CASE("a checkpoint of another model, optimizer, precision or scheduler setting: a usage_error naming the key and both values") {
  ScratchDir d("mismatch");
  SUBCASE("another model") {
    const RunConfig cfg = config(2);
    comm::run_threads(2, [&](auto& comm) {
      Small model;
      E2 engine(comm, model, engine_options(cfg));
      engine.set_scheduler(warmup_schedule());
      checkpoint::save(engine, comm, d.path());
    });
    const FailedLoad r = try_load(d.path());
    for (std::size_t i = 0; i < r.what.size(); ++i) {
      // The first parameter that differs, by name, both sides (issue 57 item 12: it said parameter_count).
      INFO(r.what[i]);
      CHECK(r.what[i].find("manifest.txt: param0: the checkpoint is for another model (parameters differ) (got saved "
                           "\"fc0.weight\" fp16 [") != std::string::npos);
      CHECK(r.what[i].find("this engine \"fc0.weight\" fp16 [") != std::string::npos);
      CHECK(r.kind[i] == ErrorKind::usage);
    }
    CHECK(r.unchanged);
  }
  SUBCASE("another declared structure: the same shapes, another head count (issue 57 item 12)") {
    save_reference(d.path(), 2, {{"heads", "4"}, {"head_dim", "16"}});
    std::string manifest;
    {
      std::ifstream in(d / "global_step2" / "manifest.txt", std::ios::binary);
      manifest.assign(std::istreambuf_iterator<char>(in), {});
    }
    CHECK(manifest.find("\nmodel.head_dim 16\nmodel.heads 4\n") != std::string::npos);
    FailedLoad r = try_load(d.path(), 2, {.model_structure = {{"heads", "8"}, {"head_dim", "16"}}});
    for (std::size_t i = 0; i < r.what.size(); ++i) {
      INFO(r.what[i]);
      CHECK(r.what[i].find("manifest.txt: model.heads: the checkpoint is for another model (its declared structure "
                           "differs) (got saved 4, this model 8)") != std::string::npos);
      CHECK(r.kind[i] == ErrorKind::usage);
    }
    CHECK(r.unchanged);
    r = try_load(d.path(), 2, {.model_structure = {{"heads", "4"}}});  // a key this model does not declare
    for (const std::string& w : r.what) CHECK(w.find("model.head_dim: the checkpoint's model declares \"head_dim\"") != std::string::npos);
    r = try_load(d.path(), 2, {.model_structure = {{"heads", "4"}, {"head_dim", "16"}}});
    for (const std::string& w : r.what) CHECK(w == "no error");
    r = try_load(d.path(), 2);  // a loader that declares nothing is not held to it
    for (const std::string& w : r.what) CHECK(w == "no error");
  }
  SUBCASE("another optimizer") {
    save_reference<Engine<Partitioner<Stage<2>>, Optimizer<Adam>, Precision<fp16>>>(d.path());
    const FailedLoad r = try_load(d.path());
    for (const std::string& w : r.what) {
      CHECK(w.find("manifest.txt: optimizer: the checkpoint is for another optimizer (got saved Adam, this engine AdamW)") !=
            std::string::npos);
    }
    CHECK(r.unchanged);
  }
  SUBCASE("another precision") {
    const RunConfig cfg = config(2);
    comm::run_threads(2, [&](auto& comm) {
      Mlp<float> model;
      Engine<Partitioner<Stage<2>>, Optimizer<AdamW>, Precision<fp32>> engine(comm, model, engine_options(cfg));
      engine.set_scheduler(warmup_schedule());
      checkpoint::save(engine, comm, d.path());
    });
    const FailedLoad r = try_load(d.path());
    for (const std::string& w : r.what) {
      CHECK(w.find("manifest.txt: precision: the checkpoint is for another precision (got saved fp32, this engine fp16)") !=
            std::string::npos);
    }
    CHECK(r.unchanged);
  }
  SUBCASE("an engine without the scheduler the checkpoint has") {
    save_reference(d.path());
    const FailedLoad r = try_load(d.path(), 2, {}, /*scheduler=*/false);
    CHECK(r.what[0].find("manifest.txt: scheduler: ") != std::string::npos);
    CHECK(r.what[0].find("saved a scheduler, this engine none") != std::string::npos);
    CHECK(r.unchanged);
  }
}

TEST_CASE("no latest file, or latest naming a missing tag: an io_error naming the path") {
  ScratchDir d("latest");
  SUBCASE("empty directory") {
    const FailedLoad r = try_load(d.path());
    for (const std::string& w : r.what) {
      CHECK(w.find((d / "latest").string() + ": no \"latest\" file") != std::string::npos);
    }
    CHECK(r.unchanged);
  }
  SUBCASE("latest names a tag that is not there") {
    save_reference(d.path());
    write_text(d / "latest", "global_step99");
    const FailedLoad r = try_load(d.path());
    for (const std::string& w : r.what) {
      CHECK(w.find((d / "global_step99").string() + ": checkpoint directory is missing") != std::string::npos);
    }
    CHECK(r.unchanged);
  }
  SUBCASE("latest holds something that is not a tag") {
    save_reference(d.path());
    write_text(d / "latest", "../global_step2");
    const FailedLoad r = try_load(d.path());
    for (std::size_t i = 0; i < r.what.size(); ++i) {
      CHECK(r.what[i].find((d / "latest").string() + ": invalid checkpoint tag: starts with '.'") != std::string::npos);
      CHECK(r.kind[i] == ErrorKind::io);
    }
    CHECK(r.unchanged);
  }
  SUBCASE("a named tag that is not there; the one latest names still loads") {
    save_reference(d.path());
    checkpoint::LoadOptions o;
    o.tag = "nope";
    CHECK(try_load(d.path(), 2, o).what[0].find((d / "nope").string() + ": checkpoint directory is missing") !=
          std::string::npos);
    const FailedLoad ok = try_load(d.path());
    CHECK(ok.what[0] == "no error");
    CHECK(ok.what[1] == "no error");
    CHECK(!ok.unchanged);  // this one did load
  }
}

namespace {
/// Rewrites the value of manifest line `key` to `value` and recomputes the checksum line, as someone
/// editing a checkpoint by hand would.
void edit_manifest(const fs::path& manifest, const std::string& key, const std::string& value) {
  const std::string text = io::read_text_file(manifest);
  std::string body = text.substr(0, text.rfind("checksum "));
  const std::size_t at = body.find("\n" + key + " ");
  REQUIRE(at != std::string::npos);
  const std::size_t start = at + 1 + key.size() + 1, end = body.find('\n', start);
  body.replace(start, end - start, value);
  io::write_file_durable(manifest, body + "checksum " + checkpoint::to_hex(checkpoint::checksum(body)) + "\n");
}
}  // namespace

// Issue 49, item 2: values out of range with a recomputed checksum passed verify and (the counters)
// load; a resumed run printed step=-4. verify() and load() now refuse the same values, naming the
// manifest key and the value.
TEST_CASE("a manifest edited out of range (checksum recomputed): verify and load both refuse it, naming file and key") {
  ScratchDir d("manifest_range");
  save_reference(d.path());
  const fs::path manifest = d / "global_step2" / "manifest.txt";
  const std::string original = io::read_text_file(manifest);
  SUBCASE("an edit within range still verifies: the edits below fail on their values, not their form") {
    edit_manifest(manifest, "global_steps", "7");
    CHECK(checkpoint::verify(d.path()).global_steps == 7);
  }
  struct Edit {
    const char* key;
    const char* value;
    const char* rule;
  };
  for (const Edit& e : {Edit{"stage", "9", "ZeRO stage must be 0, 1, 2 or 3"}, Edit{"stage", "-1", "ZeRO stage must be 0, 1, 2 or 3"},
                        Edit{"precision", "fp8", "must be fp32, fp16 or bf16"}, Edit{"global_steps", "-5", "must be >= 0"},
                        Edit{"micro_steps", "-1", "must be >= 0"}, Edit{"skipped_steps", "-1", "must be in [0, global_steps]"},
                        Edit{"skipped_steps", "3", "must be in [0, global_steps]"},
                        Edit{"group0.optimizer_step", "-2", "must be >= 0"},
                        Edit{"scaler.scale", "nan", "must be positive and finite"},
                        Edit{"scaler.scale", "inf", "must be positive and finite"},
                        Edit{"scaler.scale", "0", "must be positive and finite"}, Edit{"scaler.iter", "-100", "must be >= 0"},
                        Edit{"scaler.last_overflow_iter", "-2", "must be in [-1, iter)"}, Edit{"scaler.hyst", "-1", "must be >= 0"},
                        Edit{"scheduler.last_batch_iteration", "-7", "the iteration must be >= -1"}}) {
    const std::string edit = std::string(e.key) + " " + e.value;
    CAPTURE(edit);
    io::write_file_durable(manifest, original);
    edit_manifest(manifest, e.key, e.value);
    const std::string where = manifest.string() + ": " + e.key;
    try {
      (void)checkpoint::verify(d.path());
      FAIL("verify accepted an edited manifest");
    } catch (const io_error& x) {
      CHECK(x.where() == where);
      CHECK(x.message().find(e.rule) != std::string::npos);
      CHECK(x.value().find(e.value) != std::string::npos);
    }
    const FailedLoad r = try_load(d.path());
    for (std::size_t i = 0; i < r.what.size(); ++i) {
      CAPTURE(r.what[i]);
      CHECK(r.what[i].find(where + ": " + e.rule) != std::string::npos);
      CHECK(r.kind[i] == ErrorKind::io);
    }
    CHECK(r.unchanged);
  }
}

// Issue 49, item 3: `latest` as a FIFO hung the loader and zerotk-ckpt, a link to /dev/zero read as
// "empty", escape sequences in it reached the terminal raw, and a tag naming a path outside the
// checkpoint (through verify) was read.
TEST_CASE("latest that is not a regular file, holds escapes, or names a path: refused without blocking, escaped") {
  ScratchDir d("latest_hostile");
  save_reference(d.path());
  fs::remove(d / "latest");
  SUBCASE("a FIFO: refused at once, naming the file and what it is") {
    REQUIRE(::mkfifo((d / "latest").c_str(), 0644) == 0);  // no writer: an open without O_NONBLOCK would wait forever
    const FailedLoad r = try_load(d.path());
    for (std::size_t i = 0; i < r.what.size(); ++i) {
      CHECK(r.what[i].find((d / "latest").string() + ": cannot read the \"latest\" file: not a regular file but a FIFO") !=
            std::string::npos);
      CHECK(r.kind[i] == ErrorKind::io);
    }
    CHECK(r.unchanged);
    CHECK_THROWS_WITH_AS(checkpoint::verify(d.path()), doctest::Contains("not a regular file but a FIFO"), io_error);
  }
  SUBCASE("a link to /dev/zero: a character device, not an empty file") {
    fs::create_symlink("/dev/zero", d / "latest");
    const FailedLoad r = try_load(d.path());
    CHECK(r.what[0].find("not a regular file but a character device") != std::string::npos);
    CHECK(r.what[0].find("empty") == std::string::npos);
    CHECK(r.unchanged);
  }
  SUBCASE("a link to a regular file holding a tag is followed") {
    write_text(d / "tag.txt", "global_step2\n");
    fs::create_symlink(d / "tag.txt", d / "latest");
    CHECK(checkpoint::read_latest(d.path()) == "global_step2");
  }
  SUBCASE("larger than kMaxLatestBytes: refused, naming the limit") {
    write_text(d / "latest", "global_step2" + std::string(checkpoint::kMaxLatestBytes, ' '));
    CHECK_THROWS_WITH_AS(checkpoint::read_latest(d.path()),
                         doctest::Contains("cannot read the \"latest\" file: larger than the limit of 4096 bytes"), io_error);
  }
  SUBCASE("escape sequences are shown escaped") {
    write_text(d / "latest", "global\x1b[2Jstep2");
    try {
      (void)checkpoint::read_latest(d.path());
      FAIL("a tag with an escape sequence must be refused");
    } catch (const io_error& e) {
      CHECK(e.value() == "\"global\\u001b[2Jstep2\"");
      CHECK(std::string(e.what()).find('\x1b') == std::string::npos);
    }
  }
  SUBCASE("verify, read_manifest and load take tag names only") {
    io::create_directories(d / "other" / "global_step2");
    for (const std::string bad : {"../other/global_step2", "", ".", "..", "a/b"}) {
      CAPTURE(bad);
      CHECK_THROWS_WITH_AS(checkpoint::verify(d.path(), bad), doctest::Contains("invalid checkpoint tag"), usage_error);
      CHECK_THROWS_AS(checkpoint::read_manifest(d.path(), bad), usage_error);
      checkpoint::LoadOptions o;
      o.tag = bad;
      const FailedLoad r = try_load(d.path(), 2, o);
      CHECK(r.what[0].find("invalid checkpoint tag") != std::string::npos);
      CHECK(r.unchanged);
    }
    CHECK(checkpoint::verify(d.path(), "global_step2").global_steps == 2);
  }
}

namespace {
/// One micro-step of step `s` (forward, backward, step) without reaching the boundary when GAS > 1.
template <class E, class Model>
void micro_step(E& engine, Model& model, int rank, int s) {
  const Batch b = make_batch(s, 0, rank);
  std::vector<float> x = b.x, dy;
  for (auto& l : model.layers) {
    auto scope = engine.forward(l);
    x = l.forward(x);
  }
  const float loss = mse(x, b.t, static_cast<float>(engine.loss_scale()), dy);
  for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
    auto scope = engine.backward(*it);
    dy = it->backward(dy);
  }
  (void)engine.step(loss);
}
}  // namespace

TEST_CASE("save and load between micro-steps are usage_errors; nothing is written") {
  ScratchDir d("boundary");
  RunConfig cfg = config(2);
  cfg.gas = 2;
  comm::run_threads(2, [&](auto& comm) {
    Mlp<half> model;
    E2 engine(comm, model, engine_options(cfg));
    model.init(42);
    engine.initialize_master();
    train_steps(engine, model, comm.rank(), cfg, 0, 1, nullptr);
    micro_step(engine, model, comm.rank(), 1);  // 1 of 2 micro-steps
    CHECK_THROWS_WITH_AS(checkpoint::save(engine, comm, d.path()), doctest::Contains("only at an optimizer boundary"),
                         usage_error);
    CHECK_THROWS_WITH_AS(checkpoint::load(engine, comm, d.path()), doctest::Contains("only at an optimizer boundary"),
                         usage_error);
  });
  CHECK(fs::is_empty(d.path()));
}

TEST_CASE("one rank between micro-steps (stage 0 reducing at the boundary): every rank throws, none hangs") {
  ScratchDir d("one_rank");
  RunConfig cfg = config(2);
  cfg.gas = 2;
  std::vector<std::string> what(2);
  std::mutex mu;
  comm::run_threads(2, [&](auto& comm) {
    Mlp<half> model;
    Engine<Partitioner<Stage<0>, when::at_boundary>, Optimizer<AdamW>, Precision<fp16>> engine(comm, model,
                                                                                                 engine_options(cfg));
    model.init(42);
    engine.initialize_master();
    if (comm.rank() == 1) micro_step(engine, model, 1, 0);  // no collective before the boundary
    std::string w = "no error";
    try {
      checkpoint::save(engine, comm, d.path());
    } catch (const zerotk::error& e) {
      w = e.what();
    }
    std::lock_guard lock(mu);
    what[static_cast<std::size_t>(comm.rank())] = w;
  });
  CHECK(what[1].find("only at an optimizer boundary") != std::string::npos);
  CHECK(what[0].find("checkpoint save failed on rank 1") != std::string::npos);
  CHECK(fs::is_empty(d.path()));
}

TEST_CASE("rank 0 cannot create the directory: every rank throws, the others naming rank 0") {
  ScratchDir d("rank0_fails");
  write_text(d / "file", "a file where the checkpoint directory should be");
  std::vector<std::string> what(2);
  std::mutex mu;
  const RunConfig cfg = config(2);
  comm::run_threads(2, [&](auto& comm) {
    Mlp<half> model;
    E2 engine(comm, model, engine_options(cfg));
    std::string w = "no error";
    try {
      checkpoint::save(engine, comm, d / "file" / "ckpt");
    } catch (const zerotk::error& e) {
      w = e.what();
    }
    std::lock_guard lock(mu);
    what[static_cast<std::size_t>(comm.rank())] = w;
  });
  CHECK(what[0].find("cannot create directory") != std::string::npos);
  CHECK(what[1].find("failed on rank 0: ") != std::string::npos);
  CHECK(what[1].find("cannot create directory") != std::string::npos);  // rank 0's reason, on rank 1 too
}

// Issue 49, item 1: on thread ranks the error that ends the job is whichever rank's arrives first,
// which was often a bystander's "failed on rank 1" without the reason. Every rank's error now carries
// the failing rank's what(), so the job's error says why whatever the order.
TEST_CASE("agreed(): every rank's error, so the one that ends a threads job, carries the failing rank's reason") {
  for (int failing : {0, 1, 2}) {
    CAPTURE(failing);
    std::vector<std::string> what(3);
    std::mutex mu;
    std::string job = "no error";
    try {
      comm::run_threads(3, [&](comm::ThreadsCommunicator& c) {
        std::string w = "no error";
        try {
          checkpoint::agreed(c, "load", [&] {
            if (c.rank() == failing) throw io_error("checksum differs", "rank" + std::to_string(failing) + ".bin");
          });
        } catch (const zerotk::error& e) {
          w = e.what();
          std::lock_guard lock(mu);
          what[static_cast<std::size_t>(c.rank())] = w;
          throw;
        }
      });
    } catch (const zerotk::error& e) {
      job = e.what();
    }
    const std::string reason = "rank" + std::to_string(failing) + ".bin: checksum differs";
    CHECK(job.find(reason) != std::string::npos);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      const std::string& w = what[static_cast<std::size_t>(r)];
      CHECK(w.find(reason) != std::string::npos);
      if (r != failing) CHECK(w.find("load failed on rank " + std::to_string(failing) + ": ") != std::string::npos);
    }
  }
  // Nothing thrown anywhere: nothing thrown, no broadcast (the all-reduce alone agrees).
  comm::run_threads(3, [](comm::ThreadsCommunicator& c) { checkpoint::agreed(c, "load", [] {}); });
}

TEST_CASE("tags that differ between ranks: Fail throws everywhere, Warn and Ignore use rank 0's") {
  ScratchDir d("tags");
  const RunConfig cfg = config(2);
  std::vector<std::string> warnings;
  std::mutex mu;
  auto save_with = [&](checkpoint::TagValidation mode, const fs::path& dir) {
    comm::run_threads(2, [&](auto& comm) {
      Mlp<half> model;
      E2 engine(comm, model, engine_options(cfg));
      checkpoint::SaveOptions o;
      o.tag.emplace(comm.rank() == 0 ? "zero" : "one");
      o.tag_validation = mode;
      o.on_warning = [&](std::string_view w) {
        std::lock_guard lock(mu);
        warnings.emplace_back(w);
      };
      if (mode == checkpoint::TagValidation::fail) {
        CHECK_THROWS_WITH_AS(checkpoint::save(engine, comm, dir, o), doctest::Contains("checkpoint tags differ between ranks"),
                             usage_error);
      } else {
        CHECK(checkpoint::save(engine, comm, dir, o).tag == "zero");
      }
    });
  };
  save_with(checkpoint::TagValidation::fail, d / "fail");
  CHECK(!fs::exists(d / "fail"));
  save_with(checkpoint::TagValidation::ignore, d / "ignore");
  CHECK(warnings.empty());
  CHECK(checkpoint::read_latest(d / "ignore") == "zero");
  save_with(checkpoint::TagValidation::warn, d / "warn");
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "rank 1: checkpoint tag \"one\" differs from rank 0's \"zero\"; using rank 0's");
  CHECK(checkpoint::read_latest(d / "warn") == "zero");
}

TEST_CASE("an invalid tag is a usage_error; saving a tag again replaces it atomically") {
  ScratchDir d("retag");
  const RunConfig cfg = config(2);
  comm::run_threads(2, [&](auto& comm) {
    Mlp<half> model;
    E2 engine(comm, model, engine_options(cfg));
    model.init(42);
    engine.initialize_master();
    CHECK_THROWS_WITH_AS(checkpoint::save(engine, comm, d.path(), {.tag = "../escape"}),
                         doctest::Contains("invalid checkpoint tag"), usage_error);
    CHECK_THROWS_WITH_AS(checkpoint::save(engine, comm, d.path(), {.tag = "latest"}),
                         doctest::Contains("invalid checkpoint tag"), usage_error);
    train_steps(engine, model, comm.rank(), cfg, 0, 1, nullptr);
    checkpoint::save(engine, comm, d.path(), {.tag = "same"});
    train_steps(engine, model, comm.rank(), cfg, 1, 2, nullptr);
    checkpoint::save(engine, comm, d.path(), {.tag = "same"});
  });
  CHECK(checkpoint::verify(d.path()).global_steps == 2);
  for (const auto& e : fs::directory_iterator(d.path())) {
    CHECK_MESSAGE(!e.path().filename().string().starts_with("."), e.path().string());
  }
}

}  // namespace test_errors
