// libFuzzer harness: the checkpoint manifest parser (common/manifest_io.h), i.e. what ckptctl,
// the load path and a restarting daemon read back from storage. The input is taken as a MANIFEST
// file and as a node manifest: decode, validate, turn every tensor's shard geometry into a
// ShardGeometry, and merge node manifests. Any crash or sanitizer report is a bug; errors are the
// expected answer to garbage.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ckptd/v1/manifest.pb.h"
#include "common/geometry.h"
#include "common/manifest_io.h"
#include "common/manifest_merge.h"

namespace {

void ExerciseManifest(const ckptd::v1::Manifest& m) {
  if (!ckpt::ValidateManifest(m).ok()) return;
  for (const auto& tensor : m.tensors()) {
    ckpt::Shape shape(tensor.global_shape().begin(), tensor.global_shape().end());
    std::vector<ckpt::ShardGeometry> stored;
    for (const auto& piece : tensor.shards()) {
      auto geometry = ckpt::GeometryFromProto(piece.geometry(), shape);
      if (geometry.ok()) stored.push_back(*geometry);
    }
    (void)ckpt::CheckNoPartialOverlap(tensor.name(), stored);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto manifest = ckpt::DecodeManifest(bytes, "fuzz MANIFEST");
  if (manifest.ok()) {
    ExerciseManifest(*manifest);
    (void)ckpt::EncodeManifest(*manifest);
  }
  auto node = ckpt::DecodeNodeManifest(bytes, "fuzz node manifest");
  if (node.ok()) {
    std::vector<ckptd::v1::NodeManifest> nodes = {*node, *node};
    auto merged = ckpt::MergeNodeManifests(nodes);
    if (merged.ok()) ExerciseManifest(*merged);
  }
  return 0;
}
