// Node manifests for the coordinator's unit tests: small, valid, and easy to tell apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckptd/v1/manifest.pb.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"

namespace ckpt::testing {

// A valid node manifest: tensor "w" of world_size × 1024 int32, rank r holding row r.
inline ckptd::v1::NodeManifest NodeManifestFor(const std::string& job, uint64_t step,
                                               uint32_t world, const std::string& node,
                                               std::vector<uint32_t> ranks) {
  ckptd::v1::NodeManifest m;
  m.set_format_version(kFormatVersion);
  m.set_job(job);
  m.set_step(step);
  m.set_world_size(world);
  m.set_node_id(node);
  auto* t = m.add_tensors();
  t->set_name("w");
  t->set_dtype("int32");
  t->add_global_shape(world);
  t->add_global_shape(1024);
  for (uint32_t r : ranks) {
    auto* s = t->add_shards();
    auto* box = s->mutable_geometry()->mutable_box();
    box->add_offsets(r);
    box->add_offsets(0);
    box->add_lengths(1);
    box->add_lengths(1024);
    s->set_file(DataFileName(r));
    s->set_offset(0);
    s->set_length(4096);
    s->set_chunk_size(4096);
    s->add_chunk_xxh3(r + 1);
    s->set_writer_rank(r);
    auto* re = m.add_ranks();
    re->set_rank(r);
    re->set_node_id(node);
  }
  return m;
}

}  // namespace ckpt::testing
