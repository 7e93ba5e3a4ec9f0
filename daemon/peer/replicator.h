// Replicator: the sending side of the peer-memory tier. Copies one rank's captured bytes — its
// data file as the flush engine left it in the hot cache — into the peer pools of the nodes
// that hold this node's steps (the coordinator's HolderAssignment), one PUT per slot of its
// data layout (a hot-cache window, at most 64 MiB), straight from the slot: no copy on this side.
//
// Who calls: the node state, once a rank persisted, with the step kept in the hot cache since
// its save started (HotCache::Keep, in the request: a newer step does not push these bytes out
// before they are sent, but pool pressure may — capture always wins). Each window is copied out
// under a brief pin and sent from that copy, so a window reclaimed meanwhile can never be sent
// as someone else's bytes: the request fails ("no longer in this daemon's memory") instead.
// Work runs on the replicator's own thread, never on the loop; the keep is released there and
// then `done` runs there too, once per request.
//
// Outcome: OK when every holder acknowledged every window (its checksum verified on receipt,
// peer_protocol.h), with the holders' node ids; else the first error, naming the holder and the
// region. A holder's full pool (kResourceExhausted) is an error like any other: the step is
// then not replicated, and the caller says so — nothing is evicted anywhere. Bytes a holder
// took before the failure stay there until the step is dropped; they are not counted as a copy.
//
// Retention: a holder keeps the last `keep_steps` steps of each of this node's files that
// reached it whole, in the order they were sent (a rollback to lower step numbers keeps its new
// copies). Once a step reached a holder whole, this node DROPs (one file, peer_protocol.h) the
// copies sent before the last keep_steps; a holder no longer assigned for the file gets a DROP
// of all of them; a copy that failed halfway is dropped at once (it never counts as one). This
// node's record dies with its process: what a restarted or lost sender left on a holder is the
// holder's own limit per file to reclaim (peer_store.h).
// So a holder's pool never fills with stale steps. A DROP that fails is logged and not retried
// (the holder may be dead; a restarted holder holds nothing).
//
// Holders are tried one after the other, each with a deadline per window (the data plane's
// `--peer-timeout`); the bandwidth cap (`--peer-bandwidth`) paces every PUT, so replication never
// takes the network from training. One connection per holder, kept between requests, reopened
// after a failure.
//
// Thread safety: Replicate from any thread; Start/Stop from one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/hot_cache.h"
#include "daemon/peer/peer_client.h"
#include "daemon/replication_request.h"
#include "daemon/task_pool.h"

namespace ckpt::peer {

class Replicator {
 public:
  struct Config {
    std::chrono::milliseconds timeout{std::chrono::seconds(10)};  // per PUT
    int nice = 0;                                                 // of its thread
    size_t keep_steps = 2;  // newest steps of a file a holder keeps (at least 1)
  };
  using Holder = ReplicaHolder;
  using Request = ReplicationRequest;
  using Done = std::function<void(Status, std::vector<std::string> holders)>;

  // `bandwidth` and `observer` may be null; all must outlive the replicator.
  Replicator(Config config, HotCache* hot, TokenBucket* bandwidth, PeerObserver* observer);
  ~Replicator();

  void Start();
  // Requests still queued are answered kUnavailable; the one running stops at its next window
  // (each PUT has its deadline).
  void Stop();

  void Replicate(Request request, Done done);
  // The coordinator released the job (JobReleased): its holders dropped its steps up to
  // `through_step` themselves, so this node's record of them goes too (later steps stay).
  void ForgetJob(const std::string& job, uint64_t through_step);

 private:
  // `sent_any`: set once a PUT went out (the holder may hold part of the step).
  Status Send(const Request& request, const Holder& holder, bool* sent_any);
  // The request failed on `holder`: whatever it holds of the step is dropped, and forgotten.
  void Forget(const Request& request, const Holder& holder, bool sent_any);
  // `step` of the request's file reached `holder`: drops what that holder keeps beyond the
  // newest keep_steps, and everything of the file on holders the request no longer names.
  void Retain(const Request& request, const Holder& holder);
  void DropOnHolder(const std::string& address, const std::string& job, uint64_t step,
                    const std::string& file);
  PeerClient& ClientFor(const std::string& address);  // on the replicator's thread only

  const Config config_;
  HotCache* const hot_;
  TokenBucket* const bandwidth_;
  PeerObserver* const observer_;
  std::map<std::string, std::unique_ptr<PeerClient>> clients_;  // by address; its thread only
  // (job, file) → holder address → the steps of it sent there whole and not dropped, in the
  // order they were sent; its thread only.
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::deque<uint64_t>>> sent_;
  std::vector<std::byte> buffer_;  // one window copied out of the hot cache; its thread only
  std::atomic<bool> stopping_{false};
  TaskPool thread_;
};

}  // namespace ckpt::peer
