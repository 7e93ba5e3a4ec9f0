// Registration by fingerprint (daemon/coordinator/layout_registry.h): N ranks of one layout send
// it once; a registration naming an unknown layout is asked for it, and the others naming it
// meanwhile wait for it; an ask that is not answered in time is asked of a waiting one; a
// layout that does not match its fingerprint is refused; the plan lists what each rank writes.
#include <catch2/catch.hpp>
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "common/atomic_file.h"
#include "common/layout_fingerprint.h"
#include "common/manifest_io.h"
#include "common/step_layout.h"
#include "daemon/coordinator/coordinator_core.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;
using testing::TempDir;

class EventSink final : public NodeSink {
 public:
  void Send(const pb::CoordinatorEvent& e) override {
    std::lock_guard lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  }
  // The first event that `match` accepts, waiting up to 20 s for it.
  template <typename F>
  std::optional<pb::CoordinatorEvent> WaitFor(F match) {
    std::unique_lock lock(mu_);
    std::optional<pb::CoordinatorEvent> out;
    cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      for (const auto& e : events_) {
        if (match(e)) {
          out = e;
          return true;
        }
      }
      return false;
    });
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<pb::CoordinatorEvent> events_;
};

// Rank `rank` of `world`, data-parallel: every rank holds the same two tensors.
pb::ReportRegistrationRequest Full(const std::string& node, uint32_t rank, uint32_t world) {
  pb::ReportRegistrationRequest req;
  req.set_node_id(node);
  req.set_job("j");
  req.set_rank(rank);
  req.set_world_size(world);
  req.set_registration_id(100 + rank);
  for (const char* name : {"a", "b"}) {
    auto* s = req.add_shards();
    s->set_name(name);
    s->set_dtype("float32");
    s->add_global_shape(256);
    auto* box = s->mutable_geometry()->mutable_box();
    box->add_offsets(0);
    box->add_lengths(256);
    s->set_bytes(1024);
  }
  req.set_layout_fingerprint(FingerprintLayout(req.shards()).ToBytes());
  return req;
}

pb::ReportRegistrationRequest Brief(const std::string& node, uint32_t rank, uint32_t world) {
  auto req = Full(node, rank, world);
  req.clear_shards();
  return req;
}

struct Fixture {
  explicit Fixture(std::chrono::milliseconds ask_timeout = std::chrono::seconds(30)) {
    CoordinatorCore::Config c;
    c.storage_root = dir / "root";
    c.layout_ask_timeout = ask_timeout;
    c.on_registration = [this](size_t, size_t layout) {
      std::lock_guard lock(mu);
      layout_bytes += layout;
    };
    core = std::make_unique<CoordinatorCore>(c, PosixFileSystem());
    REQUIRE(core->Start().ok());
    for (const char* node : {"n0", "n1"}) {
      pb::RegisterNodeRequest r;
      r.set_node_id(node);
      r.set_instance("i");
      REQUIRE(core->RegisterNode(r, "inc").ok());
      sinks[node] = std::make_shared<EventSink>();
      REQUIRE(core->AttachNode(node, sinks[node]).ok());
    }
  }
  TempDir dir;
  std::unique_ptr<CoordinatorCore> core;
  std::map<std::string, std::shared_ptr<EventSink>> sinks;
  std::mutex mu;
  size_t layout_bytes = 0;
};

// The plan event for `node` in which every rank listed has its writes.
std::optional<pb::WriterPlan> PlanFor(EventSink& sink, size_t ranks) {
  auto e = sink.WaitFor([&](const pb::CoordinatorEvent& e) {
    return e.has_plan() && static_cast<size_t>(e.plan().ranks_size()) == ranks;
  });
  if (!e) return std::nullopt;
  return e->plan();
}

TEST_CASE("coordinator: N ranks of one layout send it once and share it",
          "[coordinator][registration]") {
  Fixture f;
  auto first = f.core->ReportRegistration(Full("n0", 0, 4));
  REQUIRE(first.ok());
  CHECK_FALSE(first->need_layout());
  const size_t one_layout = f.layout_bytes;
  CHECK(one_layout > 0);
  for (uint32_t r = 1; r < 4; ++r) {
    auto brief = f.core->ReportRegistration(Brief(r < 2 ? "n0" : "n1", r, 4));
    REQUIRE(brief.ok());
    CHECK_FALSE(brief->need_layout());
    CHECK_FALSE(brief->layout_pending());
  }
  CHECK(f.layout_bytes == one_layout);
  CHECK(f.core->TakeSnapshot().layouts_known == 1);

  // The plan says what each rank writes: each tensor once in all, one per node here.
  auto p0 = PlanFor(*f.sinks["n0"], 2);
  auto p1 = PlanFor(*f.sinks["n1"], 2);
  REQUIRE(p0);
  REQUIRE(p1);
  std::map<std::string, int> writers;
  for (const auto* p : {&*p0, &*p1}) {
    for (const auto& r : p->ranks()) {
      CHECK(r.write_listed());
      CHECK(r.skip_size() == 0);
      CHECK(r.registration_id() == 100 + r.rank());
      for (const auto& name : r.write()) ++writers[name];
    }
  }
  CHECK(writers == std::map<std::string, int>{{"a", 1}, {"b", 1}});
  auto plan = f.core->CurrentPlan("j");
  REQUIRE(plan);
  CHECK(plan->distinct_layouts == 1);
  CHECK(plan->registered_bytes == 4 * 2048);
  CHECK(plan->unique_bytes == 2048);
}

TEST_CASE("coordinator: an unknown layout is asked of one registration, the others wait for it",
          "[coordinator][registration]") {
  Fixture f;
  auto asked = f.core->ReportRegistration(Brief("n0", 0, 2));
  REQUIRE(asked.ok());
  CHECK(asked->need_layout());
  auto waits = f.core->ReportRegistration(Brief("n1", 1, 2));
  REQUIRE(waits.ok());
  CHECK_FALSE(waits->need_layout());
  CHECK(waits->layout_pending());
  auto snap = f.core->TakeSnapshot();
  REQUIRE(snap.plans.size() == 1);
  CHECK(snap.plans[0].ranks_waiting == 1);
  CHECK(f.layout_bytes == 0);

  // The asked one answers with its layout: both are registered, and the plan follows.
  auto answer = f.core->ReportRegistration(Full("n0", 0, 2));
  REQUIRE(answer.ok());
  CHECK_FALSE(answer->need_layout());
  CHECK(PlanFor(*f.sinks["n0"], 1));
  CHECK(PlanFor(*f.sinks["n1"], 1));
  CHECK(f.core->TakeSnapshot().plans[0].ranks_waiting == 0);
}

TEST_CASE("coordinator: an ask not answered in time goes to a waiting registration",
          "[coordinator][registration]") {
  Fixture f(std::chrono::milliseconds(500));  // not over between the two calls below
  REQUIRE(f.core->ReportRegistration(Brief("n0", 0, 2))->need_layout());  // n0 never answers
  REQUIRE(f.core->ReportRegistration(Brief("n1", 1, 2))->layout_pending());
  auto ask = f.sinks["n1"]->WaitFor([](const pb::CoordinatorEvent& e) { return e.has_layout(); });
  REQUIRE(ask);
  CHECK(ask->layout().job() == "j");
  CHECK(ask->layout().rank() == 1);
  CHECK(ask->layout().registration_id() == 101);
  CHECK(ask->layout().layout_fingerprint() == Full("n1", 1, 2).layout_fingerprint());
  // n1 answers; n0's rank, asked but silent, is not registered until it registers again.
  REQUIRE(f.core->ReportRegistration(Full("n1", 1, 2)).ok());
  CHECK(f.core->TakeSnapshot().plans[0].ranks_waiting == 0);
  CHECK(f.core->TakeSnapshot().plans[0].ranks_registered == 1);
  auto again = f.core->ReportRegistration(Brief("n0", 0, 2));
  REQUIRE(again.ok());
  CHECK_FALSE(again->need_layout());  // known now
  CHECK(PlanFor(*f.sinks["n0"], 1));
}

TEST_CASE("coordinator: a layout that does not match its fingerprint is refused",
          "[coordinator][registration]") {
  Fixture f;
  auto forged = Full("n0", 0, 2);
  forged.mutable_shards(0)->set_bytes(4096);  // the fingerprint names 1024
  auto st = f.core->ReportRegistration(forged);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.status().message(), Catch::Contains("fingerprint"));
  auto bad = Brief("n0", 0, 2);
  bad.set_layout_fingerprint("short");
  CHECK_FALSE(f.core->ReportRegistration(bad).ok());
  CHECK(f.core->TakeSnapshot().layouts_known == 0);
}

// A node's PERSISTED report with rank `rank` writing `writes` of the layout of Full() and naming
// `registration_id` (unless 0) as the registration it skipped the rest under.
pb::ReportRanksRequest Persisted(const std::string& node, uint32_t rank, uint32_t world,
                                 std::vector<std::string> writes, uint64_t registration_id) {
  pb::ReportRanksRequest req;
  req.set_node_id(node);
  req.set_job("j");
  req.set_step(1);
  req.set_world_size(world);
  req.set_state(pb::STEP_STATE_PERSISTED);
  req.add_ranks(rank);
  auto* m = req.mutable_node_manifest();
  m->set_format_version(kFormatVersion);
  m->set_job("j");
  m->set_step(1);
  m->set_world_size(world);
  m->set_node_id(node);
  uint64_t offset = 0;
  for (const auto& name : writes) {
    auto* t = m->add_tensors();
    t->set_name(name);
    t->set_dtype("float32");
    t->add_global_shape(256);
    auto* s = t->add_shards();
    auto* box = s->mutable_geometry()->mutable_box();
    box->add_offsets(0);
    box->add_lengths(256);
    s->set_file(DataFileName(rank));
    s->set_offset(offset);
    s->set_length(1024);
    s->set_chunk_size(4096);
    s->add_chunk_xxh3(7);
    s->set_writer_rank(rank);
    offset += 4096;
  }
  auto* r = m->add_ranks();
  r->set_rank(rank);
  r->set_node_id(node);
  if (writes.size() < 2 && registration_id != 0) {
    auto* under = m->add_skipped_under();
    under->set_rank(rank);
    under->set_registration_id(registration_id);
    under->set_shards(static_cast<uint32_t>(2 - writes.size()));
  }
  return req;
}

TEST_CASE("coordinator: a rank's skips are checked by its registration's layout, once per layout",
          "[coordinator][registration]") {
  Fixture f;
  REQUIRE(f.core->ReportRegistration(Full("n0", 0, 2)).ok());
  REQUIRE(f.core->ReportRegistration(Brief("n1", 1, 2)).ok());
  REQUIRE(PlanFor(*f.sinks["n0"], 1));
  std::filesystem::create_directories(StepDir(f.dir / "root", "j", 1));
  std::string expect_reason;
  SECTION("each shard one of them skipped was written by the other") {
    REQUIRE(f.core->ReportRanks(Persisted("n0", 0, 2, {"a"}, 100)).ok());
    REQUIRE(f.core->ReportRanks(Persisted("n1", 1, 2, {"b"}, 101)).ok());
  }
  SECTION("both skipped 'b' (a plan changed under the step): failed, not a hole") {
    REQUIRE(f.core->ReportRanks(Persisted("n0", 0, 2, {"a"}, 100)).ok());
    REQUIRE(f.core->ReportRanks(Persisted("n1", 1, 2, {"a"}, 101)).ok());
    expect_reason = "tensor 'b': a rank of the layout of rank ";
  }
  SECTION("skips under a registration the coordinator no longer holds: checked from the file") {
    // Rank 1's trainer registered again since: its node manifest file lists what it skipped.
    const std::string step_dir = StepDir(f.dir / "root", "j", 1);
    auto report = Persisted("n1", 1, 2, {"a"}, 555);
    pb::NodeManifest file = report.node_manifest();
    auto* k = file.add_skipped();
    k->set_name("b");
    k->set_dtype("float32");
    k->add_global_shape(256);
    k->mutable_geometry()->mutable_box()->add_offsets(0);
    k->mutable_geometry()->mutable_box()->add_lengths(256);
    k->set_rank(1);
    std::vector<std::string> n0_writes = {"a", "b"};
    SECTION("another rank wrote it") {}
    SECTION("no rank wrote it") {
      n0_writes = {"a"};  // and names no registration: only rank 1's file says 'b' is missing
      expect_reason = "tensor 'b': rank 1 (node 'n1') left a shard";
    }
    SECTION("the file is missing") {
      file.Clear();
      expect_reason = "checking the shards skipped by ranks of node 'n1'";
    }
    // After a reconnect a node reports a memory-only step again with the lists (it has no
    // file): they settle the rank its first report left unresolved.
    pb::ReportRanksRequest again;
    SECTION("the node reports again, listing them; another rank wrote it") { again = report; }
    SECTION("the node reports again, listing them; no rank wrote it") {
      again = report;
      n0_writes = {"a"};
      expect_reason = "tensor 'b': rank 1 (node 'n1') left a shard";
    }
    if (again.has_node_manifest()) {
      again.mutable_node_manifest()->clear_skipped_under();
      *again.mutable_node_manifest()->add_skipped() = *k;
      REQUIRE(f.core->ReportRanks(report).ok());
      REQUIRE(f.core->ReportRanks(again).ok());
      REQUIRE(f.core->ReportRanks(Persisted("n0", 0, 2, n0_writes, 0)).ok());
    } else {
      if (file.job() == "j") {
        REQUIRE_OK(WriteFileAtomically(PosixFileSystem(),
                                       step_dir + "/" + NodeManifestFileName("n1"),
                                       EncodeNodeManifest(file)));
      }
      REQUIRE(f.core->ReportRanks(Persisted("n0", 0, 2, n0_writes, 0)).ok());
      REQUIRE(f.core->ReportRanks(report).ok());
    }
  }
  auto decided = f.sinks["n0"]->WaitFor([](const pb::CoordinatorEvent& e) {
    return e.has_step() && (e.step().state() == pb::STEP_STATE_COMMITTED ||
                            e.step().state() == pb::STEP_STATE_FAILED);
  });
  REQUIRE(decided);
  INFO(decided->step().reason());
  const bool committed = std::filesystem::exists(StepDir(f.dir / "root", "j", 1) + "/MANIFEST");
  if (expect_reason.empty()) {
    CHECK(decided->step().state() == pb::STEP_STATE_COMMITTED);
    CHECK(committed);
  } else {
    CHECK(decided->step().state() == pb::STEP_STATE_FAILED);
    CHECK_THAT(decided->step().reason(), Catch::Matchers::Contains(expect_reason));
    CHECK_FALSE(committed);
  }
}

}  // namespace
}  // namespace ckpt
