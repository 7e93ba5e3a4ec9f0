// LoadService: restores a committed step — or a memory-only one — into a rank's registered
// memory, in any layout (docs/design.md §4).
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
//
// Across nodes (with a global coordinator, Config::plan_load): before a load reads storage it
// asks the coordinator who reads what (daemon/coordinator/load_planner.h) — the ranges it needs
// and its node does not hold. While the plan waits for the job's other ranks the load holds no
// thread: the question is asked again from a timer on the loop. With the plan, the load (1)
// reads the ranges this node serves into the hot cache, once per node and round of the plan
// (other loads of the round on this node wait for that, and so does the data plane's FETCH of
// each range — from the moment this node heard its plan, or asked for it: WaitStaged), (2)
// fetches the ranges other nodes read over the data plane into the hot cache, one window per
// FETCH, one thread per peer — a peer that fails is not asked again by this load, and what it
// did not deliver is fetched from the range's other holders the plan names (Fetch.alternates),
// in turn; a range this node holds a copy of for another node (its peer pool) is copied from
// there instead, with no network. A window of a range with other holders is checked against
// the manifest before it enters the hot cache (CheckpointReader::VerifyRange: the checksum
// pieces lying whole in it): a bad copy, held here or fetched, is left for the next source like
// a failed fetch, and one in this node's own peer pool is not fetched from this node's own data
// plane either. (3) reads as above, so
// every fetched byte is verified against the manifest like any resident bytes, and whatever did
// not arrive (no source of it answered, a full pool) is read from storage. A failed or absent
// plan is a load as before.
//
// A memory-only step (saved with persist=False) has no MANIFEST: its manifest comes from the
// coordinator (Config::step_manifest), and its bytes only from memory — this node's hot cache,
// or the peers the plan names (the step's holders). Nothing of it is ever read from storage; a
// piece that is on no live daemon fails the load and says so.
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
#include "daemon/coordinator/coordinator_port.h"
#include "daemon/hot_cache.h"
#include "daemon/task_pool.h"

namespace ckpt {

// Bytes of a step's data file from another daemon's data plane (daemon/peer/; main.cc makes
// these from peer::PeerClient). One connection; calls are serialized.
class PeerFetch {
 public:
  virtual ~PeerFetch() = default;
  virtual Status Fetch(const std::string& job, uint64_t step, const std::string& file,
                       uint64_t offset, uint64_t length, std::byte* out) = 0;
};

class LoadService {
 public:
  struct Config {
    std::string storage_root;
    int threads = 2;
    CheckpointReader::Options reader;
    // Cold loads across nodes; null: every load reads what it needs itself.
    // Both set, or the load plans nothing.
    std::function<void(ckptd::v1::LoadPlanRequest, CoordinatorPort::PlanLoadDone)> plan_load;
    std::string node_id;
    std::function<std::string()> peer_address;  // this node's data plane; "" serves nothing
    std::function<std::unique_ptr<PeerFetch>(const std::string& address)> connect_peer;
    // Copies [offset, offset + length) of a step's data file into `out` when this node holds
    // it for another node (its peer pool, daemon/peer/peer_store.h); false when it does not.
    // A planned fetch of such a range is served here instead of over the network. Null: none.
    std::function<bool(const std::string& job, uint64_t step, const std::string& file,
                       uint64_t offset, uint64_t length, std::byte* out)>
        read_held_copy;
    // Longest a FETCH of a step waits for this node to read the ranges it serves.
    std::chrono::milliseconds staging_wait{std::chrono::seconds(30)};
    // The manifest of a memory-only step, from the coordinator; null: such steps do not load.
    std::function<void(const std::string& job, uint64_t step, CoordinatorPort::StepManifestDone)>
        step_manifest;
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
    uint32_t world_size = 0;                  // of the loading job; 0: no plan across nodes
    uint64_t session_id = 0;                  // the trainer's session (a restart has new ones)
    std::shared_ptr<const CapturePlan> plan;  // the tensors to fill
  };
  struct Outcome {
    uint64_t step = 0;
    std::string extra;
    uint32_t extra_rank = 0;        // whose blob `extra` is (LoadReply.extra_rank)
    uint32_t saved_world_size = 0;  // how many ranks saved the step
    uint64_t bytes_from_memory = 0;
    uint64_t bytes_from_storage = 0;  // with a plan, also what this load read for other nodes
    uint64_t bytes_from_peers = 0;
    std::vector<std::string> missing;
  };
  // Runs the load on a load thread; `done` is posted onto the Asio loop.
  void Load(Request request, std::function<void(Result<Outcome>)> done);

  // Synchronous body of Load without a plan across nodes (tests).
  Result<Outcome> LoadNow(const Request& request);

  // Returns once this node holds the region of a step that a load here is planning or staging
  // (the region is read, or all the served ranges are, or the loads ended without staging, or
  // Config::staging_wait passed); at once when no load of the step here asked for a plan. For
  // the data plane's FETCH, from its threads: a fetch waits for the bytes it asks for, not for
  // the whole staging, so fetches overlap the storage reads; and a FETCH that arrives before
  // this node heard its plan (the peer heard first) waits rather than read the bytes a second
  // time.
  void WaitStaged(const std::string& job, uint64_t step, const std::string& file, uint64_t offset,
                  uint64_t length);

 private:
  struct Prepared;
  // One per step that loads here plan: joined when a load asks for its plan, left when it
  // ends, kept after (the last 16 steps) so that a late FETCH finds its round served. A load that
  // hears its plan publishes the round's served ranges here at once (a FETCH of them waits from
  // then on); the first load here of that round reads them.
  struct Staging {
    struct Round {
      std::vector<CheckpointReader::FileRange> ranges;  // in the order they are read
      bool claimed = false;                             // a load here reads them
      // Progress: ranges before `next` are read, and of range `next` the bytes before `at`.
      size_t next = 0;
      uint64_t at = 0;
    };
    Mutex mu;
    CondVar cv;
    int loads GUARDED_BY(mu) = 0;    // loads of the step here that asked and have not ended
    int pending GUARDED_BY(mu) = 0;  // ... and have not heard their plan yet
    std::map<uint64_t, Round> rounds GUARDED_BY(mu);  // LoadPlanResponse.round → its staging
  };
  std::shared_ptr<Staging> JoinStaging(const std::string& job, uint64_t step);
  void LeaveStaging(const std::shared_ptr<Staging>& s, bool heard);
  // The load heard its plan (null: it gave up asking): published before any load stages it.
  static void Heard(Staging& s, const ckptd::v1::LoadPlanResponse* plan);
  // Resolves and pins the step, opens its reader, matches the registered tensors.
  Result<std::shared_ptr<Prepared>> Prepare(const Request& request);
  // On the loop: asks for the plan until it is ready, then finishes on a load thread.
  void AskPlan(std::shared_ptr<Prepared> prepared, ckptd::v1::LoadPlanRequest ask,
               std::function<void(Result<Outcome>)> done);
  // Runs on a load thread and posts the outcome to the loop.
  void Complete(std::shared_ptr<Prepared> prepared,
                std::shared_ptr<const ckptd::v1::LoadPlanResponse> plan,
                std::function<void(Result<Outcome>)> done);
  Result<Outcome> Finish(Prepared& p, const ckptd::v1::LoadPlanResponse* plan);
  // (1) of the plan: the ranges this node serves, read into the hot cache once per round.
  Status Stage(Prepared& p, const ckptd::v1::LoadPlanResponse& plan, uint64_t* bytes_read);
  // (2): the ranges other nodes read, fetched into the hot cache; returns the ranges that arrived.
  std::vector<CheckpointReader::FileRange> FetchFromPeers(Prepared& p,
                                                          const ckptd::v1::LoadPlanResponse& plan);

  // The step's reader: its MANIFEST, or for a memory-only step the coordinator's manifest
  // (`memory_only` set then).
  Result<std::shared_ptr<CheckpointReader>> ReaderFor(const std::string& job, uint64_t step,
                                                      bool* memory_only);
  // Asks the coordinator for a memory-only step's manifest, waiting up to kManifestWait.
  Result<std::shared_ptr<const ckptd::v1::Manifest>> MemoryManifest(const std::string& job,
                                                                    uint64_t step);
  std::shared_ptr<Mutex> StepLock(const std::string& job, uint64_t step);

  boost::asio::io_context& io_;
  Config config_;
  FileSystem* fs_;
  CommitEngine* commit_;
  HotCache* hot_;
  TaskPool pool_;
  Mutex mu_;
  // Recently opened steps (manifest parsed once); bounded.
  struct OpenReader {
    std::shared_ptr<CheckpointReader> reader;
    bool memory_only = false;
  };
  std::map<std::pair<std::string, uint64_t>, OpenReader> readers_ GUARDED_BY(mu_);
  // One per step being loaded: loads of one step take turns (read-once per node).
  std::map<std::pair<std::string, uint64_t>, std::weak_ptr<Mutex>> step_locks_ GUARDED_BY(mu_);
  // Steps whose served ranges this node is reading now.
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<Staging>> staging_ GUARDED_BY(mu_);
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::string instance_;  // random per daemon process: sessions of a restarted daemon differ
};

}  // namespace ckpt
