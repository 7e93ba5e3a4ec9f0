// ckpt_chaos_trainer: one rank of the job the chaos tests (chaos_*_test.cpp) drive and kill.
//
// Unlike ckpt_example_trainer it never gives up: a failed step is reported and training goes
// on, and when the daemon goes away (a chaos kill) it reconnects on its next step, as a trainer
// that must not need a restart when only the daemon died. Steps are driven by the test, one
// line per command on stdin, so that all ranks save the same step (a training loop's
// collectives keep real ranks in step the same way):
//   "save N"  → fill the tensors with step N's values (trainer_data.h), Save(N), WaitSnapshot,
//               Wait(N, committed); reply "done N ok" or "done N err <code> <message>". When the
//               daemon went away it re-attaches before replying (one Latest call).
// EOF on stdin ends the process with status 0. Replies go to descriptor 3, one line each; logs
// to stderr.
//   "reconnect" → a re-attach (a new client if it has none), after the test restarted the
//               daemon: a trainer learns from its failed calls that the daemon went away, one
//               idle at the moment of the kill from this; reply "reconnected ok|err ...".
// At start it connects, registers and restores like a restarted rank: Load(latest)
// and a check that every byte and the extra blob equal what that step saved; reply
// "ready loaded=<step|none> ok" or "ready loaded=<step> err <message>".
//
// Flags: --socket --job --rank --world-size --bytes-per-rank --tensors --seed --timeout-ms.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "client/examples/trainer_data.h"
#include "common/status.h"

namespace {

using std::chrono::milliseconds;

struct Flags {
  std::string socket;
  std::string job = "chaos";
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t bytes_per_rank = 1 << 20;
  uint32_t tensors = 2;
  uint64_t seed = 1;
  int64_t timeout_ms = 60000;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    if (key == "--socket") {
      f->socket = value;
    } else if (key == "--job") {
      f->job = value;
    } else if (key == "--rank") {
      f->rank = static_cast<uint32_t>(std::stoul(value));
    } else if (key == "--world-size") {
      f->world_size = static_cast<uint32_t>(std::stoul(value));
    } else if (key == "--bytes-per-rank") {
      f->bytes_per_rank = std::stoull(value);
    } else if (key == "--tensors") {
      f->tensors = static_cast<uint32_t>(std::stoul(value));
    } else if (key == "--seed") {
      f->seed = std::stoull(value);
    } else if (key == "--timeout-ms") {
      f->timeout_ms = std::stoll(value);
    } else {
      std::cerr << "ckpt_chaos_trainer: unknown flag " << key << "\n";
      return false;
    }
  }
  return !f->socket.empty();
}

std::string Extra(uint64_t seed, uint64_t step, uint32_t rank) {
  return "seed=" + std::to_string(seed) + " step=" + std::to_string(step) +
         " rank=" + std::to_string(rank);
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

class ChaosRank {
 public:
  explicit ChaosRank(Flags flags)
      : flags_(std::move(flags)),
        layout_(ckpt::example::MakeTrainerLayout(flags_.bytes_per_rank, flags_.tensors,
                                                 flags_.world_size)) {}

  ckpt::Status Init() {
    fd_ = ::memfd_create("chaos_trainer", MFD_CLOEXEC);
    if (fd_ < 0) return ckpt::ErrnoStatus(errno, "memfd_create");
    if (::ftruncate(fd_, static_cast<off_t>(layout_.memfd_bytes)) != 0) {
      return ckpt::ErrnoStatus(errno, "ftruncate memfd");
    }
    void* p = ::mmap(nullptr, layout_.memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return ckpt::ErrnoStatus(errno, "mmap memfd");
    base_ = static_cast<char*>(p);
    return Reconnect();
  }

  // "ready ..." after the restore at start.
  std::string Restore() {
    auto latest = client_->Latest();
    if (!latest.ok()) return "ready loaded=? err " + OneLine(latest.status().ToString());
    if (!latest->has_value()) return "ready loaded=none ok";
    const uint64_t step = **latest;
    std::memset(base_, 0xA5, layout_.memfd_bytes);
    auto loaded = client_->Load(step);
    const std::string head = "ready loaded=" + std::to_string(step);
    if (!loaded.ok()) return head + " err " + OneLine(loaded.status().ToString());
    if (loaded->extra != Extra(flags_.seed, step, flags_.rank)) {
      return head + " err extra blob '" + OneLine(loaded->extra) + "'";
    }
    std::vector<uint32_t> expected;
    for (uint32_t t = 0; t < layout_.tensors.size(); ++t) {
      const auto& tensor = layout_.tensors[t];
      const uint64_t n = tensor.rows * tensor.cols;
      expected.resize(n);
      ckpt::example::FillShard(expected.data(), n, flags_.seed, flags_.rank, step, t);
      if (std::memcmp(expected.data(), base_ + tensor.fd_offset, n * 4) != 0) {
        return head + " err tensor " + tensor.name + " differs from what step " +
               std::to_string(step) + " saved";
      }
    }
    return head + " ok";
  }

  // The same client re-attaches by itself on its next call; a new one when it has none yet.
  std::string ReconnectNow() {
    ckpt::Status s = client_ == nullptr ? Reconnect() : client_->Latest().status();
    if (!s.ok()) return "reconnected err " + Describe(s);
    return "reconnected ok";
  }

  std::string SaveStep(uint64_t step) {
    const std::string head = "done " + std::to_string(step);
    if (client_ == nullptr) {
      if (ckpt::Status s = Reconnect(); !s.ok()) return head + " err " + Describe(s);
    }
    for (uint32_t t = 0; t < layout_.tensors.size(); ++t) {
      const auto& tensor = layout_.tensors[t];
      ckpt::example::FillShard(reinterpret_cast<uint32_t*>(base_ + tensor.fd_offset),
                               tensor.rows * tensor.cols, flags_.seed, flags_.rank, step, t);
    }
    const milliseconds timeout(flags_.timeout_ms);
    ckpt::Status s = client_->Save(step, Extra(flags_.seed, step, flags_.rank));
    if (s.ok()) s = client_->WaitSnapshot(timeout);
    if (s.ok()) s = client_->Wait(step, ckpt::WaitState::kCommitted, timeout);
    if (s.ok()) return head + " ok";
    if (s.code() == ckpt::StatusCode::kUnavailable) {
      // The daemon went away with this step. Like a training loop that goes on, the client
      // re-attaches at once (any call does): its hello tells the new daemon that this rank's save
      // of the step was lost, so ranks that saved it there learn it can never commit.
      (void)client_->Latest();
    }
    return head + " err " + Describe(s);
  }

 private:
  static std::string Describe(const ckpt::Status& s) {
    return std::string(ckpt::StatusCodeName(s.code())) + " " + OneLine(s.message());
  }

  ckpt::Status Reconnect() {  // public through ReconnectNow
    client_.reset();
    ckpt::ClientOptions o;
    o.socket = flags_.socket;
    o.job = flags_.job;
    o.rank = flags_.rank;
    o.world_size = flags_.world_size;
    o.local_rank = flags_.rank;
    o.connect_timeout = milliseconds(flags_.timeout_ms);
    ASSIGN_OR_RETURN(std::unique_ptr<ckpt::Client> client, ckpt::Client::Connect(o));
    std::vector<ckpt::HostTensor> specs;
    for (const auto& t : layout_.tensors) {
      ckpt::HostTensor h;
      h.name = t.name;
      h.dtype = "int32";
      h.global_shape = layout_.GlobalShape(t);
      h.offsets = {uint64_t{flags_.rank} * t.rows, 0};
      h.lengths = {t.rows, t.cols};
      h.fd = fd_;
      h.fd_offset = t.fd_offset;
      h.nbytes = t.nbytes;
      specs.push_back(std::move(h));
    }
    RETURN_IF_ERROR(client->Register(specs));
    client_ = std::move(client);
    return ckpt::Status::Ok();
  }

  Flags flags_;
  ckpt::example::TrainerLayout layout_;
  int fd_ = -1;
  char* base_ = nullptr;
  std::unique_ptr<ckpt::Client> client_;
};

// Every reply is logged too: the test shows a trainer's log when an assertion fails.
void Reply(const std::string& line) {
  std::cerr << "reply: " << line << std::endl;
  const std::string out = line + "\n";
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(3, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) std::_Exit(5);  // the test is gone
    done += static_cast<size_t>(n);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::cerr << "usage: ckpt_chaos_trainer --socket PATH [--job J --rank R --world-size W "
                 "--bytes-per-rank B --tensors T --seed S --timeout-ms MS]\n";
    return 2;
  }
  ChaosRank rank(flags);
  if (ckpt::Status s = rank.Init(); !s.ok()) {
    Reply("ready loaded=? err " + OneLine(s.ToString()));
    return 1;
  }
  Reply(rank.Restore());
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::string command;
    uint64_t step = 0;
    in >> command >> step;
    if (command == "save" && step > 0) {
      Reply(rank.SaveStep(step));
    } else if (command == "reconnect") {
      Reply(rank.ReconnectNow());
    } else {
      Reply("error unknown command '" + OneLine(line) + "'");
    }
  }
  return 0;
}
