// The daemon-to-daemon data plane between real ckptd processes (daemon/peer/): a daemon started
// with --peer-listen 127.0.0.1:0 serves a step it saved to another node's PeerClient bit-exact;
// a second daemon holds regions PUT to it in its --peer-pool (its own storage never sees them),
// refuses what does not fit without evicting, survives hostile frames, and a holder killed
// mid-transfer fails the fetch at once instead of hanging it.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include "tests/integration/admin_client.h"
#include "tests/integration/http_scrape.h"

#include <atomic>
#include <future>

#include "daemon/peer/peer_client.h"
#include "daemon/peer/peer_observer.h"

namespace ckpt::itest {
namespace {

using peer::PeerClient;
using peer::Region;

// An address the daemon bound, as an operator finds it: `key` in its admin status.
std::string BoundAddress(const DaemonProcess& d, const std::string& key) {
  auto admin = ckptd::v1::Admin::NewStub(
      grpc::CreateChannel("unix:" + d.admin_socket(), grpc::InsecureChannelCredentials()));
  const std::string bound = ConfigValue(GetStatus(*admin), key);
  REQUIRE_THAT(bound, Catch::StartsWith("127.0.0.1:"));
  return bound;
}

std::string PeerAddress(const DaemonProcess& d) { return BoundAddress(d, "peer-bound"); }

std::unique_ptr<DaemonProcess> StartPeerDaemon(const testing::TempDir& dir,
                                               std::vector<std::string> extra = {}) {
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--peer-listen", "127.0.0.1:0"};
  options.flags.insert(options.flags.end(), extra.begin(), extra.end());
  return std::make_unique<DaemonProcess>(options);
}

class CountingObserver final : public peer::PeerObserver {
 public:
  void OnPeerBytes(peer::Direction d, uint64_t bytes) override {
    if (d == peer::Direction::kReceived) received += bytes;
  }
  void OnPeerFailure(std::string_view) override {}
  std::atomic<uint64_t> received{0};
};

TEST_CASE("peer data plane: two daemons, a saved step fetched and held bit-exact",
          "[peer][daemon]") {
  testing::TempDir dir_a, dir_b;
  auto a = StartPeerDaemon(dir_a);
  auto b = StartPeerDaemon(dir_b, {"--peer-pool", "5MiB"});
  const std::string addr_a = PeerAddress(*a), addr_b = PeerAddress(*b);

  // A saves step 1 of a one-rank job.
  const uint64_t seed = testing::TestSeed();
  InProcessRank rank(3ull << 20, 3, 0, 1, seed);
  auto client = a->Connect("peer-job");
  REQUIRE_OK(client->Register(rank.Specs()));
  rank.Fill(1);
  REQUIRE_OK(client->Save(1, rank.Extra(1)));
  REQUIRE_OK(client->Wait(1, WaitState::kCommitted, std::chrono::seconds(60)));
  RequireTrainerStep(a->root(), "peer-job", 1, 3ull << 20, 3, 1, seed);
  const std::string file = DataFileName(0);
  const std::string on_disk = ReadWholeFile(JoinPath(StepDir(a->root(), "peer-job", 1), file));
  // One copy fits B's 5 MiB peer pool, two do not.
  REQUIRE(on_disk.size() >= (3u << 20));
  REQUIRE(on_disk.size() <= (5u << 20));

  // Another node fetches the whole data file from A's data plane, in 1 MiB chunks.
  PeerClient from_a({addr_a, std::chrono::seconds(20), 1 << 20});
  std::string fetched(on_disk.size(), '\0');
  REQUIRE_OK(from_a.Fetch({"peer-job", 1, file, 0, on_disk.size()},
                          reinterpret_cast<std::byte*>(fetched.data())));
  CHECK(fetched == on_disk);

  // ... and hands it to B to hold: B's storage never sees the step, yet B serves it back.
  PeerClient to_b({addr_b, std::chrono::seconds(20), 1 << 20});
  REQUIRE_OK(to_b.Put({"peer-job", 1, file, 0, on_disk.size()},
                      reinterpret_cast<const std::byte*>(fetched.data())));
  std::string held(on_disk.size(), '\0');
  REQUIRE_OK(to_b.Fetch({"peer-job", 1, file, 0, on_disk.size()},
                        reinterpret_cast<std::byte*>(held.data())));
  CHECK(held == on_disk);
  CHECK_FALSE(std::filesystem::exists(JobDir(b->root(), "peer-job")));

  // B's pool (5 MiB) cannot take another copy: a clear refusal, and the first copy stays.
  const Status full = to_b.Put({"peer-job", 2, file, 0, on_disk.size()},
                               reinterpret_cast<const std::byte*>(fetched.data()));
  CHECK(full.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(full.message(), Catch::Contains("peer pool full"));
  std::string again(on_disk.size(), '\0');
  REQUIRE_OK(to_b.Fetch({"peer-job", 1, file, 0, on_disk.size()},
                        reinterpret_cast<std::byte*>(again.data())));
  CHECK(again == on_disk);

  // Hostile names and garbage reach nothing and bring nothing down.
  std::string out(16, '\0');
  const Status hostile =
      from_a.Fetch({"..", 1, file, 0, 16}, reinterpret_cast<std::byte*>(out.data()));
  CHECK(hostile.code() == StatusCode::kInvalidArgument);
  {
    const auto colon = addr_a.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr_a.substr(colon + 1))));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    UniqueFd raw(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(::connect(raw.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    const std::string garbage(64, '\xff');
    REQUIRE(::send(raw.get(), garbage.data(), garbage.size(), MSG_NOSIGNAL) > 0);
    char c;
    while (::recv(raw.get(), &c, 1, 0) > 0) {
    }  // the server answers once and closes
  }
  CHECK(PollUntil([&] { return a->Log().find("bad magic") != std::string::npos; }));
  REQUIRE_OK(
      from_a.Fetch({"peer-job", 1, file, 4096, 16}, reinterpret_cast<std::byte*>(out.data())));
  CHECK(out == on_disk.substr(4096, 16));
  CHECK(a->Alive());

  // The metrics count both directions (a server counts a reply once its write completed, which
  // may be just after the client has it: poll).
  const std::string metrics_a = BoundAddress(*a, "metrics-bound");
  const std::string metrics_b = BoundAddress(*b, "metrics-bound");
  const auto sample = [](const std::string& address, const std::string& series) {
    return Sample(HttpGet(address, "/metrics"), series);
  };
  CHECK(PollUntil([&] {
    return sample(metrics_a, "ckptd_peer_bytes_total{direction=\"sent\"}") >=
           static_cast<double>(on_disk.size());
  }));
  CHECK(sample(metrics_b, "ckptd_peer_bytes_total{direction=\"received\"}") >=
        static_cast<double>(on_disk.size()));
  CHECK(sample(metrics_b, "ckptd_peer_requests_failed_total{reason=\"full\"}") == 1);
}

TEST_CASE("peer data plane: a holder killed mid-transfer fails the fetch before its deadline",
          "[peer][daemon]") {
  testing::TempDir dir;
  // 1 MiB/s: each 1 MiB chunk of the reply waits about a second for the cap.
  auto holder = StartPeerDaemon(dir, {"--peer-pool", "16MiB", "--peer-bandwidth", "1MiB"});
  const std::string address = PeerAddress(*holder);
  const std::string bytes(8 << 20, 'x');
  const std::string file = DataFileName(0);
  {
    PeerClient put({address, std::chrono::seconds(20)});
    REQUIRE_OK(put.Put({"kill-job", 3, file, 0, bytes.size()},
                       reinterpret_cast<const std::byte*>(bytes.data())));
  }
  CountingObserver observer;
  const auto deadline = std::chrono::seconds(30);
  PeerClient client({address, deadline, 1 << 20}, nullptr, &observer);
  std::string out(bytes.size(), '\0');
  auto fetch = std::async(std::launch::async, [&] {
    return client.Fetch({"kill-job", 3, file, 0, bytes.size()},
                        reinterpret_cast<std::byte*>(out.data()));
  });
  // The first chunk arrived: the transfer is under way. Kill the holder.
  REQUIRE(PollUntil([&] { return observer.received > 0; }));
  const auto killed = std::chrono::steady_clock::now();
  holder->Kill(SIGKILL);
  REQUIRE(fetch.wait_for(deadline) == std::future_status::ready);
  const Status st = fetch.get();
  const auto took = std::chrono::steady_clock::now() - killed;
  CHECK(st.code() == StatusCode::kUnavailable);
  CHECK_THAT(st.message(), Catch::Contains("job 'kill-job' step 3"));
  CHECK(took < deadline);
  CHECK(observer.received < bytes.size());
}

}  // namespace
}  // namespace ckpt::itest
