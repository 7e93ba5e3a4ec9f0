// Operations-facing behaviour of a real daemon: systemd readiness and draining notifications.
#include "tests/integration/daemon_harness.h"  // first: it configures Catch

#include <sys/socket.h>
#include <sys/un.h>

namespace {

using ckpt::UniqueFd;
using ckpt::itest::BindDatagramSocket;
using ckpt::itest::DaemonProcess;
using ckpt::itest::ExitedWith;
using ckpt::itest::ReceiveDatagram;
using ckpt::testing::TempDir;

}  // namespace

TEST_CASE("daemon: under systemd it reports READY=1 once serving and STOPPING=1 when draining",
          "[daemon][ops]") {
  TempDir dir;
  const std::string notify_path = dir / "notify.sock";
  UniqueFd notify = BindDatagramSocket(notify_path);

  auto options = DaemonProcess::InDir(dir);
  options.env.push_back("NOTIFY_SOCKET=" + notify_path);
  DaemonProcess daemon(options);  // returns once a client completed a hello

  // READY=1 was sent after the socket was bound, so it is already queued.
  const std::string ready = ReceiveDatagram(notify.get(), 30000);
  CHECK_THAT(ready, Catch::Contains("READY=1"));
  CHECK_THAT(ready, Catch::Contains(daemon.socket()));

  // One SIGTERM only: a second one arriving after the drain, once the daemon has put back the
  // default handler, kills it (seen under ASan, which makes that window wide).
  const int status = daemon.Terminate();
  const std::string stopping = ReceiveDatagram(notify.get(), 30000);  // queued before the exit
  CHECK_THAT(stopping, Catch::Contains("STOPPING=1"));
  REQUIRE(ExitedWith(status, 0));
}
