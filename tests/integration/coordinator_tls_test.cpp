// The coordinator link over mutual TLS with certificates made here by openssl; a daemon
// without a client certificate is refused; plaintext on a non-loopback address is refused.
// coordinator_harness.h includes daemon_harness.h first (it configures Catch).
#include "tests/integration/coordinator_harness.h"

namespace {

using ckpt::itest::ChildProcess;
using ckpt::itest::CoordinatorProcess;
using ckpt::itest::ModelRank;
using ckpt::testing::TempDir;

// Runs a command to completion (its output into `log`); true when it exited 0.
bool Run(const std::vector<std::string>& argv, const std::string& log) {
  ChildProcess p(argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()), log);
  return ckpt::itest::ExitedWith(p.Wait(), 0);
}

std::string Openssl() {
  for (const char* p : {"/usr/bin/openssl", "/usr/local/bin/openssl"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return {};
}

// A CA and two certificates it signs: the coordinator's (localhost) and a daemon's.
void MakeCertificates(const TempDir& dir) {
  const std::string ssl = Openssl();
  REQUIRE(!ssl.empty());
  const std::string log = dir / "openssl.log";
  INFO(ckpt::itest::ReadWholeFile(log));
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                       "-nodes"};
  auto req = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {ssl, "req"};
    a.insert(a.end(), ec.begin(), ec.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  REQUIRE(Run(req({"-x509", "-days", "1", "-subj", "/CN=ckpt-test-ca", "-keyout", dir / "ca.key",
                   "-out", dir / "ca.pem"}),
              log));
  {
    std::ofstream ext(dir / "server.ext");
    ext << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  }
  {
    std::ofstream ext(dir / "client.ext");
    ext << "extendedKeyUsage=clientAuth\n";
  }
  for (const std::string who : {"server", "client"}) {
    REQUIRE(Run(req({"-subj", who == "server" ? "/CN=localhost" : "/CN=n0", "-keyout",
                     dir / (who + ".key"), "-out", dir / (who + ".csr")}),
                log));
    REQUIRE(Run({ssl, "x509", "-req", "-days", "1", "-in", dir / (who + ".csr"), "-CA",
                 dir / "ca.pem", "-CAkey", dir / "ca.key", "-CAcreateserial", "-out",
                 dir / (who + ".pem"), "-extfile", dir / (who + ".ext")},
                log));
  }
}

TEST_CASE(
    "daemons reach the coordinator over mutual TLS, and one without a client certificate is "
    "refused",
    "[coordinator][tls]") {
  TempDir dir;
  MakeCertificates(dir);
  const std::string root = dir / "root";
  CoordinatorProcess::Options co;
  co.socket = dir / "coord.sock";
  co.storage_root = root;
  co.log_path = dir / "coordinator.log";
  co.flags = {"--tls-cert",       dir / "server.pem", "--tls-key",
              dir / "server.key", "--tls-client-ca",  dir / "ca.pem"};
  CoordinatorProcess coordinator(co);
  // The socket accepts a moment before the coordinator logs its ready line (read it once there).
  CHECK(ckpt::itest::PollUntil(
      [&] { return coordinator.Log().find("ready: ") != std::string::npos; }));
  CHECK(coordinator.Log().find("(mutual TLS)") != std::string::npos);

  const std::vector<std::string> tls = {
      "--coordinator-ca",  dir / "ca.pem",     "--coordinator-cert",        dir / "client.pem",
      "--coordinator-key", dir / "client.key", "--coordinator-server-name", "localhost"};
  auto nodes = ckpt::itest::StartNodes(dir, root, coordinator.address(), 2, tls);
  std::vector<std::unique_ptr<ModelRank>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<ModelRank>(nodes[r]->socket(), "tls", r, 2, 1, 3));
  }
  for (auto& r : ranks) REQUIRE_OK(r->SaveStep(1));
  for (auto& r : ranks) REQUIRE_OK(r->WaitCommitted(1));
  auto bad = ranks[1]->LoadAndCheck(1);
  REQUIRE_OK(bad);
  CHECK(*bad == 0);

  // Trusts the coordinator but has no certificate of its own: the handshake fails.
  ckpt::itest::DaemonProcess::Options o;
  o.socket = dir / "stranger.sock";
  o.storage_root = root;
  o.log_path = dir / "stranger.log";
  o.flags = {"--node-id",
             "stranger",
             "--coordinator",
             coordinator.address(),
             "--coordinator-ca",
             dir / "ca.pem",
             "--coordinator-server-name",
             "localhost"};
  ckpt::itest::DaemonProcess stranger(o);
  CHECK(ckpt::itest::PollUntil(
      [&] { return stranger.Log().find("cannot register") != std::string::npos; }));
  CHECK(coordinator.Log().find("node 'stranger' registered") == std::string::npos);
}

TEST_CASE("ckpt-coordinator refuses plaintext on a non-loopback address unless allowed",
          "[coordinator][tls]") {
  TempDir dir;
  ChildProcess refused(ckpt::itest::RequireBinary("ckpt-coordinator"),
                       {"--listen", "0.0.0.0:0", "--storage-root", dir / "root"},
                       dir / "refused.log");
  CHECK(ckpt::itest::ExitedWith(refused.Wait(), 2));
  CHECK(refused.Log().find("not a loopback address") != std::string::npos);

  // A daemon refuses a plaintext link to a non-loopback coordinator the same way. (An ephemeral
  // metrics port: with the default, any process holding 127.0.0.1:7461 would make the daemon
  // fail for that reason first.)
  ChildProcess daemon(
      ckpt::itest::RequireBinary("ckptd"),
      {"--socket", dir / "d.sock", "--storage-root", dir / "root", "--host-pool", "64MiB",
       "--slot-size", "4MiB", "--metrics", "127.0.0.1:0", "--coordinator", "10.1.2.3:7470"},
      dir / "daemon.log");
  CHECK(ckpt::itest::ExitedWith(daemon.Wait(), 2));
  CHECK(daemon.Log().find("--coordinator-plaintext") != std::string::npos);
}

}  // namespace
