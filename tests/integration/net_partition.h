// Cutting one process off the network while it lives, for the partition tests: the link between
// a daemon and everything else on loopback (its coordinator stream, its data plane, its metrics
// port) goes dark, while the process runs on and still reaches the file system. Or only one of
// its ports (CutPort): its data plane stalls while its coordinator stream goes on.
//
// How: the daemon runs under a group id of its own (DaemonProcess::Options::launcher, setpriv
// --regid), and an nftables table of this test process's own, in the output and input hooks,
// (1) marks the connection (conntrack mark) of every packet a socket of that group sends, and
// (2) drops every packet of a marked connection, in both directions. Every packet on loopback
// passes the output hook of its sender, so the other side's packets of those connections are
// dropped as well, and connections made during the cut (a reconnect's SYN, or the SYN-ACK of the
// daemon's listening socket) are marked by their first packet. At most one packet the other
// side sent before the daemon's first packet since the cut gets through — as on a real link
// that breaks with a packet in flight. Removing the table heals the link: TCP retransmits what
// was dropped, and connections that outlived the cut carry on.
//
// The group id, the table's name and the mark carry this process's pid, so parallel tests never
// touch each other's rules, and a connection marked by an earlier run (its conntrack entry
// outlives the table) is never dropped by a later one. The group ids (2^30 + pid) are far above
// any account's or systemd's dynamic users'. A table left by a test process that died mid-cut
// (killed by ctest's timeout) is removed by the next cut on the machine. Needs root and nft
// (Debian's nftables package): Unavailable() says why a cut cannot be made here, for the test to
// skip with that message.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace ckpt::itest {

class NetPartition {
 public:
  // A group id no account uses, distinct per test process.
  static gid_t IsolatedGroup() { return static_cast<gid_t>((1u << 30) + ::getpid()); }

  // The launcher (DaemonProcess::Options::launcher) that runs a daemon under `gid`.
  static std::vector<std::string> LauncherFor(gid_t gid) {
    return {"/usr/bin/setpriv", "--regid", std::to_string(gid), "--clear-groups", "--"};
  }

  // "" when this machine can cut links: root, setpriv, nft, and nftables in the kernel (probed
  // with a table added and deleted again).
  static std::string Unavailable(const testing::TempDir& dir) {
    if (::geteuid() != 0) return "cutting a link needs root (nftables rules)";
    if (!std::filesystem::exists("/usr/bin/setpriv")) return "setpriv (util-linux) is missing";
    if (Nft().empty()) return "nft is missing (the Debian package nftables)";
    NetPartition probe(dir, 0);
    const std::string table = "table inet " + probe.table_ + " {}\n";
    if (!probe.Run(table, "add")) return "nft cannot add a table: " + probe.last_output_;
    if (!probe.Run("delete table inet " + probe.table_ + "\n", "delete")) {
      return "nft cannot delete its table: " + probe.last_output_;
    }
    return "";
  }

  NetPartition(const testing::TempDir& dir, gid_t gid)
      : dir_(dir.path()),
        gid_(gid),
        table_("ckpt_partition_" + std::to_string(::getpid())),
        mark_(0x0c700000u | (static_cast<unsigned>(::getpid()) & 0xfffffu)) {}
  NetPartition(const NetPartition&) = delete;
  NetPartition& operator=(const NetPartition&) = delete;
  ~NetPartition() {
    if (cut_) Run("delete table inet " + table_ + "\n", "heal");
  }

  // Drops every packet of the group's connections from now on.
  void Cut() {
    std::ostringstream chains;
    chains << "  chain out {\n"
           << "    type filter hook output priority 0; policy accept;\n"
           << "    meta skgid " << gid_ << " ct mark set " << mark_ << "\n"
           << "    ct mark " << mark_ << " drop\n"
           << "  }\n"
           << "  chain in {\n"
           << "    type filter hook input priority 0; policy accept;\n"
           << "    ct mark " << mark_ << " drop\n"
           << "  }\n";
    Install(chains.str(), "cut");
  }

  // Drops every TCP packet to or from `port` on this machine from now on: one listening
  // service goes dark (a daemon's data plane that stalls, say) while the process's other links
  // work. Every packet on loopback passes its sender's output hook, so one chain does it; no
  // group is needed (construct with gid 0). Heal() ends it.
  void CutPort(uint16_t port) {
    std::ostringstream chains;
    chains << "  chain out {\n"
           << "    type filter hook output priority 0; policy accept;\n"
           << "    tcp dport " << port << " drop\n"
           << "    tcp sport " << port << " drop\n"
           << "  }\n";
    Install(chains.str(), "cut-port");
  }

  // Removes the rules: the link works again.
  void Heal() {
    if (!cut_) return;
    INFO(last_output_);
    REQUIRE(Run("delete table inet " + table_ + "\n", "heal"));
    cut_ = false;
  }

 private:
  // Adds this process's table with `chains`: the cut starts.
  void Install(const std::string& chains, const std::string& what) {
    REQUIRE_FALSE(cut_);
    RemoveLeftovers();
    INFO(last_output_);
    REQUIRE(Run("table inet " + table_ + " {\n" + chains + "}\n", what));
    cut_ = true;
  }

  static std::string Nft() {
    for (const char* path : {"/usr/sbin/nft", "/sbin/nft"}) {
      if (std::filesystem::exists(path)) return path;
    }
    return "";
  }

  // Deletes the tables of test processes that are gone (one killed while its link was cut).
  void RemoveLeftovers() {
    if (!Run("list tables\n", "list")) return;
    std::istringstream tables(last_output_);
    const std::string prefix = "table inet ckpt_partition_";
    for (std::string line; std::getline(tables, line);) {
      if (line.rfind(prefix, 0) != 0) continue;
      const std::string pid = line.substr(prefix.size());
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
      Run("delete table inet ckpt_partition_" + pid + "\n", "leftover");
    }
  }

  // Runs `nft -f` on `script`; its output is kept for the failure message.
  bool Run(const std::string& script, const std::string& what) {
    const std::string file = dir_ + "/nft-" + what + ".rules";
    const std::string log = dir_ + "/nft-" + what + ".out";
    std::ofstream(file) << script;
    std::filesystem::remove(log);
    ChildProcess nft(Nft(), {"-f", file}, log);
    const int status = nft.Wait();
    const bool ok = ExitedWith(status, 0);
    last_output_ =
        ok ? ReadWholeFile(log)
           : "nft -f " + file + ": " + DescribeWaitStatus(status) + "\n" + ReadWholeFile(log);
    return ok;
  }

  std::string dir_;
  gid_t gid_;
  std::string table_;
  unsigned mark_;
  bool cut_ = false;
  std::string last_output_;
};

}  // namespace ckpt::itest
