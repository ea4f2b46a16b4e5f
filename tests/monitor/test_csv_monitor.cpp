// CsvMonitor: DeepSpeed's directory, file names, header and row format; rank 0 only.
#include "common.hpp"

#include <filesystem>
#include <string>

#include "zerotk/monitor/csv_monitor.hpp"

using namespace zerotk;
using namespace zerotk::monitor;
using zerotk_test::read_bytes;
using zerotk_test::ScratchDir;

namespace {
config::CsvMonitorOptions options(const std::filesystem::path& out, std::string job = "job") {
  config::CsvMonitorOptions o;
  o.enabled = true;
  o.output_path = out.string();
  o.job_name = std::move(job);
  return o;
}
}  // namespace

TEST_CASE("rank 0 writes one file per event name under output_path/job_name") {
  ScratchDir tmp("csv");
  CsvMonitor m(options(tmp.path(), "run1"), 0);
  REQUIRE(m.enabled());
  CHECK(m.log_dir() == tmp.path() / "run1");
  CHECK(std::filesystem::is_directory(tmp.path() / "run1"));  // created up front
  m.write_events({{"Train/Samples/lr", 0.0001, 8}, {"Train/Samples/loss_scale", 65536, 8}});
  m.write_events({{"Train/Samples/lr", 5e-05, 16}, {"Train/Samples/loss_scale", 32768.0, 16}});
  m.write("custom metric", 1.5, 3);
  CHECK(read_bytes(tmp.path() / "run1" / "Train_Samples_lr.csv") == "step,lr\r\n8,0.0001\r\n16,5e-05\r\n");
  CHECK(read_bytes(tmp.path() / "run1" / "Train_Samples_loss_scale.csv") ==
        "step,loss_scale\r\n8,65536\r\n16,32768.0\r\n");
  CHECK(read_bytes(tmp.path() / "run1" / "custom_metric.csv") == "step,custom metric\r\n3,1.5\r\n");
  CHECK(m.file_for("Train/Samples/lr") == tmp.path() / "run1" / "Train_Samples_lr.csv");
}

TEST_CASE("a new monitor appends, with its own header, like a restarted DeepSpeed job") {
  ScratchDir tmp("csv_restart");
  {
    CsvMonitor m(options(tmp.path()), 0);
    m.write("Train/Samples/train_loss", 2.5, 0);
  }
  CsvMonitor again(options(tmp.path()), 0);
  again.write("Train/Samples/train_loss", 2.25, 4);
  CHECK(read_bytes(tmp.path() / "job" / "Train_Samples_train_loss.csv") ==
        "step,train_loss\r\n0,2.5\r\nstep,train_loss\r\n4,2.25\r\n");
}

TEST_CASE("other ranks and disabled monitors write nothing") {
  ScratchDir tmp("csv_quiet");
  CsvMonitor rank1(options(tmp.path()), 1);
  CHECK_FALSE(rank1.enabled());
  rank1.write("Train/Samples/lr", 0.1, 1);
  auto off = options(tmp.path());
  off.enabled = false;
  CsvMonitor disabled(off, 0);
  disabled.write("Train/Samples/lr", 0.1, 1);
  CHECK_FALSE(std::filesystem::exists(tmp.path()));
}

TEST_CASE("names that need CSV quoting are quoted as Python's csv module does") {
  ScratchDir tmp("csv_quote");
  CsvMonitor m(options(tmp.path()), 0);
  m.write("Eval/acc,top1", 0.75, 10);
  m.write("Eval/say \"hi\"", 1, 10);
  CHECK(read_bytes(tmp.path() / "job" / "Eval_acc,top1.csv") == "step,\"acc,top1\"\r\n10,0.75\r\n");
  CHECK(read_bytes(tmp.path() / "job" / "Eval_say_\"hi\".csv") == "step,\"say \"\"hi\"\"\"\r\n10,1\r\n");
}

TEST_CASE("an unusable output path is an io_error naming it") {
  ScratchDir tmp("csv_bad");
  std::filesystem::create_directories(tmp.path());
  { std::ofstream(tmp.path() / "file") << "x"; }
  CHECK_THROWS_AS(CsvMonitor(options(tmp.path() / "file"), 0), io_error);
  try {
    CsvMonitor m(options(tmp.path() / "file"), 0);
  } catch (const io_error& e) {
    CHECK(e.where() == (tmp.path() / "file" / "job").string());
  }
}
