// The load path against real daemons: resharding from any layout into any other, hot restore
// from the daemon's memory, read-once per node for replicas, and clear errors for corruption
// and mismatches. Ranks are in-process clients (one connection each, exactly what the daemon
// sees from separate trainer processes) so hundreds of layouts stay fast.
#include "tests/integration/daemon_harness.h"

#include <random>
#include <thread>

namespace ckpt::itest {
namespace {

// A shard's memory: a memfd of exactly its bytes, mapped here.
class ShardBuffer {
 public:
  explicit ShardBuffer(uint64_t bytes) : bytes_(bytes) {
    fd_ = UniqueFd(::memfd_create("load_itest", MFD_CLOEXEC));
    REQUIRE(fd_);
    const uint64_t size = std::max<uint64_t>(bytes, 1);
    REQUIRE(::ftruncate(fd_.get(), static_cast<off_t>(size)) == 0);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<std::byte*>(p);
  }
  ~ShardBuffer() { ::munmap(data_, std::max<uint64_t>(bytes_, 1)); }
  ShardBuffer(const ShardBuffer&) = delete;
  ShardBuffer& operator=(const ShardBuffer&) = delete;
  std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_.get(); }

 private:
  uint64_t bytes_;
  UniqueFd fd_;
  std::byte* data_ = nullptr;
};

// Value of byte `b` of global element `i` of a tensor: depends on all three, so misplaced
// elements or bytes are caught.
std::byte ExpectedByte(uint64_t tensor_seed, uint64_t element, uint32_t b) {
  uint64_t x = tensor_seed * 0x9E3779B97F4A7C15ull + element * 0xBF58476D1CE4E5B9ull + b;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xff);
}

struct TensorDesc {
  std::string name;
  std::string dtype;
  uint32_t element_size;
  Shape shape;
  uint64_t seed;
};

// One rank's shard of one tensor in a layout.
struct ShardDesc {
  bool flat = false;
  Shape offsets, lengths;
  uint64_t flat_offset = 0, numel = 0;
  ShardGeometry Geometry(const Shape& shape) const {
    auto g = flat ? ShardGeometry::Flat(shape, flat_offset, numel)
                  : ShardGeometry::Box(shape, offsets, lengths);
    REQUIRE_OK(g);
    return *g;
  }
};

// Splits a tensor among `ranks`: row/column blocks along a random dimension, or flat ranges.
std::vector<ShardDesc> RandomLayout(const Shape& shape, uint32_t ranks, std::mt19937_64& rng) {
  uint64_t numel = 1;
  for (uint64_t d : shape) numel *= d;
  std::vector<ShardDesc> out(ranks);
  const bool flat = shape.empty() ? false : rng() % 2 == 0;
  if (flat || shape.empty()) {
    if (shape.empty()) {  // a scalar: rank 0 holds it, the others hold empty flat ranges
      for (uint32_t r = 0; r < ranks; ++r) {
        out[r].flat = r != 0;
        out[r].flat_offset = 0;
        out[r].numel = 0;
      }
      return out;
    }
    std::vector<uint64_t> cuts = {0, numel};
    for (uint32_t r = 1; r < ranks; ++r) cuts.push_back(rng() % (numel + 1));
    std::sort(cuts.begin(), cuts.end());
    for (uint32_t r = 0; r < ranks; ++r) {
      out[r].flat = true;
      out[r].flat_offset = cuts[r];
      out[r].numel = cuts[r + 1] - cuts[r];
    }
    return out;
  }
  const size_t dim = rng() % shape.size();
  std::vector<uint64_t> cuts = {0, shape[dim]};
  for (uint32_t r = 1; r < ranks; ++r) cuts.push_back(rng() % (shape[dim] + 1));
  std::sort(cuts.begin(), cuts.end());
  for (uint32_t r = 0; r < ranks; ++r) {
    out[r].offsets.assign(shape.size(), 0);
    out[r].lengths = shape;
    out[r].offsets[dim] = cuts[r];
    out[r].lengths[dim] = cuts[r + 1] - cuts[r];
  }
  return out;
}

// The bytes a shard holds (elements in the shard's row-major order).
void FillExpected(const TensorDesc& t, const ShardGeometry& g, std::byte* out) {
  for (const Run& run : g.Runs()) {
    for (uint64_t e = 0; e < run.length; ++e) {
      for (uint32_t b = 0; b < t.element_size; ++b) {
        out[(run.local_start + e) * t.element_size + b] =
            ExpectedByte(t.seed, run.global_start + e, b);
      }
    }
  }
}

// One rank of a layout: its buffers and the HostTensor specs pointing at them.
struct LayoutRank {
  std::vector<std::unique_ptr<ShardBuffer>> buffers;
  std::vector<HostTensor> specs;
  std::vector<ShardGeometry> geometries;
};

LayoutRank MakeRank(const std::vector<TensorDesc>& tensors,
                    const std::vector<std::vector<ShardDesc>>& layout, uint32_t rank) {
  LayoutRank out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDesc& t = tensors[i];
    const ShardDesc& s = layout[i][rank];
    ShardGeometry g = s.Geometry(t.shape);
    auto buffer = std::make_unique<ShardBuffer>(g.numel() * t.element_size);
    HostTensor h;
    h.name = t.name;
    h.dtype = t.dtype;
    h.global_shape = t.shape;
    h.flat = s.flat;
    h.offsets = s.offsets;
    h.lengths = s.lengths;
    h.flat_offset = s.flat_offset;
    h.numel = s.numel;
    h.fd = buffer->fd();
    h.nbytes = buffer->bytes();
    out.specs.push_back(std::move(h));
    out.geometries.push_back(std::move(g));
    out.buffers.push_back(std::move(buffer));
  }
  return out;
}

// Saves `step` of `job` with one client per rank of `layout` (all ranks in parallel, like
// separate trainer processes) and waits until it is committed.
void SaveLayout(const DaemonProcess& daemon, const std::string& job, uint64_t step,
                const std::vector<TensorDesc>& tensors,
                const std::vector<std::vector<ShardDesc>>& layout, uint32_t ranks) {
  std::vector<LayoutRank> rank_data;
  for (uint32_t r = 0; r < ranks; ++r) {
    rank_data.push_back(MakeRank(tensors, layout, r));
    for (size_t i = 0; i < tensors.size(); ++i) {
      FillExpected(tensors[i], rank_data[r].geometries[i], rank_data[r].buffers[i]->data());
    }
  }
  std::vector<Status> results(ranks);
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto client = Client::Connect(daemon.ClientOptionsFor(job, r, ranks));
      if (!client.ok()) {
        results[r] = client.status();
        return;
      }
      Status s = (*client)->Register(rank_data[r].specs);
      if (s.ok()) s = (*client)->Save(step, "extra of rank " + std::to_string(r));
      if (s.ok()) s = (*client)->Wait(step, WaitState::kCommitted, milliseconds(60000));
      results[r] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (uint32_t r = 0; r < ranks; ++r) {
    INFO("save of job " << job << " rank " << r);
    REQUIRE_OK(results[r]);
  }
}

struct LoadTotals {
  uint64_t from_memory = 0;
  uint64_t from_storage = 0;
};

// Loads `step` into every rank of `layout` (in parallel) and checks every byte.
LoadTotals LoadAndCheck(const DaemonProcess& daemon, const std::string& job, uint64_t step,
                        const std::vector<TensorDesc>& tensors,
                        const std::vector<std::vector<ShardDesc>>& layout, uint32_t ranks,
                        uint32_t saved_world_size) {
  std::vector<LayoutRank> rank_data;
  for (uint32_t r = 0; r < ranks; ++r) rank_data.push_back(MakeRank(tensors, layout, r));
  std::vector<Result<LoadResult>> results(ranks, Status(StatusCode::kUnknown, "not run"));
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto client = Client::Connect(daemon.ClientOptionsFor(job, r, ranks));
      if (!client.ok()) {
        results[r] = client.status();
        return;
      }
      Status s = (*client)->Register(rank_data[r].specs);
      if (!s.ok()) {
        results[r] = s;
        return;
      }
      results[r] = (*client)->Load(step);
    });
  }
  for (auto& t : threads) t.join();
  LoadTotals totals;
  for (uint32_t r = 0; r < ranks; ++r) {
    INFO("load of job " << job << " step " << step << " into rank " << r << " of " << ranks);
    REQUIRE_OK(results[r]);
    CHECK(results[r]->step == step);
    // A rank the step never had (the job grew) gets the blob of rank r mod the saved world.
    const uint32_t extra_rank = r % saved_world_size;
    CHECK(results[r]->extra == "extra of rank " + std::to_string(extra_rank));
    CHECK(results[r]->extra_rank == extra_rank);
    CHECK(results[r]->saved_world_size == saved_world_size);
    totals.from_memory += results[r]->bytes_from_memory;
    totals.from_storage += results[r]->bytes_from_storage;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const uint64_t n = rank_data[r].buffers[i]->bytes();
      std::vector<std::byte> expected(std::max<uint64_t>(n, 1));
      FillExpected(tensors[i], rank_data[r].geometries[i], expected.data());
      INFO("tensor " << tensors[i].name << " as " << rank_data[r].geometries[i].ToString());
      REQUIRE(std::memcmp(expected.data(), rank_data[r].buffers[i]->data(), n) == 0);
    }
  }
  return totals;
}

std::vector<TensorDesc> RandomTensors(std::mt19937_64& rng, uint64_t case_seed) {
  static const std::vector<std::pair<std::string, uint32_t>> kDTypes = {
      {"float32", 4}, {"bfloat16", 2}, {"int8", 1}, {"float64", 8}, {"int64", 8}};
  std::vector<TensorDesc> out;
  const int count = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < count; ++i) {
    TensorDesc t;
    t.name = "layer." + std::to_string(i) + ".weight";
    const auto& dt = kDTypes[rng() % kDTypes.size()];
    t.dtype = dt.first;
    t.element_size = dt.second;
    const size_t dims = rng() % 4;  // 0 = scalar
    for (size_t d = 0; d < dims; ++d) t.shape.push_back(1 + rng() % 37);
    t.seed = case_seed * 131 + static_cast<uint64_t>(i);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

TEST_CASE("any saved layout loads into any other layout, hot and cold", "[daemon][load]") {
  testing::TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.host_pool = "32MiB";
  options.slot_size = "1MiB";
  options.checksum_chunk = "64KiB";
  const uint64_t seed = testing::TestSeed();
  INFO("seed " << seed << " (set CKPT_TEST_SEED to reproduce)");
  std::mt19937_64 rng(seed);

  struct Case {
    std::string job;
    std::vector<TensorDesc> tensors;
    uint32_t save_ranks, load_ranks;
    std::vector<std::vector<ShardDesc>> save_layout, load_layout;
  };
  constexpr int kCases = 60;
  std::vector<Case> cases;
  for (int c = 0; c < kCases; ++c) {
    Case k;
    k.job = "reshard-" + std::to_string(c);
    k.tensors = RandomTensors(rng, seed + static_cast<uint64_t>(c));
    k.save_ranks = 1 + static_cast<uint32_t>(rng() % 4);
    k.load_ranks = c % 5 == 0 ? 1 : 1 + static_cast<uint32_t>(rng() % 4);  // M = 1 often
    for (const auto& t : k.tensors) {
      k.save_layout.push_back(RandomLayout(t.shape, k.save_ranks, rng));
      k.load_layout.push_back(RandomLayout(t.shape, k.load_ranks, rng));
    }
    cases.push_back(std::move(k));
  }

  {
    DaemonProcess daemon(options);
    for (const auto& k : cases) {
      INFO("case " << k.job << ": " << k.save_ranks << " ranks save, " << k.load_ranks << " load");
      SaveLayout(daemon, k.job, 7, k.tensors, k.save_layout, k.save_ranks);
      // Hot: the daemon still holds the step it just wrote.
      LoadAndCheck(daemon, k.job, 7, k.tensors, k.load_layout, k.load_ranks, k.save_ranks);
    }
    REQUIRE(ExitedWith(daemon.Terminate(), 0));
  }
  // Cold: a fresh daemon has nothing in memory and reads everything from storage.
  DaemonProcess daemon(options);
  for (const auto& k : cases) {
    INFO("cold case " << k.job);
    LoadAndCheck(daemon, k.job, 7, k.tensors, k.load_layout, k.load_ranks, k.save_ranks);
  }
}

namespace {

// Four 2 MiB float32 tensors, written whole by one rank: sizes are whole checksum chunks, so
// the bytes a load must read are exactly the tensors' bytes.
std::vector<TensorDesc> ReplicaTensors() {
  std::vector<TensorDesc> out;
  for (int i = 0; i < 4; ++i) {
    out.push_back(TensorDesc{"replica." + std::to_string(i),
                             "float32",
                             4,
                             {512, 1024},
                             static_cast<uint64_t>(1000 + i)});
  }
  return out;
}

std::vector<std::vector<ShardDesc>> WholeTensors(const std::vector<TensorDesc>& tensors,
                                                 uint32_t ranks) {
  std::vector<std::vector<ShardDesc>> layout;
  for (const auto& t : tensors) {
    ShardDesc whole;
    whole.offsets.assign(t.shape.size(), 0);
    whole.lengths = t.shape;
    layout.push_back(std::vector<ShardDesc>(ranks, whole));
  }
  return layout;
}

}  // namespace

TEST_CASE("hot restore reads nothing from storage, after a daemon restart it does",
          "[daemon][load]") {
  testing::TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  const auto tensors = ReplicaTensors();
  const uint64_t unique = 4 * 512 * 1024 * 4;
  {
    DaemonProcess daemon(options);
    // The trainer saves, then goes away (its connection ends: its lease).
    SaveLayout(daemon, "hot", 3, tensors, WholeTensors(tensors, 1), 1);
    // A new trainer process restores.
    LoadTotals hot = LoadAndCheck(daemon, "hot", 3, tensors, WholeTensors(tensors, 1), 1, 1);
    CHECK(hot.from_storage == 0);
    CHECK(hot.from_memory == unique);
    REQUIRE(ExitedWith(daemon.Terminate(), 0));
  }
  DaemonProcess daemon(options);
  LoadTotals cold = LoadAndCheck(daemon, "hot", 3, tensors, WholeTensors(tensors, 1), 1, 1);
  CHECK(cold.from_storage == unique);
  CHECK(cold.from_memory == 0);
}

TEST_CASE("four local replicas loading together read each stored byte once", "[daemon][load]") {
  testing::TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  const auto tensors = ReplicaTensors();
  const uint64_t unique = 4 * 512 * 1024 * 4;
  {
    DaemonProcess daemon(options);
    SaveLayout(daemon, "replicas", 5, tensors, WholeTensors(tensors, 1), 1);
    REQUIRE(ExitedWith(daemon.Terminate(), 0));
  }
  DaemonProcess daemon(options);  // cold
  LoadTotals totals = LoadAndCheck(daemon, "replicas", 5, tensors, WholeTensors(tensors, 4), 4, 1);
  CHECK(totals.from_storage == unique);
  CHECK(totals.from_memory == 3 * unique);
}

TEST_CASE("corrupt data and mismatched requests fail with messages that name them",
          "[daemon][load]") {
  testing::TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  const auto tensors = ReplicaTensors();
  {
    DaemonProcess daemon(options);
    SaveLayout(daemon, "bad", 1, tensors, WholeTensors(tensors, 1), 1);
    SaveLayout(daemon, "bad", 2, tensors, WholeTensors(tensors, 1), 1);
    REQUIRE(ExitedWith(daemon.Terminate(), 0));
  }
  // Flip one byte in the middle of step 2's data for replica.2 (third 2 MiB shard).
  const std::string data = StepDir(options.storage_root, "bad", 2) + "/" + DataFileName(0);
  {
    auto file = PosixFileSystem()->Open(data, OpenOptions{.write = true});
    REQUIRE_OK(file);
    std::byte b;
    const uint64_t at = 2 * (2ull << 20) + 12345;
    REQUIRE_OK((*file)->PReadAll(&b, 1, at));
    b = ~b;
    REQUIRE_OK((*file)->PWriteAll(&b, 1, at));
  }
  DaemonProcess daemon(options);
  LayoutRank rank = MakeRank(tensors, WholeTensors(tensors, 1), 0);
  auto client = daemon.Connect("bad");
  REQUIRE_OK(client->Register(rank.specs));

  SECTION("a flipped byte fails the load naming file, tensor and piece") {
    auto loaded = client->Load(2);
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(loaded.status().message(), Catch::Contains("rank-00000.data"));
    CHECK_THAT(loaded.status().message(), Catch::Contains("replica.2"));
    // The previous step is untouched and loads.
    auto older = client->Load(1);
    REQUIRE_OK(older);
  }
  SECTION("a step that does not exist") {
    auto loaded = client->Load(99);
    REQUIRE_FALSE(loaded.ok());
    CHECK(loaded.status().code() == StatusCode::kNotFound);
    CHECK_THAT(loaded.status().message(), Catch::Contains("99"));
  }
  SECTION("a dtype or shape that differs names the tensor and both") {
    auto specs = rank.specs;
    specs[1].dtype = "int32";  // same byte size, other dtype
    REQUIRE_OK(client->Register(specs));
    auto loaded = client->Load(1);
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(loaded.status().message(), Catch::Contains("replica.1"));
    CHECK_THAT(loaded.status().message(), Catch::Contains("float32"));
    CHECK_THAT(loaded.status().message(), Catch::Contains("int32"));

    specs = rank.specs;
    specs[0].global_shape = {1024, 512};
    specs[0].lengths = {1024, 512};
    REQUIRE_OK(client->Register(specs));
    loaded = client->Load(1);
    REQUIRE_FALSE(loaded.ok());
    CHECK_THAT(loaded.status().message(), Catch::Contains("replica.0"));
    CHECK_THAT(loaded.status().message(), Catch::Contains("[512, 1024]"));
    CHECK_THAT(loaded.status().message(), Catch::Contains("[1024, 512]"));
  }
  SECTION("a tensor missing from the step: strict fails, non-strict reports it") {
    ShardBuffer extra_buffer(4096);
    auto specs = rank.specs;
    HostTensor missing;
    missing.name = "not.saved";
    missing.dtype = "uint8";
    missing.global_shape = {4096};
    missing.fd = extra_buffer.fd();
    missing.nbytes = 4096;
    specs.push_back(missing);
    REQUIRE_OK(client->Register(specs));
    auto strict = client->Load(1);
    REQUIRE_FALSE(strict.ok());
    CHECK(strict.status().code() == StatusCode::kNotFound);
    CHECK_THAT(strict.status().message(), Catch::Contains("not.saved"));
    auto lenient = client->Load(1, /*strict=*/false);
    REQUIRE_OK(lenient);
    REQUIRE(lenient->missing == std::vector<std::string>{"not.saved"});
  }
}

}  // namespace ckpt::itest
