#include "daemon/coordinator/load_planner.h"

#include <algorithm>
#include <limits>
#include <utility>

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

Status CheckRequest(const LoadPlanRequest& req) {
  if (req.job().empty() || req.node_id().empty()) {
    return InvalidArgument("load plan: the request names no job or no node");
  }
  if (req.world_size() == 0 || req.rank() >= req.world_size()) {
    return InvalidArgument("load plan: rank " + std::to_string(req.rank()) + " of world size " +
                           std::to_string(req.world_size()));
  }
  for (const FileRange& r : req.needs()) {
    if (r.file().empty() || r.length() == 0 ||
        r.offset() > std::numeric_limits<uint64_t>::max() - r.length()) {
      return InvalidArgument("load plan: bad range of '" + r.file() + "' at " +
                             std::to_string(r.offset()) + " (" + std::to_string(r.length()) +
                             " bytes)");
    }
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
  // A plan once `keep` has passed; a round never planned (nobody asked since the first ask,
  // past `wait`: its restart died) as well, so that the next restart starts afresh.
  size_t total = 0;
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    std::erase_if(it->second, [&](const Round& r) {
      return r.planned ? now - r.planned_at >= options_.keep : now - r.first_ask >= options_.keep;
    });
    total += it->second.size();
    it = it->second.empty() ? rounds_.erase(it) : std::next(it);
  }
  while (total > options_.max_rounds) {
    auto oldest =
        std::min_element(rounds_.begin(), rounds_.end(), [](const auto& a, const auto& b) {
          return a.second.front().first_ask < b.second.front().first_ask;
        });
    oldest->second.pop_front();
    if (oldest->second.empty()) rounds_.erase(oldest);
    --total;
  }
}

Result<LoadPlanResponse> LoadPlanner::Ask(const LoadPlanRequest& req, Clock::time_point now) {
  RETURN_IF_ERROR(CheckRequest(req));
  MutexLock lock(mu_);
  DropExpiredLocked(now);
  // The rank's round: the first one that has not answered it yet (its first load of the step,
  // or the one it keeps asking while it waits); after all of them, a new one (its next load).
  auto& list = rounds_[{req.job(), req.step()}];
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
  }
  const std::vector<FileRange> needs(req.needs().begin(), req.needs().end());
  if (!round->planned) {
    round->asked[req.rank()] = req.node_id();
    if (needs.empty()) {
      // Nothing to read (its node holds it all): counted, never kept waiting.
      round->answered.insert(req.rank());
      LoadPlanResponse none;
      none.set_ready(true);
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
    MakePlan(*round);
    round->planned = true;
    round->planned_at = now;
  }
  round->answered.insert(req.rank());
  return Answer(*round, req.node_id(), needs);
}

void LoadPlanner::MakePlan(Round& round) const {
  round.nodes.clear();  // a plan that threw (out of memory) left a part behind
  round.addresses.clear();
  round.pieces.clear();
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
        uint32_t reader = kNoReader;
        for (uint32_t n : active) {
          if (can_serve[n] && (reader == kNoReader || assigned[n] < assigned[reader] ||
                               (assigned[n] == assigned[reader] && n < reader))) {
            reader = n;
          }
        }
        const bool shared = active.size() > 1 && reader != kNoReader;
        if (reader == kNoReader) reader = active.front();
        assigned[reader] += end - begin;
        pieces.push_back(Piece{begin, end, reader, shared});
        begin = end;
      }
    }
  }
  round.needs.clear();  // the plan holds what answers need; the asks are not kept
}

LoadPlanResponse LoadPlanner::Answer(const Round& round, const std::string& node,
                                     const std::vector<FileRange>& needs) const {
  LoadPlanResponse out;
  out.set_ready(true);
  const auto me_it = std::find(round.nodes.begin(), round.nodes.end(), node);
  const uint32_t me =
      me_it == round.nodes.end() ? kNoReader : static_cast<uint32_t>(me_it - round.nodes.begin());
  // What this node reads for the others, merged where it is contiguous.
  if (me != kNoReader) {
    for (const auto& [file, pieces] : round.pieces) {
      for (const Piece& p : pieces) {
        if (p.reader != me || !p.shared) continue;
        auto* serve = out.mutable_serve();
        if (!serve->empty() && serve->rbegin()->file() == file &&
            serve->rbegin()->offset() + serve->rbegin()->length() == p.begin) {
          serve->rbegin()->set_length(p.end - serve->rbegin()->offset());
        } else {
          *serve->Add() = MakeRange(file, p.begin, p.end);
        }
      }
    }
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
