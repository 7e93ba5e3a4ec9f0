// FaultInjectingFileSystem: the stalled write, fault specs (ApplySpec) and the control file a
// running daemon re-reads — the pieces the chaos tests (tests/integration/chaos_*) drive.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "common/fault_file_system.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::TempDir;

std::unique_ptr<File> OpenNew(FileSystem* fs, const std::string& path) {
  auto f = fs->Open(path, OpenOptions{.write = true, .create = true, .truncate = true});
  REQUIRE_OK(f);
  return std::move(f).value();
}

void WriteText(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp, std::ios::trunc) << text;
  std::filesystem::rename(tmp, path);
}

TEST_CASE("fault fs: a stalled write blocks until ReleaseStalls, others go on", "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  fs.StallWriteNumber(2);
  auto f = OpenNew(&fs, dir / "a");
  const std::string block(4096, 'x');
  REQUIRE_OK(f->PWriteAll(block.data(), block.size(), 0));  // write 1: not stalled
  auto stalled = std::async(std::launch::async, [&] {
    return f->PWrite(block.data(), block.size(), 4096);  // write 2: stalls
  });
  // Wait for the stall to have begun (the counter moves before the write blocks).
  while (fs.stalled_writes() == 0) std::this_thread::yield();
  CHECK(stalled.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
  auto g = OpenNew(&fs, dir / "b");
  REQUIRE_OK(g->PWriteAll(block.data(), block.size(), 0));  // another write is not held up
  fs.ReleaseStalls();
  auto written = stalled.get();
  REQUIRE_OK(written);
  CHECK(*written == block.size());
}

TEST_CASE("fault fs: a stall released by a writer opening a FIFO", "[storage]") {
  TempDir dir;
  const std::string fifo = dir / "release";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  FaultInjectingFileSystem fs(PosixFileSystem());
  REQUIRE_OK(fs.ApplySpec("stall-write=1,stall-release=" + fifo));
  auto f = OpenNew(&fs, dir / "a");
  const std::string block(4096, 'y');
  auto stalled =
      std::async(std::launch::async, [&] { return f->PWrite(block.data(), block.size(), 0); });
  // Opening for writing blocks until the stalled write has opened it for reading.
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  ::close(fd);
  REQUIRE_OK(stalled.get());
  CHECK(fs.stalled_writes() == 1);
}

TEST_CASE("fault fs: ApplySpec takes every key and names a bad item", "[storage]") {
  FaultInjectingFileSystem fs(PosixFileSystem());
  REQUIRE_OK(fs.ApplySpec("enospc-after=1MiB, eio-write=3,eio-sync,short-writes,path=step-1"));
  const Status unknown = fs.ApplySpec("eio-sync,melt-disk=1");
  REQUIRE(unknown.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(unknown.message(), Catch::Contains("melt-disk"));
  const Status bad_number = fs.ApplySpec("enospc-after=lots");
  REQUIRE(!bad_number.ok());
  CHECK_THAT(bad_number.message(), Catch::Contains("enospc-after=lots"));
}

TEST_CASE("fault fs: the control file turns faults on and off while running", "[storage]") {
  TempDir dir;
  const std::string control = dir / "faults";
  FaultInjectingFileSystem fs(PosixFileSystem());
  REQUIRE_OK(fs.ApplySpec("control=" + control));
  const std::string block(4096, 'z');

  // No file yet: no faults.
  REQUIRE_OK(OpenNew(&fs, dir / "a")->PWriteAll(block.data(), block.size(), 0));
  WriteText(control, "enospc-after=0,path=step-7");
  {
    auto f = OpenNew(&fs, dir / "step-7.data");  // the open re-reads the control file
    Result<size_t> w = f->PWrite(block.data(), block.size(), 0);
    REQUIRE(!w.ok());
    CHECK(w.status().sys_errno() == ENOSPC);
    // Other paths are not affected.
    REQUIRE_OK(OpenNew(&fs, dir / "step-8.data")->PWriteAll(block.data(), block.size(), 0));
  }
  WriteText(control, "");  // space returns
  REQUIRE_OK(OpenNew(&fs, dir / "step-7.data")->PWriteAll(block.data(), block.size(), 0));
  // A bad spec in the file is logged and leaves no faults.
  WriteText(control, "bogus");
  REQUIRE_OK(OpenNew(&fs, dir / "step-7.data")->PWriteAll(block.data(), block.size(), 0));
}

}  // namespace
}  // namespace ckpt
