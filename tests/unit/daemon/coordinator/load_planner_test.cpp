// LoadPlanner: the round waits for every rank (or `wait`), then freezes one plan in which each
// byte range that several nodes need is read from storage by exactly one of them (one that has a
// data plane) and fetched by the others; bytes only one node needs stay its own read; bad asks
// are refused; a plan is forgotten keep after it was made. Time is passed explicitly.
#include "daemon/coordinator/load_planner.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace {

using ckptd::v1::FileRange;
using ckptd::v1::LoadPlanRequest;
using ckptd::v1::LoadPlanResponse;
using std::chrono::milliseconds;
using Spans = std::vector<std::pair<uint64_t, uint64_t>>;  // [begin, end), sorted

constexpr uint64_t kMiB = 1ull << 20;
const std::string kFile = "rank-00000.data";

FileRange Range(const std::string& file, uint64_t offset, uint64_t length) {
  FileRange r;
  r.set_file(file);
  r.set_offset(offset);
  r.set_length(length);
  return r;
}

LoadPlanRequest Req(uint32_t rank, uint32_t world, const std::string& node,
                    const std::string& address, const std::vector<FileRange>& needs,
                    const std::string& job = "job") {
  LoadPlanRequest req;
  req.set_job(job);
  req.set_step(7);
  req.set_rank(rank);
  req.set_world_size(world);
  req.set_node_id(node);
  req.set_peer_address(address);
  for (const FileRange& r : needs) *req.add_needs() = r;
  return req;
}

LoadPlanResponse Ok(const Result<LoadPlanResponse>& r) {
  REQUIRE(r.ok());
  return *r;
}

Spans ServeSpans(const LoadPlanResponse& r) {
  Spans out;
  for (const FileRange& s : r.serve()) out.emplace_back(s.offset(), s.offset() + s.length());
  std::sort(out.begin(), out.end());
  return out;
}
Spans FetchSpans(const LoadPlanResponse& r) {
  Spans out;
  for (const auto& f : r.fetch()) {
    out.emplace_back(f.range().offset(), f.range().offset() + f.range().length());
  }
  std::sort(out.begin(), out.end());
  return out;
}
uint64_t Total(const Spans& spans) {
  uint64_t n = 0;
  for (const auto& [b, e] : spans) n += e - b;
  return n;
}
// The spans (any order) cover [begin, end) exactly once: no gap, no overlap, nothing outside.
bool Tiles(Spans spans, uint64_t begin, uint64_t end) {
  std::sort(spans.begin(), spans.end());
  uint64_t at = begin;
  for (const auto& [b, e] : spans) {
    if (b != at || e <= b) return false;
    at = e;
  }
  return at == end;
}
bool Within(const Spans& spans, uint64_t b, uint64_t e) {
  return std::any_of(spans.begin(), spans.end(),
                     [&](const auto& s) { return s.first <= b && e <= s.second; });
}

TEST_CASE("LoadPlanner: data parallel 4 splits the shared file in four", "[load_plan]") {
  LoadPlanner planner;
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  auto ask = [&](uint32_t r, int ms) {
    const std::string n = std::to_string(r);
    return Ok(planner.Ask(Req(r, 4, "n" + n, "h" + n + ":1", {Range(kFile, 0, 64 * kMiB)}),
                          t0 + milliseconds(ms)));
  };
  for (uint32_t r = 0; r < 3; ++r) {
    const LoadPlanResponse wait = ask(r, static_cast<int>(r));
    CHECK_FALSE(wait.ready());
    CHECK(wait.retry_ms() > 0);
  }
  const LoadPlanResponse last = ask(3, 3);
  CHECK(last.ready());
  CHECK(planner.rounds() == 1);

  // Ranks 0-2 ask again (their poll) and hear the frozen plan; rank 3 heard it already.
  std::map<std::string, LoadPlanResponse> answers;  // node → its answer from the frozen plan
  Spans all_served;
  for (uint32_t r = 0; r < 4; ++r) {
    const LoadPlanResponse a = r == 3 ? last : ask(r, 10);
    REQUIRE(a.ready());
    const Spans serve = ServeSpans(a);
    CHECK(Total(serve) == 16 * kMiB);  // the default grain: one 16 MiB piece each
    all_served.insert(all_served.end(), serve.begin(), serve.end());
    answers["n" + std::to_string(r)] = a;
  }
  CHECK(Tiles(all_served, 0, 64 * kMiB));
  for (const auto& [node, a] : answers) {
    INFO(node);
    CHECK(a.fetch_size() == 3);
    CHECK(Total(FetchSpans(a)) == 48 * kMiB);
    Spans mine = ServeSpans(a), fetched = FetchSpans(a);
    mine.insert(mine.end(), fetched.begin(), fetched.end());
    CHECK(Tiles(mine, 0, 64 * kMiB));  // fetches exactly what it does not serve
    for (const auto& f : a.fetch()) {
      CHECK(f.range().file() == kFile);
      CHECK(f.node_id() != node);
      REQUIRE(answers.count(f.node_id()) == 1);
      CHECK(f.peer_address() == "h" + f.node_id().substr(1) + ":1");
      const uint64_t b = f.range().offset();
      CHECK(Within(ServeSpans(answers[f.node_id()]), b, b + f.range().length()));
    }
  }
}

TEST_CASE(
    "LoadPlanner: a file held in memory is fetched from its holders, never read from "
    "storage",
    "[load_plan]") {
  LoadPlanner planner;
  const auto t0 = LoadPlanner::Clock::now();
  const std::string other = "rank-00001.data";
  // kFile is held by h1 and h2 (its node's holders); `other` by nobody.
  const LoadPlanner::MemoryHolders held = {{kFile, {{"h1", "10.0.0.1:1"}, {"h2", "10.0.0.2:1"}}}};
  auto ask = [&](uint32_t r) {
    const std::string n = std::to_string(r);
    return Ok(planner.Ask(Req(r, 2, "n" + n, "n" + n + ":1",
                              {Range(kFile, 0, 64 * kMiB), Range(other, 0, 32 * kMiB)}),
                          t0, [&] { return held; }));
  };
  CHECK_FALSE(ask(0).ready());
  const LoadPlanResponse last = ask(1);
  REQUIRE(last.ready());
  const LoadPlanResponse first = ask(0);
  for (const LoadPlanResponse* a : {&first, &last}) {
    // Nothing of kFile is served (read from storage for the others); all of it is fetched, from
    // both holders in turn.
    std::map<std::string, uint64_t> from;
    Spans held_spans;
    for (const auto& f : a->fetch()) {
      if (f.range().file() != kFile) continue;
      from[f.node_id()] += f.range().length();
      held_spans.emplace_back(f.range().offset(), f.range().offset() + f.range().length());
      CHECK(f.peer_address() == (f.node_id() == "h1" ? "10.0.0.1:1" : "10.0.0.2:1"));
    }
    CHECK(Tiles(held_spans, 0, 64 * kMiB));
    CHECK(from["h1"] == 32 * kMiB);
    CHECK(from["h2"] == 32 * kMiB);
    for (const FileRange& r : a->serve()) CHECK(r.file() == other);
    // A fetch from a holder names the other one as its alternate; one from a node that reads
    // the bytes from storage names none (storage is the loader's fallback).
    for (const auto& f : a->fetch()) {
      INFO(f.ShortDebugString());
      if (f.range().file() != kFile) {
        CHECK(f.alternates_size() == 0);
        continue;
      }
      REQUIRE(f.alternates_size() == 1);
      const std::string other_holder = f.node_id() == "h1" ? "h2" : "h1";
      CHECK(f.alternates(0).node_id() == other_holder);
      CHECK(f.alternates(0).peer_address() == (other_holder == "h1" ? "10.0.0.1:1" : "10.0.0.2:1"));
    }
  }
  // `other` is planned as before: each byte read from storage by one of the two nodes.
  Spans served = ServeSpans(first), also = ServeSpans(last);
  served.insert(served.end(), also.begin(), also.end());
  CHECK(Tiles(served, 0, 32 * kMiB));
}

TEST_CASE(
    "LoadPlanner: a held piece's alternates are the file's other holders, each in turn after the "
    "piece's own",
    "[load_plan]") {
  LoadPlanner planner;
  const std::vector<std::pair<std::string, std::string>> holders = {
      {"h0", "10.0.0.1:1"}, {"h1", "10.0.0.2:1"}, {"h2", "10.0.0.3:1"}};
  const LoadPlanner::MemoryHolders held = {{kFile, holders}};
  const LoadPlanResponse plan =
      Ok(planner.Ask(Req(0, 1, "n0", "n0:1", {Range(kFile, 0, 96 * kMiB)}),
                     LoadPlanner::Clock::now(), [&] { return held; }));
  REQUIRE(plan.ready());
  REQUIRE(plan.fetch_size() == 6);  // six 16 MiB pieces, two from each holder
  for (const auto& f : plan.fetch()) {
    INFO(f.ShortDebugString());
    const auto own = std::find_if(holders.begin(), holders.end(),
                                  [&](const auto& h) { return h.first == f.node_id(); }) -
                     holders.begin();
    REQUIRE(own < 3);
    REQUIRE(f.alternates_size() == 2);
    for (int k = 0; k < 2; ++k) {
      const auto& [node, address] = holders[static_cast<size_t>((own + 1 + k) % 3)];
      CHECK(f.alternates(k).node_id() == node);
      CHECK(f.alternates(k).peer_address() == address);
    }
  }
}

TEST_CASE("LoadPlanner: a range only one node needs stays local", "[load_plan]") {
  LoadPlanner planner;
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  CHECK_FALSE(Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {Range("a.data", 0, kMiB)}), t0)).ready());
  const LoadPlanResponse b =
      Ok(planner.Ask(Req(1, 2, "n1", "h1:1", {Range("b.data", 0, kMiB)}), t0));
  const LoadPlanResponse a =
      Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {Range("a.data", 0, kMiB)}), t0));
  for (const LoadPlanResponse& r : {a, b}) {
    CHECK(r.ready());
    CHECK(r.serve().empty());
    CHECK(r.fetch().empty());
  }
}

TEST_CASE("LoadPlanner: after the wait the ranks that asked plan without the others",
          "[load_plan]") {
  LoadPlanner planner;  // Options{}.wait: 5 s
  const milliseconds wait = LoadPlanner::Options{}.wait;
  REQUIRE(wait == std::chrono::seconds(5));
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const FileRange need = Range(kFile, 0, 64 * kMiB);
  CHECK_FALSE(Ok(planner.Ask(Req(0, 4, "n0", "h0:1", {need}), t0)).ready());
  CHECK_FALSE(Ok(planner.Ask(Req(1, 4, "n1", "h1:1", {need}), t0 + milliseconds(1))).ready());
  CHECK_FALSE(
      Ok(planner.Ask(Req(0, 4, "n0", "h0:1", {need}), t0 + wait - milliseconds(1))).ready());
  const LoadPlanResponse a1 = Ok(planner.Ask(Req(1, 4, "n1", "h1:1", {need}), t0 + wait));
  const LoadPlanResponse a0 = Ok(planner.Ask(Req(0, 4, "n0", "h0:1", {need}), t0 + wait));
  REQUIRE(a0.ready());
  REQUIRE(a1.ready());
  CHECK(Total(ServeSpans(a0)) == 32 * kMiB);
  CHECK(Total(ServeSpans(a1)) == 32 * kMiB);
  Spans both = ServeSpans(a0), s1 = ServeSpans(a1);
  both.insert(both.end(), s1.begin(), s1.end());
  CHECK(Tiles(both, 0, 64 * kMiB));

  // A latecomer on a node the plan does not know fetches everything from n0/n1, serves nothing.
  const LoadPlanResponse late =
      Ok(planner.Ask(Req(2, 4, "n9", "h9:1", {need}), t0 + wait + milliseconds(100)));
  CHECK(late.ready());
  CHECK(late.serve().empty());
  CHECK(Tiles(FetchSpans(late), 0, 64 * kMiB));
  for (const auto& f : late.fetch()) {
    const Spans& from = f.node_id() == "n0" ? ServeSpans(a0) : ServeSpans(a1);
    CHECK((f.node_id() == "n0" || f.node_id() == "n1"));
    CHECK(f.peer_address() == (f.node_id() == "n0" ? "h0:1" : "h1:1"));
    CHECK(Within(from, f.range().offset(), f.range().offset() + f.range().length()));
  }
}

TEST_CASE("LoadPlanner: a node without a data plane never serves", "[load_plan]") {
  LoadPlanner planner;
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const FileRange need = Range(kFile, 0, 64 * kMiB);
  const std::vector<std::pair<std::string, std::string>> nodes = {
      {"n0", "h0:1"}, {"n1", ""}, {"n2", "h2:1"}};
  std::vector<LoadPlanResponse> a;
  for (uint32_t r = 0; r < 3; ++r) {
    a.push_back(Ok(planner.Ask(Req(r, 3, nodes[r].first, nodes[r].second, {need}), t0)));
    CHECK(a.back().ready() == (r == 2));
  }
  for (uint32_t r = 0; r < 2; ++r) {  // the polls of the two that waited
    a[r] = Ok(planner.Ask(Req(r, 3, nodes[r].first, nodes[r].second, {need}), t0));
    REQUIRE(a[r].ready());
  }
  CHECK(a[1].serve().empty());
  CHECK(Tiles(FetchSpans(a[1]), 0, 64 * kMiB));
  for (const auto& f : a[1].fetch()) CHECK((f.node_id() == "n0" || f.node_id() == "n2"));
  Spans served = ServeSpans(a[0]), s2 = ServeSpans(a[2]);
  CHECK(Total(served) == 32 * kMiB);
  CHECK(Total(s2) == 32 * kMiB);
  served.insert(served.end(), s2.begin(), s2.end());
  CHECK(Tiles(served, 0, 64 * kMiB));
  for (int i : {0, 2}) {
    CHECK(Total(FetchSpans(a[i])) == 32 * kMiB);
    for (const auto& f : a[i].fetch()) CHECK(f.node_id() == (i == 0 ? "n2" : "n0"));
  }
}

TEST_CASE("LoadPlanner: partial overlap shares only the overlap", "[load_plan]") {
  LoadPlanner planner;  // grain 16 MiB: no grid cut inside [0, 15) MiB
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const auto r0 = Req(0, 2, "n0", "h0:1", {Range(kFile, 0, 10 * kMiB)});
  const auto r1 = Req(1, 2, "n1", "h1:1", {Range(kFile, 5 * kMiB, 10 * kMiB)});
  CHECK_FALSE(Ok(planner.Ask(r0, t0)).ready());
  const LoadPlanResponse a1 = Ok(planner.Ask(r1, t0));
  const LoadPlanResponse a0 = Ok(planner.Ask(r0, t0));
  REQUIRE(a0.ready());
  REQUIRE(a1.ready());
  const Spans overlap = {{5 * kMiB, 10 * kMiB}};
  const bool n0_serves = !a0.serve().empty();
  const LoadPlanResponse& server = n0_serves ? a0 : a1;
  const LoadPlanResponse& fetcher = n0_serves ? a1 : a0;
  CHECK(ServeSpans(server) == overlap);
  CHECK(server.fetch().empty());
  CHECK(fetcher.serve().empty());
  CHECK(FetchSpans(fetcher) == overlap);
  REQUIRE(fetcher.fetch_size() == 1);
  CHECK(fetcher.fetch(0).node_id() == (n0_serves ? "n0" : "n1"));
}

TEST_CASE("LoadPlanner: bad requests are refused", "[load_plan]") {
  LoadPlanner planner;
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const FileRange good = Range(kFile, 0, kMiB);
  LoadPlanRequest req = Req(0, 2, "n0", "h0:1", {good});
  SECTION("no job") { req.set_job(""); }
  SECTION("no node") { req.set_node_id(""); }
  SECTION("rank outside the world") { req.set_rank(2); }
  SECTION("world size 0") {
    req.set_rank(0);
    req.set_world_size(0);
  }
  SECTION("a zero-length range") { *req.add_needs() = Range(kFile, 4 * kMiB, 0); }
  SECTION("a range without a file") { *req.add_needs() = Range("", 0, kMiB); }
  SECTION("a range whose end overflows") {
    *req.add_needs() = Range(kFile, std::numeric_limits<uint64_t>::max() - 10, 11);
  }
  const auto r = planner.Ask(req, t0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(planner.rounds() == 0);
}

TEST_CASE("LoadPlanner: two ranks on one node read it once themselves", "[load_plan]") {
  LoadPlanner planner;
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const FileRange need = Range(kFile, 0, 64 * kMiB);
  CHECK_FALSE(Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {need}), t0)).ready());
  const LoadPlanResponse a1 = Ok(planner.Ask(Req(1, 2, "n0", "h0:1", {need}), t0));
  const LoadPlanResponse a0 = Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {need}), t0));
  for (const LoadPlanResponse& a : {a0, a1}) {
    CHECK(a.ready());
    CHECK(a.serve().empty());
    CHECK(a.fetch().empty());
  }
}

// The Checkpointer loads a step twice per rank (the model, then the optimizer's state): each
// load is a round of its own, planned over the ranges of that load. A rank whose node already
// holds everything (hot) is counted at once and never waits.
TEST_CASE("LoadPlanner: a rank's next load of the step is the next round, and hot ranks never wait",
          "[load_plan]") {
  LoadPlanner planner;
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const FileRange model = Range(kFile, 0, 32 * kMiB), optim = Range(kFile, 32 * kMiB, 32 * kMiB);
  // Round 1: the model; rank 1 asks last and hears the plan.
  CHECK_FALSE(Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {model}), t0)).ready());
  const LoadPlanResponse r1 = Ok(planner.Ask(Req(1, 2, "n1", "h1:1", {model}), t0));
  REQUIRE(r1.ready());
  CHECK(Total(ServeSpans(r1)) + Total(FetchSpans(r1)) == 32 * kMiB);
  // Rank 1's next load (the optimizer) opens round 2 while rank 0 still polls round 1.
  CHECK_FALSE(Ok(planner.Ask(Req(1, 2, "n1", "h1:1", {optim}), t0)).ready());
  const LoadPlanResponse r0 = Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {model}), t0));
  REQUIRE(r0.ready());
  for (const auto& f : r0.fetch()) CHECK(f.range().offset() + f.range().length() <= 32 * kMiB);
  CHECK(planner.rounds() == 2);
  // Round 2 plans the optimizer's range between the two nodes.
  const LoadPlanResponse o0 = Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {optim}), t0));
  REQUIRE(o0.ready());
  const LoadPlanResponse o1 = Ok(planner.Ask(Req(1, 2, "n1", "h1:1", {optim}), t0));
  REQUIRE(o1.ready());
  Spans served = ServeSpans(o0), s1 = ServeSpans(o1);
  served.insert(served.end(), s1.begin(), s1.end());
  CHECK(Tiles(served, 32 * kMiB, 64 * kMiB));

  // Round 3: rank 0 is hot (nothing to read): answered at once with nothing, and counted, so
  // rank 1 does not wait for it either.
  const LoadPlanResponse hot = Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {}), t0));
  CHECK(hot.ready());
  CHECK(hot.serve().empty());
  CHECK(hot.fetch().empty());
  const LoadPlanResponse cold = Ok(planner.Ask(Req(1, 2, "n1", "h1:1", {model}), t0));
  CHECK(cold.ready());
  CHECK(cold.serve().empty());  // no other node needs it: its own read
  CHECK(cold.fetch().empty());
}

// A restart of the job within `keep` of its last load (new sessions) starts the step's rounds
// afresh, instead of the answered ranks going on to a next round that the others never join.
TEST_CASE("LoadPlanner: a rank asking from a new session starts the step's rounds afresh",
          "[load_plan]") {
  LoadPlanner planner;
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const FileRange need = Range(kFile, 0, 32 * kMiB);
  auto ask = [&](uint32_t rank, const std::string& session) {
    auto req = Req(rank, 2, "n" + std::to_string(rank), "h:1", {need});
    req.set_session(session);
    return Ok(planner.Ask(req, t0));
  };
  CHECK_FALSE(ask(0, "a0").ready());
  const LoadPlanResponse first = ask(1, "a1");
  REQUIRE(first.ready());
  // Rank 1 restarts before rank 0 polled: a new round for both, waiting for rank 0 again.
  CHECK_FALSE(ask(1, "b1").ready());
  CHECK(planner.rounds() == 1);
  const LoadPlanResponse second = ask(0, "b0");
  REQUIRE(second.ready());
  CHECK(second.round() != first.round());
  CHECK(Total(ServeSpans(second)) + Total(FetchSpans(second)) == 32 * kMiB);
}

TEST_CASE("LoadPlanner: a plan is forgotten keep after it was made", "[load_plan]") {
  LoadPlanner::Options options;
  options.keep = std::chrono::seconds(1);
  LoadPlanner planner(options);
  const LoadPlanner::Clock::time_point t0 = LoadPlanner::Clock::now();
  const FileRange need = Range(kFile, 0, kMiB);
  const LoadPlanner::Clock::time_point planned = t0 + milliseconds(20);
  CHECK_FALSE(Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {need}), t0)).ready());
  REQUIRE(Ok(planner.Ask(Req(1, 2, "n1", "h1:1", {need}), planned)).ready());
  // Just before keep: still the frozen plan.
  CHECK(Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {need}), planned + options.keep - milliseconds(1)))
            .ready());
  CHECK(planner.rounds() == 1);
  // At keep, another job's ask drops it: only the new job's round is left.
  CHECK_FALSE(
      Ok(planner.Ask(Req(0, 2, "n0", "h0:1", {need}, "other"), planned + options.keep)).ready());
  CHECK(planner.rounds() == 1);
  // The same job and step start a new round, which waits for the ranks again.
  CHECK_FALSE(Ok(planner.Ask(Req(1, 2, "n1", "h1:1", {need}), planned + options.keep)).ready());
  CHECK(planner.rounds() == 2);
}

// Offsets and lengths are bounded (a request cannot make a plan of 2^40 pieces): a range at the
// top of the uint64 offsets is refused, and a request over 64 TiB or 2^20 ranges too; a range
// near the bound is planned, its grid cut without overflow.
TEST_CASE("LoadPlanner: ranges are bounded, and one near the bound is planned", "[load_plan]") {
  LoadPlanner planner;
  const uint64_t top = std::numeric_limits<uint64_t>::max() - kMiB;
  auto r = planner.Ask(Req(0, 1, "n0", "h0:1", {Range(kFile, top, kMiB)}));
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  r = planner.Ask(Req(0, 1, "n0", "h0:1", {Range(kFile, 0, 65ull << 40)}));
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  r = planner.Ask(Req(0, 1, "n0", "h0:1", {Range("../../etc/passwd", 0, kMiB)}));
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  const uint64_t near = (1ull << 54) - 3 * kMiB;
  const auto ok = planner.Ask(Req(0, 1, "n0", "h0:1", {Range(kFile, near, 2 * kMiB)}));
  REQUIRE(ok.ok());
  CHECK(ok->ready());
  CHECK(ok->serve().empty());
  CHECK(ok->fetch().empty());
}

}  // namespace
}  // namespace ckpt
