// BuildCapturePlan and RegistrationFingerprint (daemon/capture_plan.h) with real memfds.
#include "daemon/capture_plan.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckpt {
namespace {

using Catch::Matchers::Contains;
namespace pb = ckptd::v1;

UniqueFd MemFd(uint64_t size, uint8_t fill = 0) {
  UniqueFd fd(::memfd_create("capture-plan-test", MFD_CLOEXEC));
  REQUIRE(fd);
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(size)) == 0);
  if (fill != 0) {
    std::vector<uint8_t> bytes(size);
    for (uint64_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>((i + fill) & 0xff);
    REQUIRE(::pwrite(fd.get(), bytes.data(), size, 0) == static_cast<ssize_t>(size));
  }
  return fd;
}

UniqueFd Dup(const UniqueFd& fd) {
  UniqueFd d(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 100));  // a clearly different number
  REQUIRE(d);
  return d;
}

pb::TensorSpec Spec(const std::string& name, const std::string& dtype, std::vector<uint64_t> shape,
                    uint32_t fd_index, uint64_t offset, uint64_t length) {
  pb::TensorSpec s;
  s.set_name(name);
  s.set_dtype(dtype);
  auto* box = s.mutable_geometry()->mutable_box();
  for (uint64_t d : shape) {
    s.add_global_shape(d);
    box->add_offsets(0);
    box->add_lengths(d);
  }
  s.mutable_host()->set_fd_index(fd_index);
  s.mutable_host()->set_offset(offset);
  s.mutable_host()->set_length(length);
  return s;
}

// "a": float32 [16, 16] at 0 of fd 0; "b": bfloat16 [100] at 4096 of fd 0; "c": int64 [3] at 8
// of fd 1.
std::vector<pb::TensorSpec> ValidSpecs() {
  auto b = Spec("b", "bfloat16", {100}, 0, 4096, 200);
  b.mutable_geometry()->mutable_flat()->set_flat_offset(0);  // a flat shard covering all of it
  b.mutable_geometry()->mutable_flat()->set_numel(100);
  return {Spec("a", "float32", {16, 16}, 0, 0, 1024), b, Spec("c", "int64", {3}, 1, 8, 24)};
}

const LayoutOptions kLayout{.checksum_chunk = 4096, .slot_size = 16384};

TEST_CASE("BuildCapturePlan maps, validates and lays out a registration", "[capture_plan]") {
  std::vector<UniqueFd> fds;
  fds.push_back(MemFd(8192, 1));
  fds.push_back(MemFd(4096, 2));
  MappingCache cache;
  auto plan = BuildCapturePlan(ValidSpecs(), fds, cache, kLayout);
  REQUIRE_OK(plan);
  const CapturePlan& p = **plan;
  REQUIRE(p.tensors.size() == 3);
  CHECK(p.tensors[0].name == "a");
  CHECK(p.tensors[0].dtype.name == "float32");
  CHECK(p.tensors[0].bytes() == 1024);
  CHECK(p.tensors[0].geometry.numel() == 256);
  CHECK(p.tensors[1].name == "b");
  CHECK(p.tensors[1].geometry.kind() == ShardGeometry::Kind::kFlat);
  CHECK(p.tensors[1].bytes() == 200);
  CHECK(p.tensors[2].bytes() == 24);
  CHECK(p.total_bytes == 1024 + 200 + 24);
  CHECK(p.layout.shard_offsets.size() == 3);
  CHECK(p.layout.slot_size == 16384);
  CHECK_FALSE(p.fingerprint.empty());
  CHECK(cache.size() == 2);  // two objects, two mappings

  // The shard memory reads the right bytes of the right object.
  std::vector<std::byte> out(24);
  REQUIRE_OK(p.tensors[2].memory->CopyOut(0, out.data(), 24));
  for (size_t i = 0; i < 24; ++i)
    CHECK(static_cast<int>(out[i]) == static_cast<int>((8 + i + 2) & 0xff));
  REQUIRE_OK(p.tensors[1].memory->CopyOut(10, out.data(), 4));
  for (size_t i = 0; i < 4; ++i) {
    CHECK(static_cast<int>(out[i]) == static_cast<int>((4096 + 10 + i + 1) & 0xff));
  }
  // And loads write straight into the trainer's object.
  const std::byte marker[2] = {std::byte{0xde}, std::byte{0xad}};
  REQUIRE_OK(p.tensors[0].memory->CopyIn(4, marker, 2));
  unsigned char check[2];
  REQUIRE(::pread(fds[0].get(), check, 2, 4) == 2);
  CHECK(check[0] == 0xde);
  CHECK(check[1] == 0xad);
}

TEST_CASE("two tensors in one memfd share one mapping", "[capture_plan]") {
  std::vector<UniqueFd> fds;
  fds.push_back(MemFd(8192, 3));
  fds.push_back(Dup(fds[0]));  // the same object under a second descriptor
  auto specs = ValidSpecs();
  specs[2].mutable_host()->set_fd_index(1);
  MappingCache cache;
  auto plan = BuildCapturePlan(specs, fds, cache, kLayout);
  REQUIRE_OK(plan);
  CHECK(cache.size() == 1);
  // A second registration reuses the mapping.
  auto again = BuildCapturePlan(specs, fds, cache, kLayout);
  REQUIRE_OK(again);
  CHECK(cache.size() == 1);
}

TEST_CASE("an empty registration is a valid, empty plan", "[capture_plan]") {
  MappingCache cache;
  auto plan = BuildCapturePlan({}, {}, cache, kLayout);
  REQUIRE_OK(plan);
  CHECK((*plan)->tensors.empty());
  CHECK((*plan)->total_bytes == 0);
  CHECK((*plan)->layout.file_size == 0);
}

struct Rejection {
  const char* what;
  std::function<void(std::vector<pb::TensorSpec>&)> mutate;
  StatusCode code;
  std::vector<std::string> mentions;
};

TEST_CASE("BuildCapturePlan rejects each invalid spec with a message naming the tensor",
          "[capture_plan]") {
  const std::vector<Rejection> cases = {
      {"unknown dtype",
       [](auto& s) { s[0].set_dtype("float31"); },
       StatusCode::kInvalidArgument,
       {"tensor 'a'", "'float31'"}},
      {"length != numel × size",
       [](auto& s) { s[0].mutable_host()->set_length(1020); },
       StatusCode::kInvalidArgument,
       {"tensor 'a'", "1020", "1024"}},
      {"length of the wrong element size",
       [](auto& s) { s[1].set_dtype("float32"); },
       StatusCode::kInvalidArgument,
       {"tensor 'b'", "400"}},
      {"range past the end of the fd",
       [](auto& s) { s[2].mutable_host()->set_offset(4096 - 16); },
       StatusCode::kOutOfRange,
       {"tensor 'c'", "4096 bytes"}},
      {"offset past the end of the fd",
       [](auto& s) { s[2].mutable_host()->set_offset(1ull << 40); },
       StatusCode::kOutOfRange,
       {"tensor 'c'"}},
      {"offset + length wrapping around",
       [](auto& s) { s[2].mutable_host()->set_offset(~uint64_t{0} - 8); },
       StatusCode::kOutOfRange,
       {"tensor 'c'"}},
      {"duplicate name",
       [](auto& s) { s[2].set_name("a"); },
       StatusCode::kInvalidArgument,
       {"tensor 'a'", "twice"}},
      {"fd index past the descriptors",
       [](auto& s) { s[1].mutable_host()->set_fd_index(2); },
       StatusCode::kInvalidArgument,
       {"tensor 'b'", "descriptor 2", "only 2"}},
      {"box outside the shape",
       [](auto& s) { s[0].mutable_geometry()->mutable_box()->set_offsets(1, 1); },
       StatusCode::kInvalidArgument,
       {"tensor 'a'"}},
      {"box rank != shape rank",
       [](auto& s) { s[0].mutable_geometry()->mutable_box()->add_lengths(1); },
       StatusCode::kInvalidArgument,
       {"tensor 'a'"}},
      {"flat range outside the shape",
       [](auto& s) { s[1].mutable_geometry()->mutable_flat()->set_flat_offset(1); },
       StatusCode::kInvalidArgument,
       {"tensor 'b'"}},
      {"no geometry",
       [](auto& s) { s[2].clear_geometry(); },
       StatusCode::kInvalidArgument,
       {"tensor 'c'"}},
      {"control character in the name",
       [](auto& s) { s[1].set_name("b\x01"); },
       StatusCode::kInvalidArgument,
       {"'b\\x01'"}},
      {"empty name",
       [](auto& s) { s[1].set_name(""); },
       StatusCode::kInvalidArgument,
       {"tensor name is empty"}},
      {"no memory at all",
       [](auto& s) { s[2].clear_host(); },
       StatusCode::kUnimplemented,
       {"tensor 'c'"}},
  };
  for (const Rejection& c : cases) {
    std::vector<UniqueFd> fds;
    fds.push_back(MemFd(8192));
    fds.push_back(MemFd(4096));
    auto specs = ValidSpecs();
    c.mutate(specs);
    MappingCache cache;
    auto plan = BuildCapturePlan(specs, fds, cache, kLayout);
    INFO(c.what << " -> " << plan.status().ToString());
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == c.code);
    for (const auto& text : c.mentions) CHECK_THAT(plan.status().message(), Contains(text));
  }
}

TEST_CASE("BuildCapturePlan rejects an empty or non-regular descriptor, naming the tensor",
          "[capture_plan]") {
  std::vector<UniqueFd> fds;
  fds.push_back(MemFd(8192));
  fds.push_back(MemFd(0));  // empty object
  MappingCache cache;
  auto empty = BuildCapturePlan(ValidSpecs(), fds, cache, kLayout);
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(empty.status().message(), Contains("tensor 'c'"));

  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  UniqueFd write_end(pipe_fds[1]);
  fds[1] = UniqueFd(pipe_fds[0]);
  auto pipe = BuildCapturePlan(ValidSpecs(), fds, cache, kLayout);
  REQUIRE_FALSE(pipe.ok());
  CHECK(pipe.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(pipe.status().message(), Contains("tensor 'c'"));
}

TEST_CASE("BuildCapturePlan passes bad layout options on as an error", "[capture_plan]") {
  std::vector<UniqueFd> fds;
  fds.push_back(MemFd(8192));
  fds.push_back(MemFd(4096));
  MappingCache cache;
  auto plan = BuildCapturePlan(ValidSpecs(), fds, cache,
                               LayoutOptions{.checksum_chunk = 4096, .slot_size = 6000});
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == StatusCode::kInvalidArgument);
}

// Regression: BuildCapturePlan computes numel × element size without an overflow check. A
// float32 tensor of shape [2^62] needs 2^64 bytes, which wraps to 0, so a spec claiming a
// 0-byte host range is accepted as a 2^62-element tensor (the manifest validator has the same
// hole, so the step would even commit).
TEST_CASE("BuildCapturePlan rejects a tensor whose byte size overflows 64 bits", "[capture_plan]") {
  std::vector<UniqueFd> fds;
  fds.push_back(MemFd(4096));
  pb::TensorSpec s;
  s.set_name("huge");
  s.set_dtype("float32");
  s.add_global_shape(1ull << 62);
  s.mutable_geometry()->mutable_flat()->set_flat_offset(0);
  s.mutable_geometry()->mutable_flat()->set_numel(1ull << 62);
  s.mutable_host()->set_fd_index(0);
  s.mutable_host()->set_offset(0);
  s.mutable_host()->set_length(0);  // (2^62 × 4) mod 2^64
  MappingCache cache;
  auto plan = BuildCapturePlan(std::span<const pb::TensorSpec>(&s, 1), fds, cache, kLayout);
  INFO(plan.status().ToString());
  CHECK_FALSE(plan.ok());
}

TEST_CASE("RegistrationFingerprint follows objects, not descriptor numbers", "[capture_plan]") {
  UniqueFd a = MemFd(8192);
  UniqueFd b = MemFd(4096);
  auto specs = ValidSpecs();

  std::vector<UniqueFd> first;
  first.push_back(Dup(a));
  first.push_back(Dup(b));
  auto fp = RegistrationFingerprint(specs, first);
  REQUIRE_OK(fp);

  // The same objects under other descriptor numbers.
  std::vector<UniqueFd> renumbered;
  renumbered.push_back(Dup(a));
  renumbered.push_back(Dup(b));
  REQUIRE(renumbered[0].get() != first[0].get());
  auto same = RegistrationFingerprint(specs, renumbered);
  REQUIRE_OK(same);
  CHECK(*same == *fp);

  // The same objects sent in the other order, with the indices following them.
  std::vector<UniqueFd> swapped;
  swapped.push_back(Dup(b));
  swapped.push_back(Dup(a));
  auto swapped_specs = specs;
  swapped_specs[0].mutable_host()->set_fd_index(1);
  swapped_specs[1].mutable_host()->set_fd_index(1);
  swapped_specs[2].mutable_host()->set_fd_index(0);
  auto swapped_fp = RegistrationFingerprint(swapped_specs, swapped);
  REQUIRE_OK(swapped_fp);
  CHECK(*swapped_fp == *fp);

  // BuildCapturePlan records the same fingerprint.
  MappingCache cache;
  auto plan = BuildCapturePlan(specs, first, cache, kLayout);
  REQUIRE_OK(plan);
  CHECK((*plan)->fingerprint == *fp);
}

TEST_CASE("RegistrationFingerprint changes with the object, its size and the specs",
          "[capture_plan]") {
  UniqueFd a = MemFd(8192);
  UniqueFd b = MemFd(4096);
  const auto specs = ValidSpecs();
  std::vector<UniqueFd> fds;
  fds.push_back(Dup(a));
  fds.push_back(Dup(b));
  auto fp = RegistrationFingerprint(specs, fds);
  REQUIRE_OK(fp);

  // Another object of the same size.
  std::vector<UniqueFd> other;
  other.push_back(MemFd(8192));
  other.push_back(Dup(b));
  auto other_fp = RegistrationFingerprint(specs, other);
  REQUIRE_OK(other_fp);
  CHECK(*other_fp != *fp);

  // A spec that changed.
  auto moved = specs;
  moved[2].mutable_host()->set_offset(16);
  auto moved_fp = RegistrationFingerprint(moved, fds);
  REQUIRE_OK(moved_fp);
  CHECK(*moved_fp != *fp);

  // The same object after the trainer resized it.
  REQUIRE(::ftruncate(a.get(), 16384) == 0);
  auto grown = RegistrationFingerprint(specs, fds);
  REQUIRE_OK(grown);
  CHECK(*grown != *fp);

  // A bad descriptor index is an error naming the tensor.
  auto bad = specs;
  bad[0].mutable_host()->set_fd_index(7);
  auto bad_fp = RegistrationFingerprint(bad, fds);
  REQUIRE_FALSE(bad_fp.ok());
  CHECK(bad_fp.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad_fp.status().message(), Contains("tensor 'a'"));
}

}  // namespace
}  // namespace ckpt
