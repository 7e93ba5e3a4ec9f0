// WriterPlanFilter (daemon/writer_plan_filter.h): a rank applies the coordinator's skips only
// to the registration they were computed from; registrations are reported when they change and
// withdrawn with their trainer; a reconnect drops every skip and reports what the coordinator
// must know again.
#include "daemon/writer_plan_filter.h"

#include <string>
#include <vector>

#include "tests/test_util.h"
#include "tests/unit/daemon/test_registrations.h"

namespace ckpt {
namespace {

namespace pb = ckptd::v1;

constexpr LayoutOptions kLayout{4096, 4096};
using Registrations = TestRegistrations;

// A plan for one rank: the names it skips (as older coordinators send) or, with `write_list`,
// the names it writes.
pb::WriterPlan PlanFor(uint32_t rank, uint64_t registration_id,
                       const std::vector<std::string>& names, bool write_list) {
  pb::WriterPlan plan;
  plan.set_job("job");
  plan.set_version(1);
  auto* r = plan.add_ranks();
  r->set_rank(rank);
  r->set_registration_id(registration_id);
  r->set_write_listed(write_list);
  for (const auto& name : names) {
    if (write_list) {
      r->add_write(name);
    } else {
      r->add_skip(name);
    }
  }
  return plan;
}

pb::WriterPlan PlanSkipping(uint32_t rank, uint64_t registration_id,
                            const std::vector<std::string>& skip) {
  return PlanFor(rank, registration_id, skip, false);
}

pb::WriterPlan PlanWriting(uint32_t rank, uint64_t registration_id,
                           const std::vector<std::string>& write) {
  return PlanFor(rank, registration_id, write, true);
}

std::vector<std::string> Names(const std::vector<RegisteredTensor>& tensors) {
  std::vector<std::string> names;
  for (const auto& t : tensors) names.push_back(t.name);
  return names;
}

TEST_CASE("writer plan filter: a registration is reported once, again only when it changes",
          "[daemon][writer_plan]") {
  Registrations regs;
  uint64_t next_id = 7;
  WriterPlanFilter filter("job", kLayout, &next_id);
  auto plan = regs.Plan({"a", "b"});

  auto first = filter.Register(0, 2, /*session_id=*/1, plan);
  REQUIRE(first.has_value());
  CHECK(first->job() == "job");
  CHECK(first->rank() == 0);
  CHECK(first->world_size() == 2);
  CHECK(first->registration_id() == 7);
  REQUIRE(first->shards_size() == 2);
  CHECK(first->shards(1).name() == "b");
  CHECK(first->shards(1).bytes() == 4096);

  CHECK_FALSE(filter.Register(0, 2, 1, plan).has_value());  // unchanged: nothing to report
  auto new_session = filter.Register(0, 2, 2, plan);        // a restarted trainer
  REQUIRE(new_session.has_value());
  CHECK(new_session->registration_id() == 8);
  auto new_world = filter.Register(0, 4, 2, plan);
  REQUIRE(new_world.has_value());
  CHECK(new_world->registration_id() == 9);
  auto new_tensors = filter.Register(0, 4, 2, regs.Plan({"a"}));
  REQUIRE(new_tensors.has_value());
  CHECK(new_tensors->registration_id() == 10);
}

TEST_CASE("writer plan filter: skips apply only to the registration they were computed from",
          "[daemon][writer_plan]") {
  Registrations regs;
  uint64_t next_id = 1;
  WriterPlanFilter filter("job", kLayout, &next_id);
  auto plan = regs.Plan({"a", "b", "c"});
  auto reg = filter.Register(3, 4, 1, plan);
  REQUIRE(reg.has_value());

  SECTION("without a plan the rank writes everything") {
    auto applied = filter.Apply(3, plan);
    REQUIRE(applied.ok());
    CHECK(*applied == plan);
  }
  SECTION("a plan for this registration leaves the rank a subset with its own layout") {
    auto skipping = PlanSkipping(3, reg->registration_id(), {"b"});
    skipping.set_checks_skipped_under(true);
    filter.OnPlan(skipping);
    auto applied = filter.Apply(3, plan);
    REQUIRE(applied.ok());
    const CapturePlan& subset = **applied;
    CHECK(Names(subset.tensors) == std::vector<std::string>{"a", "c"});
    CHECK(Names(subset.skipped) == std::vector<std::string>{"b"});
    // What the node manifest's reports name instead of listing "b", for this coordinator.
    CHECK(subset.skipped_under == reg->registration_id());
    CHECK(subset.total_bytes == 2 * 4096);
    CHECK(subset.layout.shard_offsets.size() == 2);
    CHECK(subset.fingerprint != plan->fingerprint);
    // Cached: the same object until plan or registration change.
    auto again = filter.Apply(3, plan);
    REQUIRE(again.ok());
    CHECK(*again == *applied);
    CHECK(filter.SkipsOf(3) == std::set<std::string>{"b"});
  }
  SECTION("a plan listing what the rank writes leaves it exactly that, even nothing") {
    filter.OnPlan(PlanWriting(3, reg->registration_id(), {"c", "not-registered"}));
    auto applied = filter.Apply(3, plan);
    REQUIRE(applied.ok());
    CHECK(Names((*applied)->tensors) == std::vector<std::string>{"c"});
    // A coordinator that does not check skips by registration: the reports list them.
    CHECK((*applied)->skipped_under == 0);
    CHECK(Names((*applied)->skipped) == std::vector<std::string>{"a", "b"});
    CHECK(filter.SkipsOf(3) == std::set<std::string>{"a", "b"});
    filter.OnPlan(PlanWriting(3, reg->registration_id(), {}));
    auto nothing = filter.Apply(3, plan);
    REQUIRE(nothing.ok());
    CHECK((*nothing)->tensors.empty());
    CHECK((*nothing)->skipped.size() == 3);
    CHECK((*nothing)->total_bytes == 0);
  }
  SECTION("a plan computed from an earlier registration is not applied") {
    filter.OnPlan(PlanSkipping(3, reg->registration_id(), {"b"}));
    auto restarted = filter.Register(3, 4, /*session_id=*/2, plan);  // the trainer restarted
    REQUIRE(restarted.has_value());
    auto applied = filter.Apply(3, plan);
    REQUIRE(applied.ok());
    CHECK(*applied == plan);
    CHECK(filter.SkipsOf(3).empty());
  }
  SECTION("a plan for another rank leaves this one whole") {
    filter.OnPlan(PlanSkipping(5, reg->registration_id(), {"b"}));
    auto applied = filter.Apply(3, plan);
    REQUIRE(applied.ok());
    CHECK(*applied == plan);
  }
  SECTION("a new plan replaces the previous one") {
    filter.OnPlan(PlanSkipping(3, reg->registration_id(), {"b"}));
    auto before = filter.Apply(3, plan);
    filter.OnPlan(PlanSkipping(3, reg->registration_id(), {"a", "c"}));
    auto after = filter.Apply(3, plan);
    REQUIRE(before.ok());
    REQUIRE(after.ok());
    CHECK(*before != *after);
    CHECK(Names((*after)->tensors) == std::vector<std::string>{"b"});
  }
}

TEST_CASE("writer plan filter: a withdrawn registration is forgotten, a reconnect re-reports",
          "[daemon][writer_plan]") {
  Registrations regs;
  uint64_t next_id = 1;
  WriterPlanFilter filter("job", kLayout, &next_id);
  auto plan = regs.Plan({"a", "b"});
  auto reg0 = filter.Register(0, 2, /*session_id=*/10, plan);
  auto reg1 = filter.Register(1, 2, /*session_id=*/11, plan);
  REQUIRE(reg0.has_value());
  REQUIRE(reg1.has_value());
  filter.OnPlan(PlanSkipping(1, reg1->registration_id(), {"a"}));

  // Another session of rank 0 ending withdraws nothing.
  pb::ReportRegistrationRequest ignored;
  CHECK_FALSE(filter.Withdraw(0, /*session_id=*/99, &ignored));
  CHECK(ignored.registration_id() == 0);

  pb::ReportRegistrationRequest withdrawal;
  withdrawal.set_job("job");
  withdrawal.set_rank(0);
  withdrawal.set_withdrawn(true);
  REQUIRE(filter.Withdraw(0, 10, &withdrawal));
  CHECK(withdrawal.registration_id() == reg0->registration_id());
  CHECK(withdrawal.world_size() == 2);
  filter.RememberWithdrawal(0, withdrawal);
  CHECK(filter.SkipsOf(1) == std::set<std::string>{"a"});

  // The coordinator restarted: skips are gone until it plans again; it hears the withdrawal
  // first, then the registrations still in force.
  auto reports = filter.OnReconnect();
  REQUIRE(reports.size() == 2);
  CHECK(reports[0].withdrawn());
  CHECK(reports[0].registration_id() == reg0->registration_id());
  CHECK_FALSE(reports[1].withdrawn());
  CHECK(reports[1].rank() == 1);
  CHECK(reports[1].registration_id() == reg1->registration_id());
  CHECK(reports[1].shards_size() == 2);
  CHECK(filter.SkipsOf(1).empty());
  auto applied = filter.Apply(1, plan);
  REQUIRE(applied.ok());
  CHECK(*applied == plan);
}

}  // namespace
}  // namespace ckpt
