#include "client/ckptctl/online_commands.h"

#include <cstdio>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include "ckptd/v1/admin.grpc.pb.h"
#include "client/ckptctl/json_writer.h"
#include "common/units.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace ckpt::ctl {

using ckptd::v1::Admin;

constexpr int kExitOk = 0;
constexpr int kExitProblem = 1;

namespace {

// A reply as --json prints it: the proto3 mapping (json_writer.h), one space per level.
std::string ToJson(const google::protobuf::Message& m) { return JsonWriter(1).Proto(m).Take(); }

std::string StateName(ckptd::v1::StepState s) {
  std::string name = ckptd::v1::StepState_Name(s);
  const std::string prefix = "STEP_STATE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

std::string Duration(double seconds) {
  const auto s = static_cast<uint64_t>(seconds);
  std::ostringstream o;
  if (s >= 86400) o << s / 86400 << "d";
  if (s >= 3600) o << (s % 86400) / 3600 << "h";
  if (s >= 60) o << (s % 3600) / 60 << "m";
  o << s % 60 << "s";
  return o.str();
}

std::string Percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%",
                100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

std::string LocalTime(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm = {};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

Result<std::unique_ptr<Admin::Stub>> Connect(const AdminTarget& target) {
  ASSIGN_OR_RETURN(auto channel, OpenAdminChannel(target));
  return Admin::NewStub(channel);
}

int Fail(const std::string& message) {
  std::cerr << "ckptctl: error: " << message << "\n";
  return kExitProblem;
}

void PrintStatusText(const ckptd::v1::GetStatusResponse& s) {
  std::cout << s.role() << " " << s.node_id() << "  version " << s.version() << "  up "
            << Duration(s.uptime_seconds()) << "  "
            << (s.draining()  ? "DRAINING"
                : s.serving() ? "SERVING"
                              : "NOT_SERVING")
            << "\n";
  if (s.has_pool()) {
    const auto& p = s.pool();
    std::cout << "host pool " << FormatBytes(p.total_bytes())
              << (p.pinned() ? " (pinned)" : " (not pinned)") << ": free "
              << FormatBytes(p.free_bytes()) << ", cached " << FormatBytes(p.cached_bytes())
              << ", in use " << FormatBytes(p.in_use_bytes()) << "\n";
  }
  if (s.has_storage()) {
    const auto& st = s.storage();
    std::cout << "storage: " << st.calls_in_flight() << " calls in flight";
    if (st.calls_in_flight() > 0) std::cout << ", oldest " << Duration(st.oldest_call_seconds());
    if (st.stalled()) {
      std::cout << "  STALLED (no answer for over " << Duration(st.stall_timeout_seconds())
                << "): saves that need pool space are skipped";
    }
    std::cout << "\n";
  }
  if (s.has_peer() && (s.peer().pool_bytes() > 0 || s.peer().replicas() > 0)) {
    const auto& p = s.peer();
    std::cout << "peer pool " << FormatBytes(p.pool_bytes()) << ": holds "
              << FormatBytes(p.held_bytes()) << " for other nodes; replicas " << p.replicas();
    if (!p.failure_domain().empty()) std::cout << ", failure domain " << p.failure_domain();
    if (p.replicas() > 0) {
      std::cout << "; held by ";
      if (p.holders_size() == 0) std::cout << "no node yet";
      for (int i = 0; i < p.holders_size(); ++i) {
        std::cout << (i == 0 ? "" : ", ") << p.holders(i);
        if (i < p.holder_addresses_size()) std::cout << " (" << p.holder_addresses(i) << ")";
      }
    }
    std::cout << "\n";
  }
  const bool coordinator = s.role() == "coordinator";
  if (coordinator) {
    std::cout << "\nnodes: " << s.nodes_size() << "\n";
    if (s.nodes_size() > 0) {
      std::cout << "  " << std::left << std::setw(24) << "NODE" << std::setw(28) << "STREAM"
                << std::setw(20) << "EPOCH"
                << "JOBS\n";
      for (const auto& n : s.nodes()) {
        std::string jobs;
        for (const auto& j : n.jobs()) jobs += (jobs.empty() ? "" : ",") + j;
        const std::string stream = n.connected() ? "connected"
                                   : n.lost()    ? "lost (fenced)"
                                                 : "lost in " + Duration(n.lease_left_seconds());
        std::cout << "  " << std::setw(24) << n.node_id() << std::setw(28) << stream
                  << std::setw(20) << n.epoch() << jobs << "\n";
      }
    }
    if (s.writer_plans_size() > 0) {
      std::cout << "\nwriter plans (replicas written once):\n";
      std::cout << "  " << std::left << std::setw(24) << "JOB" << std::setw(14) << "REGISTERED"
                << std::setw(34) << "PLAN"
                << "WRITES\n";
      for (const auto& p : s.writer_plans()) {
        const std::string plan = p.in_force() ? "v" + std::to_string(p.version()) + " in force"
                                              : std::string("none: every rank writes all it holds");
        std::cout << "  " << std::setw(24) << p.job() << std::setw(14)
                  << (std::to_string(p.ranks_registered()) + "/" + std::to_string(p.world_size()))
                  << std::setw(34) << plan
                  << (p.in_force() ? FormatBytes(p.unique_bytes()) + " of " +
                                         FormatBytes(p.registered_bytes())
                                   : std::string("-"))
                  << "\n";
      }
    }
  } else {
    std::cout << "\nclients: " << s.clients_size() << "\n";
  }
  if (s.clients_size() > 0) {
    std::cout << "  " << std::left << std::setw(24) << "JOB" << std::setw(12) << "RANK"
              << std::setw(10) << "PID" << std::setw(8) << "UID"
              << "CONNECTED\n";
    for (const auto& c : s.clients()) {
      std::cout << "  " << std::setw(24) << c.job() << std::setw(12)
                << (std::to_string(c.rank()) + "/" + std::to_string(c.world_size()))
                << std::setw(10) << c.pid() << std::setw(8) << c.uid()
                << Duration(c.connected_seconds()) << "\n";
    }
  }
  std::cout << "\nsteps in flight: " << s.steps_size() << "\n";
  if (s.steps_size() > 0) {
    // A coordinator knows ranks, not bytes: its columns count ranks captured and persisted.
    std::cout << "  " << std::setw(24) << "JOB" << std::setw(10) << "STEP" << std::setw(12)
              << "STATE" << std::setw(8) << "RANKS" << std::setw(22)
              << (coordinator ? "RANKS CAPTURED" : "CAPTURED") << std::setw(22)
              << (coordinator ? "RANKS PERSISTED" : "PERSISTED") << "AGE\n";
    for (const auto& st : s.steps()) {
      uint32_t ranks_captured = 0, ranks_persisted = 0;
      for (const auto& r : st.ranks()) {
        ranks_captured += r.captured() ? 1 : 0;
        ranks_persisted += r.persisted() ? 1 : 0;
      }
      std::cout << "  " << std::setw(24) << st.job() << std::setw(10) << st.step() << std::setw(12)
                << StateName(st.state()) << std::setw(8)
                << (std::to_string(st.ranks_saved()) + "/" + std::to_string(st.world_size()))
                << std::setw(22)
                << (coordinator
                        ? std::to_string(ranks_captured) + "/" + std::to_string(st.world_size())
                        : FormatBytes(st.bytes_captured()) + " " +
                              Percent(st.bytes_captured(), st.bytes_total()))
                << std::setw(22)
                << (coordinator
                        ? std::to_string(ranks_persisted) + "/" + std::to_string(st.world_size())
                        : FormatBytes(st.bytes_persisted()) + " " +
                              Percent(st.bytes_persisted(), st.bytes_total()))
                << Duration(st.age_seconds()) << "\n";
    }
  }
  std::cout << "\nrecent failures: " << s.recent_failures_size() << "\n";
  for (const auto& f : s.recent_failures()) {
    std::cout << "  " << LocalTime(f.unix_time_ms()) << "  job '" << f.job() << "' step "
              << f.step() << " " << StateName(f.state()) << ": " << f.reason() << "\n";
  }
}

}  // namespace

int RunStatus(const AdminTarget& target) {
  auto stub = Connect(target);
  if (!stub.ok()) return Fail(stub.status().ToString());
  ckptd::v1::GetStatusResponse reply;
  auto ctx = ContextWithDeadline(target.timeout);
  grpc::Status st = (*stub)->GetStatus(ctx.get(), {}, &reply);
  if (!st.ok()) return Fail(DescribeRpcError("status", st, target));
  if (target.json) {
    std::cout << ToJson(reply) << "\n";
  } else {
    PrintStatusText(reply);
  }
  return kExitOk;
}

int RunList(const AdminTarget& target, const std::string& job) {
  auto stub = Connect(target);
  if (!stub.ok()) return Fail(stub.status().ToString());
  ckptd::v1::ListCheckpointsRequest request;
  request.set_job(job);
  ckptd::v1::ListCheckpointsResponse reply;
  auto ctx = ContextWithDeadline(target.timeout);
  grpc::Status st = (*stub)->ListCheckpoints(ctx.get(), request, &reply);
  if (!st.ok()) return Fail(DescribeRpcError("list " + job, st, target));
  if (target.json) {
    std::cout << ToJson(reply) << "\n";
    return kExitOk;
  }
  if (reply.steps_size() == 0) {
    std::cout << "job '" << job << "': no committed checkpoints\n";
    return kExitOk;
  }
  std::cout << "job '" << job << "': " << reply.steps_size() << " committed checkpoint"
            << (reply.steps_size() == 1 ? "" : "s") << "\n";
  const std::set<uint64_t> pinned(reply.pinned().begin(), reply.pinned().end());
  for (uint64_t step : reply.steps()) {
    std::cout << "  " << step << (reply.has_latest() && reply.latest() == step ? "  (latest)" : "")
              << (pinned.count(step) != 0 ? "  (pinned)" : "") << "\n";
  }
  return kExitOk;
}

int RunStepOperation(const AdminTarget& target, StepOperation op, const std::string& job,
                     uint64_t step) {
  auto stub = Connect(target);
  if (!stub.ok()) return Fail(stub.status().ToString());
  const char* verb = op == StepOperation::kPin     ? "pin"
                     : op == StepOperation::kUnpin ? "unpin"
                                                   : "delete";
  const std::string what = std::string(verb) + " " + job + " " + std::to_string(step);
  auto ctx = ContextWithDeadline(target.timeout);
  grpc::Status st;
  std::string json;
  std::string done;
  switch (op) {
    case StepOperation::kPin: {
      ckptd::v1::PinCheckpointRequest request;
      request.set_job(job);
      request.set_step(step);
      ckptd::v1::PinCheckpointResponse reply;
      st = (*stub)->PinCheckpoint(ctx.get(), request, &reply);
      json = ToJson(reply);
      done = "pinned: retention keeps it until `ckptctl unpin`";
      break;
    }
    case StepOperation::kUnpin: {
      ckptd::v1::UnpinCheckpointRequest request;
      request.set_job(job);
      request.set_step(step);
      ckptd::v1::UnpinCheckpointResponse reply;
      st = (*stub)->UnpinCheckpoint(ctx.get(), request, &reply);
      json = ToJson(reply);
      done = "unpinned: retention may remove it at the next commit";
      break;
    }
    case StepOperation::kDelete: {
      ckptd::v1::DeleteCheckpointRequest request;
      request.set_job(job);
      request.set_step(step);
      ckptd::v1::DeleteCheckpointResponse reply;
      st = (*stub)->DeleteCheckpoint(ctx.get(), request, &reply);
      json = ToJson(reply);
      done = "deleted (" + reply.path() + ")";
      break;
    }
  }
  if (!st.ok()) return Fail(DescribeRpcError(what, st, target));
  if (target.json) {
    std::cout << json << "\n";
  } else {
    std::cout << "job '" << job << "' step " << step << ": " << done << "\n";
  }
  return kExitOk;
}

int RunReleaseJob(const AdminTarget& target, const std::string& job) {
  auto stub = Connect(target);
  if (!stub.ok()) return Fail(stub.status().ToString());
  ckptd::v1::ReleaseJobRequest request;
  request.set_job(job);
  ckptd::v1::ReleaseJobResponse reply;
  auto ctx = ContextWithDeadline(target.timeout);
  const grpc::Status st = (*stub)->ReleaseJob(ctx.get(), request, &reply);
  if (!st.ok()) return Fail(DescribeRpcError("release-job " + job, st, target));
  if (target.json) {
    std::cout << ToJson(reply) << "\n";
  } else {
    std::cout << "job '" << job << "': released through step " << reply.through_step()
              << "; every node drops its copies in memory\n";
  }
  return kExitOk;
}

int RunDescribe(const AdminTarget& target, const std::string& job, uint64_t step) {
  auto stub = Connect(target);
  if (!stub.ok()) return Fail(stub.status().ToString());
  ckptd::v1::DescribeCheckpointRequest request;
  request.set_job(job);
  request.set_step(step);
  ckptd::v1::DescribeCheckpointResponse reply;
  auto ctx = ContextWithDeadline(target.timeout);
  grpc::Status st = (*stub)->DescribeCheckpoint(ctx.get(), request, &reply);
  if (!st.ok()) {
    return Fail(DescribeRpcError("describe " + job + " " + std::to_string(step), st, target));
  }
  if (target.json) {
    std::cout << ToJson(reply) << "\n";
    return kExitOk;
  }
  const auto& m = reply.manifest();
  uint64_t shards = 0;
  for (const auto& t : m.tensors()) shards += static_cast<uint64_t>(t.shards_size());
  std::cout << "job '" << m.job() << "' step " << m.step() << "  ("
            << (reply.memory_only() ? "memory-only: not on storage" : reply.path()) << ")\n"
            << "world size " << m.world_size() << ", " << m.tensors_size() << " tensors, " << shards
            << " stored shards, " << m.ranks_size() << " ranks\n";
  for (const auto& t : m.tensors()) {
    std::cout << "  " << t.name() << "  " << t.dtype() << " [";
    for (int i = 0; i < t.global_shape_size(); ++i) {
      std::cout << (i ? ", " : "") << t.global_shape(i);
    }
    std::cout << "]  " << t.shards_size() << " shard" << (t.shards_size() == 1 ? "" : "s") << "\n";
  }
  if (reply.memory_only()) {
    // Where each rank's bytes are held now.
    for (const auto& c : reply.copies()) {
      std::cout << "  rank " << c.rank() << " in memory on ";
      if (c.nodes().empty()) std::cout << "no live daemon (not restorable)";
      for (int i = 0; i < c.nodes_size(); ++i) std::cout << (i ? ", " : "") << c.nodes(i);
      std::cout << "\n";
    }
    return kExitOk;
  }
  std::cout << "(ckptctl verify " << reply.path() << " re-reads and checks every byte)\n";
  return kExitOk;
}

int RunHealth(const AdminTarget& target, const std::string& service) {
  auto channel = OpenAdminChannel(target);
  if (!channel.ok()) return Fail(channel.status().ToString());
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse reply;
  auto ctx = ContextWithDeadline(target.timeout);
  grpc::Status st = stub->Check(ctx.get(), request, &reply);
  std::string status =
      st.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(reply.status())
              : "UNREACHABLE";
  const bool serving = st.ok() && reply.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  if (target.json) {
    JsonWriter w;
    w.BeginObject()
        .Field("address", target.address)
        .Field("status", status)
        .Field("serving", serving);
    std::cout << w.EndObject().str() << "\n";
  } else {
    std::cout << status << "\n";
  }
  if (!st.ok()) std::cerr << "ckptctl: " << DescribeRpcError("health", st, target) << "\n";
  return serving ? kExitOk : kExitProblem;
}

}  // namespace ckpt::ctl
