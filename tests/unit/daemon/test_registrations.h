// Capture plans of float32 tensors in real memfds, for unit tests of what consumes a rank's
// registration (writer plan filter, node manifest builder).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/capture_plan.h"
#include "tests/test_util.h"

namespace ckpt {

class TestRegistrations {
 public:
  explicit TestRegistrations(LayoutOptions layout = {4096, 4096}) : layout_(layout) {}

  // One whole float32 [1024] tensor per name (4 KiB each), in one memfd.
  std::shared_ptr<const CapturePlan> Plan(const std::vector<std::string>& names) {
    UniqueFd fd(::memfd_create("test-registrations", MFD_CLOEXEC));
    REQUIRE(fd);
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(4096 * names.size())) == 0);
    std::vector<ckptd::v1::TensorSpec> specs;
    for (size_t i = 0; i < names.size(); ++i) {
      ckptd::v1::TensorSpec& s = specs.emplace_back();
      s.set_name(names[i]);
      s.set_dtype("float32");
      s.add_global_shape(1024);
      s.mutable_geometry()->mutable_box()->add_offsets(0);
      s.mutable_geometry()->mutable_box()->add_lengths(1024);
      s.mutable_host()->set_fd_index(0);
      s.mutable_host()->set_offset(4096 * i);
      s.mutable_host()->set_length(4096);
    }
    std::vector<UniqueFd> fds;
    fds.push_back(std::move(fd));
    auto plan = BuildCapturePlan(specs, fds, cache_, layout_);
    REQUIRE(plan.ok());
    return *plan;
  }

 private:
  LayoutOptions layout_;
  MappingCache cache_;
};

}  // namespace ckpt
