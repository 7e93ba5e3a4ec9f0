// LoadService: restores a committed step into a rank's registered memory, in any layout
// (docs/design.md §4).
//
// A load resolves the step (LATEST when none is given), pins it against retention and in the
// hot cache, and asks the CheckpointReader for every registered tensor: the reader intersects
// each requested shard with the stored ones, reads only the pieces it needs, verifies each
// piece's checksum and copies the bytes into the trainer's memory. Pieces resident in the hot
// cache are taken from memory (a restarted trainer restores without touching the PFS); pieces
// read from storage are offered to the cache, so the next local rank asking for the same bytes
// (a data-parallel replica) finds them in memory — each stored byte is read once per node.
// Loads of one step run one at a time so that this holds without racing; loads of different
// steps and jobs run in parallel on the load threads, never on the Asio loop, and never wait
// for saves of other jobs.
#pragma once

#include <boost/asio/io_context.hpp>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_reader.h"
#include "common/mutex.h"
#include "daemon/capture_plan.h"
#include "daemon/coordinator/commit_engine.h"
#include "daemon/hot_cache.h"
#include "daemon/task_pool.h"

namespace ckpt {

class LoadService {
 public:
  struct Config {
    std::string storage_root;
    int threads = 2;
    CheckpointReader::Options reader;
  };
  LoadService(boost::asio::io_context& io, Config config, FileSystem* fs, CommitEngine* commit,
              HotCache* hot);
  ~LoadService();

  void Start();
  void Stop();

  struct Request {
    std::string job;
    std::optional<uint64_t> step;  // nullopt: the newest committed
    bool strict = true;            // a registered tensor missing from the step is an error
    uint32_t rank = 0;
    std::shared_ptr<const CapturePlan> plan;  // the tensors to fill
  };
  struct Outcome {
    uint64_t step = 0;
    std::string extra;
    uint32_t extra_rank = 0;        // whose blob `extra` is (LoadReply.extra_rank)
    uint32_t saved_world_size = 0;  // how many ranks saved the step
    uint64_t bytes_from_memory = 0;
    uint64_t bytes_from_storage = 0;
    std::vector<std::string> missing;
  };
  // Runs the load on a load thread; `done` is posted onto the Asio loop.
  void Load(Request request, std::function<void(Result<Outcome>)> done);

  // Synchronous body of Load (for tests and the load threads).
  Result<Outcome> LoadNow(const Request& request);

 private:
  Result<std::shared_ptr<CheckpointReader>> ReaderFor(const std::string& job, uint64_t step);
  std::shared_ptr<Mutex> StepLock(const std::string& job, uint64_t step);

  boost::asio::io_context& io_;
  Config config_;
  FileSystem* fs_;
  CommitEngine* commit_;
  HotCache* hot_;
  TaskPool pool_;
  Mutex mu_;
  // Recently opened steps (manifest parsed once); bounded.
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<CheckpointReader>> readers_
      GUARDED_BY(mu_);
  // One per step being loaded: loads of one step take turns (read-once per node).
  std::map<std::pair<std::string, uint64_t>, std::weak_ptr<Mutex>> step_locks_ GUARDED_BY(mu_);
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ckpt
