#include "daemon/coordinator/load_planner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/names.h"

namespace ckpt {

namespace {

using ckptd::v1::FileRange;
using ckptd::v1::LoadPlanRequest;
using ckptd::v1::LoadPlanResponse;

constexpr uint32_t kNoReader = std::numeric_limits<uint32_t>::max();

FileRange MakeRange(const std::string& file, uint64_t begin, uint64_t end) {
  FileRange r;
  r.set_file(file);
  r.set_offset(begin);
  r.set_length(end - begin);
  return r;
}

// What one ask may name: the plan's pieces (at most needed bytes / grain + ranges) stay within
// a few million per rank however hostile the request.
constexpr int kMaxRanges = 1 << 20;
constexpr uint64_t kMaxNeededBytes = 64ull << 40;  // 64 TiB: a rank's whole state, many times

Status CheckRequest(const LoadPlanRequest& req) {
  RETURN_IF_ERROR(ValidateJobName(req.job()), "load plan");
  RETURN_IF_ERROR(ValidateNodeId(req.node_id()), "load plan");
  if (req.world_size() == 0 || req.rank() >= req.world_size()) {
    return InvalidArgument("load plan: rank " + std::to_string(req.rank()) + " of world size " +
                           std::to_string(req.world_size()));
  }
  if (req.needs_size() > kMaxRanges) {
    return InvalidArgument("load plan: " + std::to_string(req.needs_size()) +
                           " ranges, over the limit of " + std::to_string(kMaxRanges));
  }
  uint64_t total = 0;
  for (const FileRange& r : req.needs()) {
    RETURN_IF_ERROR(ValidateDataFileName(r.file()), "load plan");
    if (r.length() == 0 || r.length() > kMaxNeededBytes || r.offset() > kMaxNeededBytes << 8) {
      return InvalidArgument("load plan: bad range of '" + r.file() + "' at " +
                             std::to_string(r.offset()) + " (" + std::to_string(r.length()) +
                             " bytes)");
    }
    total += r.length();  // no overflow: each at most 2^46, at most 2^20 of them
  }
  if (total > kMaxNeededBytes) {
    return InvalidArgument("load plan: " + std::to_string(total) +
                           " bytes asked, over the limit of " + std::to_string(kMaxNeededBytes));
  }
  return Status::Ok();
}

}  // namespace

size_t LoadPlanner::rounds() const {
  MutexLock lock(mu_);
  size_t n = 0;
  for (const auto& [key, list] : rounds_) n += list.size();
  return n;
}

void LoadPlanner::DropExpiredLocked(Clock::time_point now) {
  // A plan once `keep` has passed since it was made; a round never planned once `keep` has
  // passed since its first ask (its ranks stopped asking: the restart died).
  size_t total = 0;
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    std::erase_if(it->second, [&](const Round& r) {
      return r.planned ? now - r.planned_at >= options_.keep : now - r.first_ask >= options_.keep;
    });
    total += it->second.size();
    if (it->second.empty()) read_.erase(it->first);
    it = it->second.empty() ? rounds_.erase(it) : std::next(it);
  }
  while (total > options_.max_rounds) {
    auto oldest =
        std::min_element(rounds_.begin(), rounds_.end(), [](const auto& a, const auto& b) {
          return a.second.front().first_ask < b.second.front().first_ask;
        });
    oldest->second.pop_front();
    if (oldest->second.empty()) {
      read_.erase(oldest->first);
      rounds_.erase(oldest);
    }
    --total;
  }
}

Result<LoadPlanResponse> LoadPlanner::Ask(const LoadPlanRequest& req, Clock::time_point now,
                                          const std::function<MemoryHolders()>& held) {
  RETURN_IF_ERROR(CheckRequest(req));
  MutexLock lock(mu_);
  DropExpiredLocked(now);
  // The rank's round: the first one that has not answered it yet (its first load of the step,
  // or the one it keeps asking while it waits); after all of them, a new one (its next load).
  auto& list = rounds_[{req.job(), req.step()}];
  // A rank asking from a session its rounds did not see it in: the job restarted (within
  // `keep` of its last load); the earlier rounds are not this incarnation's.
  if (std::any_of(list.begin(), list.end(), [&](const Round& r) {
        auto it = r.sessions.find(req.rank());
        return it != r.sessions.end() && it->second != req.session();
      })) {
    list.clear();
    read_.erase({req.job(), req.step()});
  }
  Round* round = nullptr;
  for (Round& r : list) {
    if (!r.answered.contains(req.rank())) {
      round = &r;
      break;
    }
  }
  if (round != nullptr && !round->planned && round->world_size != req.world_size()) {
    *round = Round{};  // a restart of another shape replaces a round that never planned
  } else if (round == nullptr) {
    round = &list.emplace_back();
  }
  if (round->world_size == 0) {
    round->world_size = req.world_size();
    round->first_ask = now;
    round->id = ++next_round_id_;
  }
  round->sessions[req.rank()] = req.session();
  const std::vector<FileRange> needs(req.needs().begin(), req.needs().end());
  if (!round->planned) {
    round->asked[req.rank()] = req.node_id();
    if (needs.empty()) {
      // Nothing to read (its node holds it all): counted, never kept waiting.
      round->answered.insert(req.rank());
      LoadPlanResponse none;
      none.set_ready(true);
      none.set_round(round->id);
      return none;
    }
    NodeNeeds& node = round->needs[req.node_id()];
    node.peer_address = req.peer_address();
    node.by_rank[req.rank()] = needs;
    if (round->asked.size() < round->world_size && now - round->first_ask < options_.wait) {
      LoadPlanResponse wait;
      wait.set_ready(false);
      wait.set_retry_ms(static_cast<uint32_t>(options_.retry.count()));
      return wait;
    }
    MakePlan(*round, read_[{req.job(), req.step()}], held ? held() : MemoryHolders());
    round->planned = true;
    round->planned_at = now;
  }
  round->answered.insert(req.rank());
  return Answer(*round, req.node_id(), needs);
}

void LoadPlanner::MakePlan(Round& round, std::map<std::string, uint64_t>& read,
                           const MemoryHolders& held) const {
  round.nodes.clear();  // a plan that threw (out of memory) left a part behind
  round.addresses.clear();
  round.pieces.clear();
  round.serve.clear();
  round.holders.clear();
  round.held_by.clear();
  // The memory holders of each file, as indices into round.holders.
  auto& held_by = round.held_by;
  for (const auto& [file, holders] : held) {
    for (const auto& h : holders) {
      if (h.second.empty()) continue;  // no data plane: cannot serve
      auto at = std::find(round.holders.begin(), round.holders.end(), h);
      if (at == round.holders.end()) at = round.holders.insert(at, h);
      held_by[file].push_back(static_cast<int32_t>(at - round.holders.begin()));
    }
  }
  // Each node's needs, merged per file.
  std::map<std::string, std::vector<std::pair<uint64_t, std::pair<uint64_t, uint32_t>>>> by_file;
  std::vector<bool> can_serve;
  for (auto& [node, needs] : round.needs) {
    const auto index = static_cast<uint32_t>(round.nodes.size());
    round.nodes.push_back(node);
    round.addresses.push_back(needs.peer_address);
    can_serve.push_back(!needs.peer_address.empty());
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> mine;
    for (const auto& [rank, ranges] : needs.by_rank) {
      for (const FileRange& r : ranges) {
        mine[r.file()].emplace_back(r.offset(), r.offset() + r.length());
      }
    }
    for (auto& [file, spans] : mine) {
      std::sort(spans.begin(), spans.end());
      auto& out = by_file[file];
      for (size_t i = 0; i < spans.size();) {
        uint64_t begin = spans[i].first, end = spans[i].second;
        for (++i; i < spans.size() && spans[i].first <= end; ++i) {
          end = std::max(end, spans[i].second);
        }
        out.push_back({begin, {end, index}});
      }
    }
  }

  // Per file, a sweep over the nodes' interval ends: between two consecutive ends the set of
  // nodes needing the bytes is constant; that span is cut on the grain grid, and each piece goes
  // to the needer with the fewest bytes so far.
  std::vector<uint64_t> assigned(round.nodes.size(), 0);
  for (size_t n = 0; n < round.nodes.size(); ++n) assigned[n] = read[round.nodes[n]];
  for (auto& [file, spans] : by_file) {
    struct Event {
      uint64_t pos;
      bool open;
      uint32_t node;
    };
    std::vector<Event> events;
    events.reserve(spans.size() * 2);
    for (const auto& [begin, rest] : spans) {
      events.push_back({begin, true, rest.second});
      events.push_back({rest.first, false, rest.second});
    }
    std::sort(events.begin(), events.end(),
              [](const Event& a, const Event& b) { return a.pos < b.pos; });
    std::vector<uint32_t> active;  // nodes needing the current span (a node's spans are disjoint)
    auto& pieces = round.pieces[file];
    const auto holders_it = held_by.find(file);
    const std::vector<int32_t>* holders =
        holders_it == held_by.end() ? nullptr : &holders_it->second;
    for (size_t e = 0; e < events.size();) {
      const uint64_t pos = events[e].pos;
      for (; e < events.size() && events[e].pos == pos; ++e) {
        if (events[e].open) {
          active.push_back(events[e].node);
        } else {
          active.erase(std::find(active.begin(), active.end(), events[e].node));
        }
      }
      if (active.empty() || e == events.size()) continue;
      const uint64_t next = events[e].pos;
      for (uint64_t begin = pos; begin < next;) {
        // The next grid line, without overflow near the top of the offset range.
        const uint64_t end =
            begin + std::min(next - begin, options_.grain - begin % options_.grain);
        // Ties go round-robin from a node that depends on the round, so that the small
        // first pieces of successive rounds (model, then optimizer state) do not all land on
        // the same node.
        const auto order = [&](uint32_t n) {
          return (n + round.id) % static_cast<uint64_t>(round.nodes.size());
        };
        uint32_t reader = kNoReader;
        for (uint32_t n : active) {
          if (can_serve[n] && (reader == kNoReader || assigned[n] < assigned[reader] ||
                               (assigned[n] == assigned[reader] && order(n) < order(reader)))) {
            reader = n;
          }
        }
        if (holders != nullptr) {
          // In memory elsewhere: nobody reads it from storage; holders take turns.
          const int32_t holder = (*holders)[pieces.size() % holders->size()];
          pieces.push_back(Piece{begin, end, active.front(), false, holder});
          begin = end;
          continue;
        }
        const bool shared = active.size() > 1 && reader != kNoReader;
        if (reader == kNoReader) reader = active.front();
        assigned[reader] += end - begin;
        pieces.push_back(Piece{begin, end, reader, shared});
        begin = end;
      }
    }
  }
  for (size_t n = 0; n < round.nodes.size(); ++n) read[round.nodes[n]] = assigned[n];
  // What each node reads for the others, merged where it is contiguous: answered per ask.
  round.serve.assign(round.nodes.size(), {});
  for (const auto& [file, pieces] : round.pieces) {
    for (const Piece& p : pieces) {
      if (!p.shared) continue;
      auto& serve = round.serve[p.reader];
      if (!serve.empty() && serve.back().file() == file &&
          serve.back().offset() + serve.back().length() == p.begin) {
        serve.back().set_length(p.end - serve.back().offset());
      } else {
        serve.push_back(MakeRange(file, p.begin, p.end));
      }
    }
  }
  round.needs.clear();  // the plan holds what answers need; the asks are not kept
}

LoadPlanResponse LoadPlanner::Answer(const Round& round, const std::string& node,
                                     const std::vector<FileRange>& needs) const {
  LoadPlanResponse out;
  out.set_ready(true);
  out.set_round(round.id);
  const auto me_it = std::find(round.nodes.begin(), round.nodes.end(), node);
  const uint32_t me =
      me_it == round.nodes.end() ? kNoReader : static_cast<uint32_t>(me_it - round.nodes.begin());
  if (me != kNoReader) {
    for (const FileRange& r : round.serve[me]) *out.add_serve() = r;
  }
  // What this rank fetches: the parts of its needs that another node reads. A node that was
  // part of the plan fetches only shared pieces (an unshared one is its own); a latecomer
  // fetches whatever some node with a data plane read.
  for (const FileRange& need : needs) {
    auto fit = round.pieces.find(need.file());
    if (fit == round.pieces.end()) continue;
    const auto& pieces = fit->second;
    const uint64_t begin = need.offset(), end = need.offset() + need.length();
    auto p = std::upper_bound(pieces.begin(), pieces.end(), begin,
                              [](uint64_t pos, const Piece& piece) { return pos < piece.end; });
    for (; p != pieces.end() && p->begin < end; ++p) {
      if (p->holder >= 0) {
        const auto& [holder_node, holder_address] = round.holders[p->holder];
        auto* f = out.add_fetch();
        *f->mutable_range() =
            MakeRange(need.file(), std::max(begin, p->begin), std::min(end, p->end));
        f->set_node_id(holder_node);
        f->set_peer_address(holder_address);
        // The file's other holders, from the one after this piece's on: a holder that fails
        // leaves its pieces to the next, not all to the same one.
        const auto& all = round.held_by.at(need.file());
        const auto at = std::find(all.begin(), all.end(), p->holder) - all.begin();
        for (size_t k = 1; k < all.size(); ++k) {
          const auto& [node, address] = round.holders[all[(at + k) % all.size()]];
          auto* alternate = f->add_alternates();
          alternate->set_node_id(node);
          alternate->set_peer_address(address);
        }
        continue;
      }
      if (p->reader == me || round.addresses[p->reader].empty()) continue;
      if (me != kNoReader && !p->shared) continue;
      const std::string& reader_node = round.nodes[p->reader];
      auto* f = out.add_fetch();
      *f->mutable_range() =
          MakeRange(need.file(), std::max(begin, p->begin), std::min(end, p->end));
      f->set_node_id(reader_node);
      f->set_peer_address(round.addresses[p->reader]);
    }
  }
  return out;
}

}  // namespace ckpt
