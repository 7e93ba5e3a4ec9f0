// What the node state asks of the peer-memory tier's sender (daemon/peer/replicator.h): one
// rank's data file, by its ranges, to the nodes holding this node's steps. Plain data, so the
// node state needs no data-plane headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {

struct ReplicaHolder {
  std::string node_id;
  std::string address;  // its --peer-listen, host:port
};

struct ReplicationRequest {
  std::string job;
  uint64_t step = 0;
  std::string file;  // the rank's data file name (as in the manifest)
  // Its byte ranges to send, [offset, offset + length): the data layout's slots, each within
  // one hot-cache window.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<ReplicaHolder> holders;
  // What keeps the step in the hot cache until it is sent (HotCache::Keep); the sender releases
  // it on its own thread once the request is done, before answering.
  std::shared_ptr<void> keep;
};

}  // namespace ckpt
