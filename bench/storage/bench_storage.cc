// bench_storage: ckptd's storage path end to end on one data file, to compare with fio on the
// same disk (bench/storage/run.sh does both and prints the ratios).
//
//   write: one rank's save through the daemon's own pipeline, as ckptd's main.cc wires it: a
//          CapturePlan of host-memory tensors (bf16, a few hundred MiB each, odd sizes, registered
//          from a memfd like a trainer's), the HostPool (default 1 GiB of 16 MiB slots, pinned and
//          populated before the clock), the HotCache, the CaptureEngine (copy into pool slots)
//          and the FlushEngine (one aligned O_DIRECT pwrite per slot through DataFileWriter, XXH3
//          of every 1 MiB piece, fdatasync of the data file at the last token). Timed from
//          CaptureEngine::Submit to the job's on_persisted — the flush, `save` → `persisted`,
//          without the socket, the session and the commit.
//   read:  CheckpointReader::Read of every tensor in full, in one call: planning, aligned
//          coalesced reads, an XXH3 check of every piece (so also of the checksums the write
//          computed) and the copy into the destination.
//
// Source and destination memory is touched before the clock starts (the daemon's pool is
// pinned and pre-faulted), so page faults are not counted. The last lines are machine-readable
// `key=value` pairs for run.sh.
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/checkpoint_reader.h"
#include "common/data_layout.h"
#include "common/frame_io.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "common/units.h"
#include "daemon/capture_engine.h"
#include "daemon/capture_job.h"
#include "daemon/capture_plan.h"
#include "daemon/flush_engine.h"
#include "daemon/host_memory.h"
#include "daemon/host_pool.h"
#include "daemon/hot_cache.h"

namespace ckpt::bench {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kRowElements = 4096;  // bf16 rows of 8 KiB

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

struct Options {
  std::string dir;
  uint64_t size = 0;
  int io_threads = 8;       // the flush engine's writer threads (ckptd --flush-threads)
  int capture_threads = 2;  // ckptd --capture-threads
  uint64_t pool = 0;        // ckptd --host-pool
  uint64_t max_read = 0;
  bool keep = false;
};

int Fail(const std::string& what, const Status& s) {
  std::cerr << "bench_storage: " << what << ": " << s.ToString() << "\n";
  return 1;
}

int Run(const Options& o) {
  FileSystem* fs = PosixFileSystem();
  const std::string step_dir = JoinPath(o.dir, "ckpt-bench-" + std::to_string(::getpid()));
  const std::vector<uint64_t> sizes = TensorSizes(o.size);
  uint64_t total = 0, largest = 0;
  for (uint64_t s : sizes) {
    total += s;
    largest = std::max(largest, s);
  }

  // The trainer's memory: one shared-memory object as large as the largest tensor, registered
  // by descriptor as a trainer does; every tensor is a prefix of it.
  const int memfd = ::memfd_create("bench_storage", MFD_CLOEXEC);
  if (memfd < 0 || ::ftruncate(memfd, static_cast<off_t>(largest)) != 0) {
    return Fail("memfd", ErrnoStatus(errno, "memfd_create/ftruncate"));
  }
  std::vector<UniqueFd> fds;
  fds.emplace_back(memfd);
  auto* source = static_cast<std::byte*>(
      ::mmap(nullptr, largest, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  if (source == MAP_FAILED) return Fail("mmap", ErrnoStatus(errno, "mmap"));
  {
    std::mt19937_64 rng(42);
    for (size_t i = 0; i + 8 <= largest; i += 8) {
      const uint64_t v = rng();
      std::memcpy(source + i, &v, 8);
    }
  }
  std::vector<ckptd::v1::TensorSpec> specs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ckptd::v1::TensorSpec spec;
    spec.set_name("layers." + std::to_string(i) + ".weight");
    spec.set_dtype("bfloat16");
    const Shape shape{sizes[i] / 2 / kRowElements, kRowElements};
    for (uint64_t d : shape) spec.add_global_shape(d);
    *spec.mutable_geometry() = GeometryToProto(*ShardGeometry::Full(shape));
    spec.mutable_host()->set_fd_index(0);
    spec.mutable_host()->set_length(sizes[i]);
    specs.push_back(std::move(spec));
  }
  const LayoutOptions layout;  // defaults: what the daemon uses (1 MiB pieces, 16 MiB slots)
  MappingCache mappings;
  auto plan = BuildCapturePlan(specs, fds, mappings, layout);
  if (!plan.ok()) return Fail("capture plan", plan.status());

  // The daemon's engines, as main.cc wires them (default priorities).
  auto pool = HostPool::Create({o.pool, layout.slot_size, /*lock_memory=*/true});
  if (!pool.ok()) return Fail("host pool", pool.status());
  HotCache hot(pool->get());
  (*pool)->SetReclaimer([&hot] { return hot.ReclaimOne(); });
  FlushEngine flush({o.io_threads, 0}, pool->get(), &hot);
  CaptureEngine capture({o.capture_threads, 0, std::chrono::milliseconds(0)}, pool->get(), &flush);
  flush.Start();
  capture.Start();

  std::cout << "bench_storage: " << sizes.size() << " tensors, " << FormatBytes(total) << " in "
            << step_dir << ", " << o.io_threads << " flush threads, " << o.capture_threads
            << " capture threads, pool " << FormatBytes((*pool)->size_bytes())
            << ((*pool)->locked() ? " (locked)" : " (not locked)") << "\n";

  // ---- write: one rank's save of step 1, Submit → on_persisted
  auto job = std::make_shared<CaptureJob>();
  job->job = "bench";
  job->step = 1;
  job->rank = 0;
  job->plan = *plan;
  job->fs = fs;
  job->step_dir = step_dir;
  job->data_file = DataFileName(0);
  job->data_path = JoinPath(step_dir, job->data_file);
  std::promise<Status> captured_promise, persisted_promise;
  std::chrono::steady_clock::time_point captured_at;
  job->on_captured = [&](Status st) {
    captured_at = std::chrono::steady_clock::now();
    captured_promise.set_value(std::move(st));
  };
  job->on_persisted = [&](Status st) { persisted_promise.set_value(std::move(st)); };
  auto captured = captured_promise.get_future();
  auto persisted = persisted_promise.get_future();
  const auto w0 = std::chrono::steady_clock::now();
  capture.Submit(job);
  const Status persisted_status = persisted.get();
  const double write_s = Seconds(std::chrono::steady_clock::now() - w0);
  const Status captured_status = captured.get();
  const double capture_s = Seconds(captured_at - w0);
  capture.Stop();
  flush.Stop();
  if (!captured_status.ok()) return Fail("capture failed", captured_status);
  if (!persisted_status.ok()) return Fail("write failed", persisted_status);
  const bool direct = job->writer != nullptr && job->writer->direct();
  const DataFileLayout& file = (*plan)->layout;

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
    s->set_offset(file.shard_offsets[i]);
    s->set_length(sizes[i]);
    s->set_chunk_size(file.checksum_chunk);
    for (uint64_t x : job->checksums[i]) s->add_chunk_xxh3(x);
  }
  m.add_ranks()->set_rank(0);
  if (auto s = WriteFileAtomically(fs, JoinPath(step_dir, "MANIFEST"), EncodeManifest(m));
      !s.ok()) {
    return Fail("manifest", s);
  }

  // ---- read
  CheckpointReader::Options options;
  options.io_threads = o.io_threads;
  options.max_read_bytes = o.max_read;
  auto reader = CheckpointReader::Open(fs, step_dir, options);
  if (!reader.ok()) return Fail("open", reader.status());
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
  if (!read.ok()) return Fail("read failed", read);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (std::memcmp(dest[i].data(), source, sizes[i]) != 0) {
      std::cerr << "bench_storage: tensor " << i << " read back different bytes\n";
      return 1;
    }
  }

  if (!o.keep) fs->RemoveAll(step_dir).IgnoreError();
  ::munmap(source, largest);

  const double write_bps = static_cast<double>(total) / write_s;
  const double read_bps = static_cast<double>(total) / read_s;
  std::printf("write: %s in %.3f s = %.1f MB/s (captured into the pool after %.3f s)\n",
              FormatBytes(total).c_str(), write_s, write_bps / 1e6, capture_s);
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
  ckpt::bench::Options o;
  o.dir = "/tmp";
  std::string size_text = "4GiB";
  std::string pool_text = "1GiB";
  std::string max_read_text = "16MiB";
  app.add_option("--dir", o.dir, "directory on the filesystem to measure")->capture_default_str();
  app.add_option("--size", size_text, "bytes to write and read (e.g. 2GiB)")->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "flush (writer) and reader threads")
      ->capture_default_str();
  app.add_option("--capture-threads", o.capture_threads, "capture (copy) threads")
      ->capture_default_str();
  app.add_option("--pool", pool_text, "host pool (ckptd --host-pool)")->capture_default_str();
  app.add_option("--max-read", max_read_text, "reader's largest single read")
      ->capture_default_str();
  app.add_flag("--keep", o.keep, "keep the files written");
  CLI11_PARSE(app, argc, argv);
  auto size = ckpt::ParseByteSize(size_text);
  auto pool = ckpt::ParseByteSize(pool_text);
  auto max_read = ckpt::ParseByteSize(max_read_text);
  if (!size.ok() || !pool.ok() || !max_read.ok() || *size == 0 || o.io_threads < 1 ||
      o.capture_threads < 1) {
    std::cerr << "bench_storage: bad --size, --pool, --max-read or thread count\n";
    return 2;
  }
  o.size = *size;
  o.pool = *pool;
  o.max_read = *max_read;
  return ckpt::bench::Run(o);
}
