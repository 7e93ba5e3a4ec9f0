// ckptctl watch: follows a WatchEvents stream. State changes print one line each; progress
// samples become a progress line per step with the rate over the last sample and an ETA for
// the remaining bytes of the slower of capture and persist. On a terminal the progress line is
// redrawn in place; otherwise (a pipe, a log) every sample is its own line. --json prints each
// event as one JSON object per line.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include "ckptd/v1/admin.grpc.pb.h"
#include "client/ckptctl/json_writer.h"
#include "client/ckptctl/online_commands.h"
#include "common/units.h"

namespace ckpt::ctl {
namespace {

struct Sample {
  std::chrono::steady_clock::time_point at;
  uint64_t captured = 0;
  uint64_t persisted = 0;
};

std::string Bar(uint64_t done, uint64_t total, int width) {
  const int filled =
      total == 0 ? 0
                 : static_cast<int>(static_cast<double>(done) * width / static_cast<double>(total));
  return "[" + std::string(static_cast<size_t>(std::min(filled, width)), '#') +
         std::string(static_cast<size_t>(width - std::min(filled, width)), '.') + "]";
}

// "1.2 GiB/s ETA 3s" from two samples of the same step.
std::string RateAndEta(const Sample& prev, const Sample& now, uint64_t total) {
  const double dt = std::chrono::duration<double>(now.at - prev.at).count();
  if (dt <= 0 || now.persisted < prev.persisted) return "";
  const double rate = static_cast<double>(now.persisted - prev.persisted) / dt;
  std::string out = FormatBytes(static_cast<uint64_t>(rate)) + "/s";
  if (rate > 0 && total > now.persisted) {
    out += " ETA " +
           std::to_string(
               static_cast<uint64_t>(static_cast<double>(total - now.persisted) / rate + 0.5)) +
           "s";
  }
  return out;
}

}  // namespace

int RunWatch(const AdminTarget& target, const WatchOptions& options) {
  auto channel = OpenAdminChannel(target);
  if (!channel.ok()) {
    std::cerr << "ckptctl: error: " << channel.status().ToString() << "\n";
    return 1;
  }
  auto stub = ckptd::v1::Admin::NewStub(*channel);
  ckptd::v1::WatchEventsRequest request;
  request.set_job(options.job);
  request.set_progress_interval_ms(options.progress_interval_ms);
  grpc::ClientContext ctx;  // no deadline: a watch lasts until interrupted
  auto reader = stub->WatchEvents(&ctx, request);
  const bool tty = !target.json && ::isatty(STDOUT_FILENO) == 1;
  std::map<std::pair<std::string, uint64_t>, Sample> last;
  bool progress_line_open = false;
  uint64_t events = 0;
  ckptd::v1::WatchEventsResponse e;
  while (reader->Read(&e)) {
    ++events;
    if (target.json) {
      // One compact object per line, flushed per event: consumers read it live.
      std::cout << JsonWriter().Proto(e).str() << std::endl;
    } else if (e.has_state_change()) {
      const auto& c = e.state_change();
      if (progress_line_open) std::cout << "\n";
      progress_line_open = false;
      std::cout << "job '" << c.job() << "' step " << c.step() << ": "
                << ckptd::v1::StepState_Name(c.state()).substr(11)
                << (c.reason().empty() ? "" : " (" + c.reason() + ")") << std::endl;
      if (c.state() >= ckptd::v1::STEP_STATE_COMMITTED) last.erase({c.job(), c.step()});
    } else if (e.has_progress()) {
      const auto& p = e.progress();
      const Sample now{std::chrono::steady_clock::now(), p.bytes_captured(), p.bytes_persisted()};
      auto it = last.find({p.job(), p.step()});
      const std::string rate =
          it == last.end() ? std::string() : RateAndEta(it->second, now, p.bytes_total());
      last[{p.job(), p.step()}] = now;
      // A coordinator sends ranks without bytes: its bars count ranks captured / persisted.
      uint64_t done_captured = p.bytes_captured(), done_persisted = p.bytes_persisted();
      uint64_t total = p.bytes_total();
      if (total == 0 && p.ranks_size() > 0) {
        done_captured = done_persisted = 0;
        total = p.world_size();
        for (const auto& r : p.ranks()) {
          done_captured += r.captured() ? 1 : 0;
          done_persisted += r.persisted() ? 1 : 0;
        }
      }
      const bool by_rank = total != p.bytes_total();
      std::cout << (tty ? "\r" : "") << "job '" << p.job() << "' step " << p.step() << " "
                << ckptd::v1::StepState_Name(p.state()).substr(11) << " " << p.ranks_saved() << "/"
                << p.world_size() << " ranks  captured " << Bar(done_captured, total, 20)
                << " persisted " << Bar(done_persisted, total, 20) << " "
                << (by_rank ? std::to_string(done_persisted) + "/" + std::to_string(total) +
                                  " ranks persisted"
                            : FormatBytes(p.bytes_persisted()) + "/" + FormatBytes(p.bytes_total()))
                << (rate.empty() || by_rank ? "" : "  " + rate) << (tty ? "\033[K" : "\n")
                << std::flush;
      progress_line_open = tty;
    }
    if (options.max_events != 0 && events >= options.max_events) {
      ctx.TryCancel();
      break;
    }
  }
  if (progress_line_open) std::cout << "\n";
  grpc::Status st = reader->Finish();
  if (options.max_events != 0 && events >= options.max_events) return 0;
  if (!st.ok()) {
    std::cerr << "ckptctl: error: " << DescribeRpcError("watch", st, target) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace ckpt::ctl
