// Access control between jobs on one daemon: a session loads its own job's checkpoints, or
// those of a job the daemon shares by config (shared-jobs), never another job's. Spoken through
// the raw protocol (Load.job) and through the C++ client's Load(LoadOptions{.job = …}).
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

namespace {

using ckpt::UniqueFd;
using ckpt::itest::DaemonProcess;
using ckpt::itest::HostSpec;
using ckpt::itest::RawConnection;
using ckpt::testing::TempDir;

constexpr uint64_t kFloats = 1024;
constexpr uint64_t kBytes = kFloats * 4;

// A memfd holding `kFloats` floats, mapped for the test to read and write.
struct HostBuffer {
  HostBuffer() : fd(::memfd_create("access_itest", MFD_CLOEXEC)) {
    REQUIRE(fd);
    REQUIRE(::ftruncate(fd.get(), kBytes) == 0);
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    REQUIRE(p != MAP_FAILED);
    data = static_cast<float*>(p);
  }
  ~HostBuffer() { ::munmap(data, kBytes); }
  UniqueFd fd;
  float* data;
};

// Tensor "w": the whole of `buffer`.
ckpt::HostTensor TensorW(const HostBuffer& buffer) {
  ckpt::HostTensor t;
  t.name = "w";
  t.dtype = "float32";
  t.global_shape = {kFloats};
  t.fd = buffer.fd.get();
  t.nbytes = kBytes;
  return t;
}

// Job `job` saves step 1 of tensor "w" (values i * 0.5) and waits for its commit.
void CommitBaseModel(const DaemonProcess& daemon, const std::string& job) {
  HostBuffer buffer;
  for (uint64_t i = 0; i < kFloats; ++i) buffer.data[i] = static_cast<float>(i) * 0.5f;
  auto client = daemon.Connect(job);
  const ckpt::HostTensor t = TensorW(buffer);
  REQUIRE_OK(client->Register({&t, 1}));
  REQUIRE_OK(client->Save(1));
  REQUIRE_OK(client->Wait(1, ckpt::WaitState::kCommitted));
}

ckptd::v1::ClientMessage LoadFrom(const std::string& job) {
  ckptd::v1::ClientMessage m;
  m.mutable_load()->set_job(job);
  m.mutable_load()->set_has_step(true);
  m.mutable_load()->set_step(1);
  m.mutable_load()->set_strict(true);
  return m;
}

}  // namespace

TEST_CASE("access: a session loads a shared job's checkpoint but not an unshared one",
          "[daemon][ops][access]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--shared-jobs", "base-model"};
  DaemonProcess daemon(options);
  CommitBaseModel(daemon, "base-model");
  CommitBaseModel(daemon, "private-job");

  RawConnection conn(daemon.socket());
  REQUIRE(conn.Hello("finetune").has_hello());
  HostBuffer target;
  ckptd::v1::ClientMessage reg;
  *reg.mutable_register_()->add_tensors() = HostSpec("w", "float32", {kFloats}, 0, kBytes);
  const int fds[] = {target.fd.get()};
  REQUIRE(conn.Call(reg, fds).has_register_());

  SECTION("shared: the bytes arrive") {
    const auto reply = conn.Call(LoadFrom("base-model"));
    INFO(reply.DebugString());
    REQUIRE(reply.has_load());
    CHECK(reply.load().step() == 1);
    for (uint64_t i = 0; i < kFloats; ++i) {
      if (target.data[i] != static_cast<float>(i) * 0.5f) FAIL("element " << i << " differs");
    }
  }
  SECTION("not shared: PERMISSION_DENIED naming both jobs, and nothing written") {
    const auto reply = conn.Call(LoadFrom("private-job"));
    REQUIRE(reply.has_error());
    CHECK(reply.error().code() == static_cast<uint32_t>(ckpt::StatusCode::kPermissionDenied));
    CHECK_THAT(reply.error().message(), Catch::Contains("'finetune'"));
    CHECK_THAT(reply.error().message(), Catch::Contains("'private-job'"));
    for (uint64_t i = 0; i < kFloats; ++i) {
      if (target.data[i] != 0.0f) FAIL("element " << i << " was written");
    }
    // The session goes on: its own job (nothing committed) answers NOT_FOUND, not a denial.
    const auto own = conn.Call(LoadFrom(""));
    REQUIRE(own.has_error());
    CHECK(own.error().code() == static_cast<uint32_t>(ckpt::StatusCode::kNotFound));
  }
  SECTION("a hostile job name is refused as such") {
    const auto reply = conn.Call(LoadFrom("../private-job"));
    REQUIRE(reply.has_error());
    CHECK(reply.error().code() == static_cast<uint32_t>(ckpt::StatusCode::kInvalidArgument));
  }
}

TEST_CASE("access: the C++ client loads a shared job's checkpoint through LoadOptions::job",
          "[daemon][ops][access]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--shared-jobs", "base-model"};
  DaemonProcess daemon(options);
  CommitBaseModel(daemon, "base-model");
  CommitBaseModel(daemon, "private-job");

  HostBuffer target;
  auto client = daemon.Connect("finetune");
  const ckpt::HostTensor t = TensorW(target);
  REQUIRE_OK(client->Register({&t, 1}));

  ckpt::LoadOptions denied;
  denied.job = "private-job";
  auto refused = client->Load(denied);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == ckpt::StatusCode::kPermissionDenied);
  CHECK_THAT(refused.status().message(), Catch::Contains("'private-job'"));
  for (uint64_t i = 0; i < kFloats; ++i) {
    if (target.data[i] != 0.0f) FAIL("element " << i << " was written");
  }

  ckpt::LoadOptions shared;
  shared.job = "base-model";  // newest committed step of base-model
  auto loaded = client->Load(shared);
  REQUIRE_OK(loaded);
  CHECK(loaded->step == 1);
  for (uint64_t i = 0; i < kFloats; ++i) {
    if (target.data[i] != static_cast<float>(i) * 0.5f) FAIL("element " << i << " differs");
  }
  // Its own job has nothing committed: NOT_FOUND, not a denial.
  auto own = client->Load(std::nullopt, true);
  REQUIRE_FALSE(own.ok());
  CHECK(own.status().code() == ckpt::StatusCode::kNotFound);
}
