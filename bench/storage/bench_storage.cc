// bench_storage: ckptd's storage path end to end on one data file, to compare with fio on the
// same disk (bench/storage/run.sh does both and prints the ratios).
//
//   write: WriteShardsToFile of realistic shards (bf16 tensors of a few hundred MiB, odd sizes,
//          default LayoutOptions: 1 MiB checksum pieces, 16 MiB slots), O_DIRECT where the
//          filesystem takes it, fdatasync included — what the flush engine does per rank.
//   read:  CheckpointReader::Read of every tensor in full, in one call: planning, aligned
//          coalesced reads, an XXH3 check of every piece and the copy into the destination.
//
// Source and destination memory is touched before the clock starts (the daemon's pool is
// pinned and pre-faulted), so page faults are not counted. The last lines are machine-readable
// `key=value` pairs for run.sh.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/checkpoint_reader.h"
#include "common/data_layout.h"
#include "common/data_writer.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "common/units.h"

namespace ckpt::bench {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kRowElements = 4096;  // bf16 rows of 8 KiB

// An experiment, not the product: the POSIX filesystem, except that when `path` is created its
// blocks are first allocated with fallocate(2) to `size` bytes. On ext4 an O_DIRECT write that
// extends the file or fills a hole takes the inode lock exclusively, so concurrent writers of a
// growing file run one at a time; into preallocated blocks they run in parallel (fio
// preallocates by default). --preallocate measures what ckptd's writer would gain.
class PreallocatingFileSystem : public FileSystem {
 public:
  PreallocatingFileSystem(FileSystem* base, std::string path, uint64_t size)
      : base_(base), path_(std::move(path)), size_(size) {}

  Result<std::unique_ptr<File>> Open(const std::string& path, const OpenOptions& options) override {
    ASSIGN_OR_RETURN(std::unique_ptr<File> file, base_->Open(path, options));
    if (path == path_ && options.create && size_ > 0) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) return ErrnoStatus(errno, "open " + path);
      const int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(size_));
      const int err = errno;
      ::close(fd);
      if (rc != 0) return ErrnoStatus(err, "fallocate " + path);
    }
    return file;
  }
  Status CreateDirs(const std::string& p) override { return base_->CreateDirs(p); }
  Status Rename(const std::string& a, const std::string& b) override { return base_->Rename(a, b); }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  Status Remove(const std::string& p) override { return base_->Remove(p); }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  Result<std::vector<std::string>> ListDir(const std::string& p) override {
    return base_->ListDir(p);
  }
  Result<bool> Exists(const std::string& p) override { return base_->Exists(p); }

 private:
  FileSystem* base_;
  std::string path_;
  uint64_t size_;
};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Tensor sizes of a few hundred MiB, deliberately not multiples of the checksum chunk, cycling
// until `total` bytes; the last one is cut to fit. Each is a whole number of bf16 rows.
std::vector<uint64_t> TensorSizes(uint64_t total) {
  static constexpr uint64_t kPattern[] = {384 * kMiB + 8192 * 3, 256 * kMiB, 320 * kMiB + 8192 * 7,
                                          128 * kMiB + 8192, 448 * kMiB + 8192 * 5};
  const uint64_t row = kRowElements * 2;
  std::vector<uint64_t> sizes;
  uint64_t sum = 0;
  for (size_t i = 0; sum < total; ++i) {
    uint64_t s = std::min(kPattern[i % std::size(kPattern)], total - sum);
    s = std::max<uint64_t>(s / row * row, row);
    sizes.push_back(s);
    sum += s;
  }
  return sizes;
}

int Run(const std::string& dir, uint64_t size, int io_threads, uint64_t max_read, bool keep,
        bool preallocate) {
  FileSystem* fs = PosixFileSystem();
  const std::string step_dir = JoinPath(dir, "ckpt-bench-" + std::to_string(::getpid()));
  if (auto s = fs->CreateDirs(step_dir); !s.ok()) {
    std::cerr << "bench_storage: " << s.ToString() << "\n";
    return 1;
  }
  const std::vector<uint64_t> sizes = TensorSizes(size);
  uint64_t total = 0, largest = 0;
  for (uint64_t s : sizes) {
    total += s;
    largest = std::max(largest, s);
  }

  // One source buffer as large as the largest tensor; every tensor is a prefix of it, offset by
  // a per-tensor pattern so that the pieces differ.
  std::vector<std::byte> source(largest);
  {
    std::mt19937_64 rng(42);
    for (size_t i = 0; i + 8 <= source.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(source.data() + i, &v, 8);
    }
  }
  std::vector<ShardSource> shards;
  for (uint64_t s : sizes) shards.push_back(ShardSource{source.data(), s});

  std::cout << "bench_storage: " << sizes.size() << " tensors, " << FormatBytes(total) << " in "
            << step_dir << ", " << io_threads << " I/O threads\n";

  // ---- write
  const std::string data_path = JoinPath(step_dir, DataFileName(0));
  LayoutOptions layout;  // defaults: what the daemon uses
  auto planned = PlanDataFile(sizes, layout);
  if (!planned.ok()) {
    std::cerr << "bench_storage: " << planned.status().ToString() << "\n";
    return 1;
  }
  PreallocatingFileSystem preallocating(fs, data_path, planned->file_size);
  const auto w0 = std::chrono::steady_clock::now();
  auto written =
      WriteShardsToFile(preallocate ? &preallocating : fs, data_path, shards, layout, io_threads);
  const double write_s = Seconds(std::chrono::steady_clock::now() - w0);
  if (!written.ok()) {
    std::cerr << "bench_storage: write failed: " << written.status().ToString() << "\n";
    return 1;
  }

  // The manifest, as the coordinator would commit it.
  ckptd::v1::Manifest m;
  m.set_format_version(kFormatVersion);
  m.set_job("bench");
  m.set_step(1);
  m.set_world_size(1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto* t = m.add_tensors();
    t->set_name("layers." + std::to_string(i) + ".weight");
    t->set_dtype("bfloat16");
    t->add_global_shape(sizes[i] / 2 / kRowElements);
    t->add_global_shape(kRowElements);
    auto* s = t->add_shards();
    *s->mutable_geometry() =
        GeometryToProto(*ShardGeometry::Full({sizes[i] / 2 / kRowElements, kRowElements}));
    s->set_file(DataFileName(0));
    s->set_offset((*written)[i].offset);
    s->set_length((*written)[i].length);
    s->set_chunk_size((*written)[i].chunk_size);
    for (uint64_t x : (*written)[i].chunk_xxh3) s->add_chunk_xxh3(x);
  }
  m.add_ranks()->set_rank(0);
  if (auto s = WriteFileAtomically(fs, JoinPath(step_dir, "MANIFEST"), EncodeManifest(m));
      !s.ok()) {
    std::cerr << "bench_storage: " << s.ToString() << "\n";
    return 1;
  }

  // ---- read
  CheckpointReader::Options options;
  options.io_threads = io_threads;
  options.max_read_bytes = max_read;
  auto reader = CheckpointReader::Open(fs, step_dir, options);
  if (!reader.ok()) {
    std::cerr << "bench_storage: " << reader.status().ToString() << "\n";
    return 1;
  }
  std::vector<std::vector<std::byte>> dest;
  std::vector<CheckpointReader::Request> requests;
  for (size_t i = 0; i < sizes.size(); ++i) {
    dest.emplace_back(sizes[i], std::byte{1});  // touched: faulted in before the clock
    const auto& t = m.tensors(static_cast<int>(i));
    requests.push_back(CheckpointReader::Request{
        t.name(), *ShardGeometry::Full({t.global_shape(0), t.global_shape(1)}), t.dtype(),
        dest.back()});
  }
  const auto r0 = std::chrono::steady_clock::now();
  Status read = (*reader)->Read(requests);
  const double read_s = Seconds(std::chrono::steady_clock::now() - r0);
  if (!read.ok()) {
    std::cerr << "bench_storage: read failed: " << read.ToString() << "\n";
    return 1;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (std::memcmp(dest[i].data(), source.data(), sizes[i]) != 0) {
      std::cerr << "bench_storage: tensor " << i << " read back different bytes\n";
      return 1;
    }
  }

  bool direct = false;
  {
    OpenOptions o;
    o.try_direct = true;
    auto f = fs->Open(data_path, o);
    direct = f.ok() && (*f)->direct();
  }
  if (!keep) fs->RemoveAll(step_dir).IgnoreError();

  const double write_bps = static_cast<double>(total) / write_s;
  const double read_bps = static_cast<double>(total) / read_s;
  std::printf("write: %s in %.3f s = %.1f MB/s\n", FormatBytes(total).c_str(), write_s,
              write_bps / 1e6);
  std::printf("read:  %s in %.3f s = %.1f MB/s (bytes read %llu)\n", FormatBytes(total).c_str(),
              read_s, read_bps / 1e6, static_cast<unsigned long long>((*reader)->bytes_read()));
  std::printf("bytes=%llu\nwrite_bytes_per_s=%.0f\nread_bytes_per_s=%.0f\ndirect=%d\n",
              static_cast<unsigned long long>(total), write_bps, read_bps, direct ? 1 : 0);
  return 0;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  CLI::App app{"bench_storage: ckptd write and read throughput of one data file"};
  std::string dir = "/tmp";
  std::string size_text = "4GiB";
  std::string max_read_text = "16MiB";
  int io_threads = 8;
  bool keep = false;
  bool preallocate = false;
  app.add_option("--dir", dir, "directory on the filesystem to measure")->capture_default_str();
  app.add_option("--size", size_text, "bytes to write and read (e.g. 2GiB)")->capture_default_str();
  app.add_option("--io-threads", io_threads, "writer and reader threads")->capture_default_str();
  app.add_option("--max-read", max_read_text, "reader's largest single read")
      ->capture_default_str();
  app.add_flag("--keep", keep, "keep the files written");
  app.add_flag("--preallocate", preallocate,
               "experiment: fallocate the data file before writing it (see README)");
  CLI11_PARSE(app, argc, argv);
  auto size = ckpt::ParseByteSize(size_text);
  auto max_read = ckpt::ParseByteSize(max_read_text);
  if (!size.ok() || !max_read.ok() || *size == 0 || io_threads < 1) {
    std::cerr << "bench_storage: bad --size, --max-read or --io-threads\n";
    return 2;
  }
  return ckpt::bench::Run(dir, *size, io_threads, *max_read, keep, preallocate);
}
