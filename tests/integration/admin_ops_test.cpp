// What an operator meets around the admin endpoint of a real daemon: the systemd watchdog,
// `ckptctl health` as an exec probe, the trainer socket's group and mode, and a daemon that
// refuses to start when its admin address is taken.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <arpa/inet.h>
#include <grp.h>
#include <netinet/in.h>

namespace {

using ckpt::UniqueFd;
using ckpt::itest::BindDatagramSocket;
using ckpt::itest::ChildProcess;
using ckpt::itest::DaemonProcess;
using ckpt::itest::ExitedWith;
using ckpt::itest::ReceiveDatagram;
using ckpt::itest::RequireBinary;
using ckpt::itest::RunCkptctl;
using ckpt::testing::TempDir;

}  // namespace

TEST_CASE("daemon: with WATCHDOG_USEC set it sends READY=1 and then WATCHDOG=1 pings",
          "[daemon][ops]") {
  TempDir dir;
  const std::string notify_path = dir / "notify.sock";
  UniqueFd notify = BindDatagramSocket(notify_path);
  auto options = DaemonProcess::InDir(dir);
  options.env = {"NOTIFY_SOCKET=" + notify_path, "WATCHDOG_USEC=200000"};
  DaemonProcess daemon(options);

  // The first datagrams arrive in order: READY=1 (after binding), then pings every 100 ms.
  bool ready = false;
  int pings = 0;
  for (int i = 0; i < 20 && pings < 3; ++i) {
    const std::string m = ReceiveDatagram(notify.get(), 30000);
    REQUIRE_FALSE(m.empty());
    if (m.find("READY=1") != std::string::npos) ready = true;
    if (m == "WATCHDOG=1") ++pings;
  }
  CHECK(ready);
  CHECK(pings == 3);
  REQUIRE(ExitedWith(daemon.Terminate(), 0));
}

TEST_CASE("daemon: under systemd its STATUS= line names the newest commit", "[daemon][ops]") {
  TempDir dir;
  const std::string notify_path = dir / "notify.sock";
  UniqueFd notify = BindDatagramSocket(notify_path);
  auto options = DaemonProcess::InDir(dir);
  options.env = {"NOTIFY_SOCKET=" + notify_path};
  DaemonProcess daemon(options);
  CHECK_THAT(ReceiveDatagram(notify.get(), 30000), Catch::Contains("READY=1"));

  ckpt::itest::InProcessRank data(1ull << 20, 2, 0, 1, 3);
  auto client = daemon.Connect("status-job");
  REQUIRE_OK(client->Register(data.Specs()));
  data.Fill(4);
  REQUIRE_OK(client->Save(4, data.Extra(4)));
  REQUIRE_OK(client->Wait(4, ckpt::WaitState::kCommitted));
  std::string last;
  for (int i = 0; i < 10 && last.find("last commit") == std::string::npos; ++i) {
    last = ReceiveDatagram(notify.get(), 30000);
    REQUIRE_FALSE(last.empty());
  }
  CHECK(last == "STATUS=serving; 0 steps in flight; last commit: job 'status-job' step 4");
  REQUIRE(ExitedWith(daemon.Terminate(), 0));
}

TEST_CASE("daemon: WATCHDOG_PID of another process means no pings", "[daemon][ops]") {
  TempDir dir;
  const std::string notify_path = dir / "notify.sock";
  UniqueFd notify = BindDatagramSocket(notify_path);
  auto options = DaemonProcess::InDir(dir);
  options.env = {"NOTIFY_SOCKET=" + notify_path, "WATCHDOG_USEC=20000", "WATCHDOG_PID=1"};
  DaemonProcess daemon(options);
  CHECK_THAT(ReceiveDatagram(notify.get(), 30000), Catch::Contains("READY=1"));
  daemon.Kill(SIGTERM);
  // The next message is the drain notice, not a ping (pings would have come every 10 ms).
  CHECK_THAT(ReceiveDatagram(notify.get(), 30000), Catch::StartsWith("STOPPING=1"));
  REQUIRE(ExitedWith(daemon.Terminate(), 0));
}

TEST_CASE("ckptctl: health exits 0 when the daemon serves and 1 when it cannot be reached",
          "[ckptctl][ops]") {
  TempDir dir;
  DaemonProcess daemon(DaemonProcess::InDir(dir));
  auto [rc, out] = RunCkptctl(dir, {"--admin", "unix:" + daemon.admin_socket(), "health"});
  CHECK(rc == 0);
  CHECK(out == "SERVING\n");

  auto [rc2, out2] = RunCkptctl(
      dir, {"--admin", "unix:" + std::string(dir / "absent.sock"), "--timeout", "2s", "health"});
  CHECK(rc2 == 1);
  CHECK_THAT(out2, Catch::Contains("UNREACHABLE"));
  CHECK_THAT(out2, Catch::Contains("absent.sock"));

  auto [rc3, out3] = RunCkptctl(dir, {"--admin", "unix:" + daemon.admin_socket(), "status"});
  CHECK(rc3 == 0);
  CHECK_THAT(out3, Catch::Contains("daemon itest-node"));
  CHECK_THAT(out3, Catch::Contains("SERVING"));
}

TEST_CASE("daemon: --socket-group and --socket-mode set the trainer socket's group and mode",
          "[daemon][ops][access]") {
  TempDir dir;
  const gid_t gid = ::getgid();
  const group* g = ::getgrgid(gid);
  REQUIRE(g != nullptr);
  auto options = DaemonProcess::InDir(dir);
  options.flags = {"--socket-group", g->gr_name, "--socket-mode", "0600"};
  DaemonProcess daemon(options);
  struct stat st;
  REQUIRE(::stat(daemon.socket().c_str(), &st) == 0);
  CHECK(st.st_gid == gid);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("daemon: an unknown --socket-group is a startup error naming the group",
          "[daemon][ops][access]") {
  TempDir dir;
  auto options = DaemonProcess::InDir(dir);
  ChildProcess p(RequireBinary("ckptd"),
                 {"--socket", options.socket, "--storage-root", options.storage_root, "--host-pool",
                  "64MiB", "--slot-size", "4MiB", "--admin", "unix:" + options.socket + ".admin",
                  "--metrics", "127.0.0.1:0", "--socket-group", "no-such-group-ckptd"},
                 options.log_path);
  CHECK(ExitedWith(p.Wait(), 2));
  CHECK_THAT(p.Log(), Catch::Contains("no group named 'no-such-group-ckptd'"));
}

TEST_CASE("daemon: an admin address already in use is a startup error, not a silent daemon",
          "[daemon][ops]") {
  TempDir dir;
  // Hold a loopback port the daemon is told to use.
  UniqueFd holder(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(holder);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(holder.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(holder.get(), 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(holder.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string taken = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  auto options = DaemonProcess::InDir(dir);
  ChildProcess p(RequireBinary("ckptd"),
                 {"--socket", options.socket, "--storage-root", options.storage_root, "--host-pool",
                  "64MiB", "--slot-size", "4MiB", "--admin", taken, "--metrics", "127.0.0.1:0"},
                 options.log_path);
  CHECK(ExitedWith(p.Wait(), 1));
  CHECK_THAT(p.Log(), Catch::Contains("admin: cannot serve gRPC on " + taken));
  CHECK_FALSE(std::filesystem::exists(options.socket));  // never told trainers it was up

  SECTION("the same for the metrics address") {
    ChildProcess m(
        RequireBinary("ckptd"),
        {"--socket", options.socket, "--storage-root", options.storage_root, "--host-pool", "64MiB",
         "--slot-size", "4MiB", "--admin", "unix:" + options.socket + ".admin", "--metrics", taken},
        options.log_path);
    CHECK(ExitedWith(m.Wait(), 1));
    CHECK_THAT(m.Log(), Catch::Contains("metrics: cannot serve HTTP on " + taken));
  }
}
