// FaultInjectingFileSystem: each injected fault, the crash model, and the commit primitive
// (WriteFileAtomically) under crashes at every step.
#include "common/fault_file_system.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

using ckpt::testing::TempDir;

std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 37 + seed) & 0xff);
  return s;
}

// What is on disk, bypassing the fault layer; nullopt when absent.
std::optional<std::string> OnDisk(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::unique_ptr<File> OpenNew(FileSystem* fs, const std::string& path) {
  auto f = fs->Open(path, OpenOptions{.write = true, .create = true, .truncate = true});
  REQUIRE_OK(f);
  return std::move(f).value();
}

void Write(File& f, const std::string& data, uint64_t offset) {
  REQUIRE_OK(f.PWriteAll(data.data(), data.size(), offset));
}

bool Mentions(const Status& st, const std::string& what) {
  return st.message().find(what) != std::string::npos;
}

TEST_CASE("fault fs: ENOSPC after N bytes fails the crossing write whole", "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  const std::string path = dir / "rank-00000.data";
  auto f = OpenNew(&fs, path);
  fs.FailWithNoSpaceAfter(10000);
  const std::string block = Pattern(4096, 1);
  Write(*f, block, 0);
  Write(*f, block, 4096);
  Result<size_t> third = f->PWrite(block.data(), block.size(), 8192);
  REQUIRE_FALSE(third.ok());
  const Status& st = third.status();
  CHECK(st.sys_errno() == ENOSPC);
  CHECK(st.code() == StatusCode::kResourceExhausted);
  CHECK(Mentions(st, "pwrite " + path + " at offset 8192"));
  CHECK(Mentions(st, "No space left on device"));
  CHECK(fs.bytes_written() == 8192);
  CHECK(OnDisk(path)->size() == 8192);  // the failing write wrote nothing

  // What still fits is written; later writes keep failing.
  Write(*f, std::string(10000 - 8192, 'z'), 8192);
  Status more = f->PWriteAll("x", 1, 20000);
  CHECK(more.sys_errno() == ENOSPC);

  fs.ClearFaults();
  Write(*f, block, 8192);
  REQUIRE_OK(f->Close());
}

TEST_CASE("fault fs: EIO on the nth write and on DataSync", "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  const std::string path = dir / "f";
  auto f = OpenNew(&fs, path);

  fs.FailWriteNumber(3);
  Write(*f, "one", 0);
  Write(*f, "two", 3);
  Result<size_t> third = f->PWrite("333", 3, 6);
  REQUIRE_FALSE(third.ok());
  CHECK(third.status().sys_errno() == EIO);
  CHECK(third.status().code() == StatusCode::kInternal);
  CHECK(Mentions(third.status(), "pwrite " + path + " at offset 6"));
  Write(*f, "four", 6);  // one-shot
  CHECK(*OnDisk(path) == "onetwofour");

  fs.FailDataSync(true);
  Status sync = f->DataSync();
  CHECK(sync.sys_errno() == EIO);
  CHECK(Mentions(sync, "fdatasync " + path));
  fs.FailDataSync(false);
  REQUIRE_OK(f->DataSync());
  REQUIRE_OK(f->Close());
}

TEST_CASE("fault fs: short writes still produce the right file through PWriteAll", "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  fs.ShortWrites(true);

  SECTION("buffered: at most half, at least one byte") {
    auto f = OpenNew(&fs, dir / "buffered");
    auto n = f->PWrite("0123456789", 10, 0);
    REQUIRE_OK(n);
    CHECK(*n == 5);
    n = f->PWrite("x", 1, 5);
    REQUIRE_OK(n);
    CHECK(*n == 1);
    const std::string data = Pattern(100001, 3);
    Write(*f, data, 6);
    CHECK(fs.bytes_written() == 5 + 1 + data.size());
    REQUIRE_OK(f->Close());
    CHECK(*OnDisk(dir / "buffered") == "01234x" + data);
  }
  SECTION("O_DIRECT: cut at 4 KiB boundaries") {
    auto opened =
        fs.Open(dir / "direct", OpenOptions{.write = true, .create = true, .try_direct = true});
    REQUIRE_OK(opened);
    File& f = **opened;
    AlignedBuffer buf(40 * kIoAlignment);
    for (size_t i = 0; i < buf.size(); ++i) buf.data()[i] = std::byte(i * 7 % 251);
    auto n = f.PWrite(buf.data(), buf.size(), 0);
    REQUIRE_OK(n);
    CHECK(*n == (f.direct() ? 20 * kIoAlignment : buf.size() / 2));
    REQUIRE_OK(f.PWriteAll(buf.data(), buf.size(), 0));
    REQUIRE_OK(f.Close());
    const auto disk = OnDisk(dir / "direct");
    REQUIRE(disk->size() == buf.size());
    CHECK(std::memcmp(disk->data(), buf.data(), buf.size()) == 0);
  }
}

TEST_CASE("fault fs: LimitFaultsTo confines faults to matching paths", "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  fs.LimitFaultsTo("victim");
  fs.FailDataSync(true);
  fs.FailWithNoSpaceAfter(0);
  auto bystander = OpenNew(&fs, dir / "bystander");
  auto victim = OpenNew(&fs, dir / "victim");
  Write(*bystander, "fine", 0);
  REQUIRE_OK(bystander->DataSync());
  CHECK(victim->PWriteAll("x", 1, 0).sys_errno() == ENOSPC);
  CHECK(victim->DataSync().sys_errno() == EIO);
  fs.ClearFaults();
  Write(*victim, "x", 0);
  REQUIRE_OK(victim->DataSync());
}

TEST_CASE("fault fs: a crash loses unsynced bytes and unsynced entries, keeps synced ones",
          "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  const std::string synced = dir / "synced";
  const std::string partly = dir / "partly";
  const std::string no_dir_sync = dir / "no-dir-sync";
  const std::string retruncated = dir / "retruncated";
  const std::string sub = dir / "sub";
  REQUIRE_OK(fs.CreateDirs(sub));

  auto a = OpenNew(&fs, synced);
  auto b = OpenNew(&fs, partly);
  auto r = OpenNew(&fs, retruncated);
  Write(*a, "durable", 0);
  REQUIRE_OK(a->DataSync());
  REQUIRE_OK(a->Close());
  Write(*b, Pattern(8192, 1), 0);
  REQUIRE_OK(b->DataSync());
  Write(*b, Pattern(5000, 2), 8192);  // lost
  Write(*r, "old", 0);
  REQUIRE_OK(r->DataSync());
  REQUIRE_OK(r->Close());
  REQUIRE_OK(fs.SyncDir(dir.path()));  // the entries above are durable now

  // Entries in another directory are not made durable by syncing dir.
  auto d = OpenNew(&fs, sub + "/file");
  REQUIRE_OK(d->DataSync());
  REQUIRE_OK(fs.SyncDir(dir.path()));
  // Created after the last directory sync: the entry is lost though its data was synced.
  auto c = OpenNew(&fs, no_dir_sync);
  Write(*c, "gone", 0);
  REQUIRE_OK(c->DataSync());
  // Reopened with truncate: back to unsynced zero bytes.
  auto r2 = OpenNew(&fs, retruncated);
  Write(*r2, "new, never synced", 0);

  REQUIRE_OK(fs.SimulateCrash());

  CHECK(*OnDisk(synced) == "durable");
  CHECK(*OnDisk(partly) == Pattern(8192, 1));
  CHECK_FALSE(OnDisk(no_dir_sync));
  CHECK_FALSE(OnDisk(sub + "/file"));
  CHECK(std::filesystem::is_directory(sub));  // directories are durable once made
  CHECK(*OnDisk(retruncated) == "");

  // Files open at the crash are dead: every call fails with EIO.
  for (File* f : {b.get(), c.get(), r2.get()}) {
    CHECK(f->PWrite("x", 1, 0).status().sys_errno() == EIO);
    char byte;
    CHECK(f->PRead(&byte, 1, 0).status().sys_errno() == EIO);
    CHECK(f->DataSync().sys_errno() == EIO);
    CHECK(f->Truncate(0).sys_errno() == EIO);
    CHECK(f->Size().status().sys_errno() == EIO);
    CHECK(Mentions(f->Close(), f->path()));
  }
  CHECK(*OnDisk(partly) == Pattern(8192, 1));  // the dead writes did not land

  // The filesystem itself lives on, as seen by the restarted process.
  auto after = OpenNew(&fs, no_dir_sync);
  Write(*after, "again", 0);
  REQUIRE_OK(after->DataSync());
  REQUIRE_OK(fs.SyncDir(dir.path()));
  REQUIRE_OK(fs.SimulateCrash());
  CHECK(*OnDisk(no_dir_sync) == "again");
}

TEST_CASE("fault fs: a rename is durable only after SyncDir of its directory", "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  const std::string tmp = dir / "x.tmp";
  const std::string target = dir / "x";
  auto write_synced = [&](const std::string& data) {
    auto f = OpenNew(&fs, tmp);
    Write(*f, data, 0);
    REQUIRE_OK(f->DataSync());
    REQUIRE_OK(f->Close());
  };

  write_synced("first");
  REQUIRE_OK(fs.Rename(tmp, target));
  REQUIRE_OK(fs.SimulateCrash());
  CHECK_FALSE(OnDisk(target));
  CHECK_FALSE(OnDisk(tmp));

  write_synced("second");
  REQUIRE_OK(fs.Rename(dir.path() + "//x.tmp", dir.path() + "/./x"));  // spelling does not matter
  REQUIRE_OK(fs.SyncDir(dir.path() + "/"));
  REQUIRE_OK(fs.SimulateCrash());
  CHECK(*OnDisk(target) == "second");

  // Removing an unsynced entry leaves nothing for the crash to do.
  auto f = OpenNew(&fs, dir / "short-lived");
  REQUIRE_OK(fs.Remove(dir / "short-lived"));
  REQUIRE_OK(fs.SimulateCrash());
  CHECK(*OnDisk(target) == "second");
}

// Wraps the fault fs and crashes it just before the nth operation (filesystem or file call):
// the operation and all later ones fail with EIO, as in a process that died there.
class CrashBeforeOp final : public FileSystem {
 public:
  CrashBeforeOp(FaultInjectingFileSystem* fs, int crash_at) : fs_(fs), crash_at_(crash_at) {}

  bool crashed() const { return crashed_; }

  Status Step(const std::string& what) {
    if (crashed_) return ErrnoStatus(EIO, what);
    if (++ops_ == crash_at_) {
      crashed_ = true;
      RETURN_IF_ERROR(fs_->SimulateCrash());
      return ErrnoStatus(EIO, what);
    }
    return Status::Ok();
  }

  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& o) override {
    RETURN_IF_ERROR(Step("open " + path));
    ASSIGN_OR_RETURN(auto file, fs_->Open(path, o));
    return std::unique_ptr<File>(std::make_unique<CrashingFile>(this, std::move(file)));
  }
  Status CreateDirs(const std::string& p) override {
    RETURN_IF_ERROR(Step("mkdir " + p));
    return fs_->CreateDirs(p);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    RETURN_IF_ERROR(Step("rename " + from));
    return fs_->Rename(from, to);
  }
  Status SyncDir(const std::string& p) override {
    RETURN_IF_ERROR(Step("fsync " + p));
    return fs_->SyncDir(p);
  }
  Status Remove(const std::string& p) override {
    RETURN_IF_ERROR(Step("remove " + p));
    return fs_->Remove(p);
  }
  Status RemoveAll(const std::string& p) override {
    RETURN_IF_ERROR(Step("remove_all " + p));
    return fs_->RemoveAll(p);
  }
  Result<std::vector<std::string>> ListDir(const std::string& p) override {
    RETURN_IF_ERROR(Step("opendir " + p));
    return fs_->ListDir(p);
  }
  Result<bool> Exists(const std::string& p) override {
    RETURN_IF_ERROR(Step("stat " + p));
    return fs_->Exists(p);
  }

 private:
  class CrashingFile final : public File {
   public:
    CrashingFile(CrashBeforeOp* fs, std::unique_ptr<File> f) : fs_(fs), f_(std::move(f)) {}
    Result<size_t> PWrite(const void* d, size_t n, uint64_t off) override {
      RETURN_IF_ERROR(fs_->Step("pwrite " + path()));
      return f_->PWrite(d, n, off);
    }
    Result<size_t> PRead(void* d, size_t n, uint64_t off) override {
      RETURN_IF_ERROR(fs_->Step("pread " + path()));
      return f_->PRead(d, n, off);
    }
    Status DataSync() override {
      RETURN_IF_ERROR(fs_->Step("fdatasync " + path()));
      return f_->DataSync();
    }
    Status Truncate(uint64_t size) override {
      RETURN_IF_ERROR(fs_->Step("ftruncate " + path()));
      return f_->Truncate(size);
    }
    Status Allocate(uint64_t size) override {
      RETURN_IF_ERROR(fs_->Step("fallocate " + path()));
      return f_->Allocate(size);
    }
    Result<uint64_t> Size() override {
      RETURN_IF_ERROR(fs_->Step("fstat " + path()));
      return f_->Size();
    }
    Status Close() override {
      RETURN_IF_ERROR(fs_->Step("close " + path()));
      return f_->Close();
    }
    bool direct() const override { return f_->direct(); }
    const std::string& path() const override { return f_->path(); }

   private:
    CrashBeforeOp* fs_;
    std::unique_ptr<File> f_;
  };

  FaultInjectingFileSystem* fs_;
  int crash_at_;
  int ops_ = 0;
  bool crashed_ = false;
};

TEST_CASE("WriteFileAtomically under a crash at every step: old, nothing or new, never torn",
          "[storage]") {
  const bool had_old = GENERATE(false, true);
  const bool short_writes = GENERATE(false, true);
  INFO("old file existed: " << had_old << ", short writes: " << short_writes);
  const std::string old_contents = "step 41\n";
  const std::string new_contents = Pattern(10000, 42);  // several short writes when cut

  int crash_at = 1;
  for (;; ++crash_at) {
    INFO("crash before operation " << crash_at);
    TempDir dir;
    const std::string path = dir / "LATEST";
    FaultInjectingFileSystem fault(PosixFileSystem());
    if (had_old) REQUIRE_OK(WriteFileAtomically(&fault, path, old_contents));
    fault.ShortWrites(short_writes);

    CrashBeforeOp fs(&fault, crash_at);
    Status st = WriteFileAtomically(&fs, path, new_contents);
    if (!fs.crashed()) {
      // Ran to completion before the crash point: durable, so a crash now keeps it.
      REQUIRE_OK(st);
      REQUIRE_OK(fault.SimulateCrash());
      CHECK(*OnDisk(path) == new_contents);
      CHECK_FALSE(OnDisk(path + ".tmp"));
      break;
    }
    REQUIRE_FALSE(st.ok());
    CHECK(st.sys_errno() == EIO);
    CHECK(Mentions(st, path));
    const std::optional<std::string> after = OnDisk(path);
    if (after) {
      // The old contents survive a crash before the rename; a rename that was not yet
      // dir-synced is modelled as losing the file (see fault_file_system.cc).
      CHECK(had_old);
      CHECK(*after == old_contents);
    }
    CHECK_FALSE(OnDisk(path + ".tmp"));
  }
  // open, >= 1 pwrite, fdatasync, close, rename, fsync dir: the loop tried each of them.
  CHECK(crash_at >= 7);
}

TEST_CASE("WriteFileAtomically failing before the rename keeps the old file, drops the temp",
          "[storage]") {
  TempDir dir;
  FaultInjectingFileSystem fs(PosixFileSystem());
  const std::string path = dir / "MANIFEST";
  REQUIRE_OK(WriteFileAtomically(&fs, path, "old"));

  fs.FailDataSync(true);
  Status st = WriteFileAtomically(&fs, path, "new");
  CHECK(st.sys_errno() == EIO);
  CHECK(Mentions(st, "write " + path + " atomically"));
  CHECK(*OnDisk(path) == "old");
  CHECK_FALSE(OnDisk(path + ".tmp"));

  fs.ClearFaults();
  fs.FailWithNoSpaceAfter(1);
  st = WriteFileAtomically(&fs, path, "new");
  CHECK(st.code() == StatusCode::kResourceExhausted);
  CHECK(Mentions(st, path + ".tmp"));
  CHECK(*OnDisk(path) == "old");
  CHECK_FALSE(OnDisk(path + ".tmp"));

  fs.ClearFaults();
  REQUIRE_OK(WriteFileAtomically(&fs, path, "new"));
  REQUIRE_OK(fs.SimulateCrash());
  CHECK(*OnDisk(path) == "new");
}

}  // namespace
}  // namespace ckpt
