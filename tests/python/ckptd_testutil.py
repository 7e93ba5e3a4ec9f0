"""Shared helpers of the Python tests: start a real ckptd in a temporary directory.

Environment (set by ctest, tests/python/CMakeLists.txt): PYTHONPATH points at the build tree's
python/ directory (the `ckptd` package), CKPT_BIN_DIR at its bin/ (the ckptd binary).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.request

import ckptd

BIN_DIR = os.environ.get("CKPT_BIN_DIR", "")

# A small daemon: the tests' states are at most ~64 MiB.
SMALL_POOL = ["--host-pool", "256MiB", "--slot-size", "4MiB", "--checksum-chunk", "1MiB"]
# Tests leave steps in flight on purpose (ranks that never save); do not drain them for long.
QUICK_STOP = ["--shutdown-timeout", "2s"]


def require_env():
    ckptd_bin = os.path.join(BIN_DIR, "ckptd")
    if not os.access(ckptd_bin, os.X_OK):
        sys.stderr.write("CKPT_BIN_DIR=%r has no ckptd binary; build it first\n" % BIN_DIR)
        sys.exit(2)
    return ckptd_bin


class Daemon:
    """A ckptd with its socket, admin socket and storage root in a fresh temporary directory.

    start() returns once the daemon answers a client's hello (ckptd.Client retries connecting
    for `ready_timeout` seconds): readiness is a real connection, never a sleep.

    `root` is the storage root (default: <directory>/storage; one given is never removed by
    cleanup(), so that several daemons — the nodes of a test — can share it) and `node_id` the
    daemon's --node-id."""

    def __init__(self, *extra_args, directory=None, job="ready-probe", root=None,
                 node_id="pytest"):
        self.bin = require_env()
        self.own_dir = directory is None
        self.dir = directory or tempfile.mkdtemp(prefix="ckptd-pytest-")
        self.socket = os.path.join(self.dir, "ckptd.sock")
        self.root = root or os.path.join(self.dir, "storage")
        self.node_id = node_id
        self.log_path = os.path.join(self.dir, "ckptd.log")
        self.extra_args = list(extra_args)
        self.proc = None
        self.probe_job = job

    def start(self, ready_timeout=20.0):
        args = [self.bin, "--socket", self.socket, "--admin", "unix:" + os.path.join(self.dir, "admin.sock"),
                "--storage-root", self.root, "--node-id", self.node_id, "--log-level", "info",
                "--metrics", "127.0.0.1:0"]
        args += SMALL_POOL + QUICK_STOP + self.extra_args
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            with ckptd.Client(self.probe_job, 0, 1, socket=self.socket,
                              connect_timeout=ready_timeout):
                pass
        except ckptd.Error:
            self.stop()
            sys.stderr.write(self.log())
            raise
        return self

    def client(self, job, rank=0, world_size=1, **kwargs):
        return ckptd.Client(job, rank, world_size, socket=self.socket, **kwargs)

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def kill(self):
        """SIGKILL (a crashed daemon)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout=30):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def cleanup(self):
        self.stop()
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()
        return False


class DaemonTestCase(unittest.TestCase):
    """A test case whose tests share one ckptd (``self.daemon``), started once for the class
    with ``daemon_args``."""

    daemon_args = ()

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(*cls.daemon_args).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()


def run_python(code_or_args, env_extra=None, timeout=120):
    """Run `python3 <args>` (a list) with this test's environment; returns CompletedProcess."""
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable] + list(code_or_args), env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def committed_steps(root, job):
    """The steps of `job` under the storage root `root` that have a MANIFEST (are committed)."""
    try:
        names = os.listdir(os.path.join(root, job))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name.startswith("step-") and os.path.exists(os.path.join(root, job, name, "MANIFEST")):
            try:
                out.append(int(name[len("step-"):]))
            except ValueError:
                pass
    return sorted(out)


def metrics_text(daemon):
    """The daemon's /metrics page (the address it bound is in its log)."""
    found = re.findall(r"Prometheus endpoint (http://\S+/metrics)", daemon.log())
    if not found:
        raise AssertionError("no metrics endpoint in the daemon log")
    with urllib.request.urlopen(found[-1], timeout=10) as r:
        return r.read().decode()


def _parse_series(line):
    """(name, {label: value}, value) of a sample line of the Prometheus text format, or None."""
    m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)", line)
    if not m:
        return None
    unescape = {"n": "\n"}
    labels = {k: re.sub(r"\\(.)", lambda e: unescape.get(e.group(1), e.group(1)), v)
              for k, v in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                     m.group(2) or "")}
    return m.group(1), labels, float(m.group(3))


def metric(daemon, name, labels=None, default=None):
    """The value of a series of the daemon's /metrics: the unlabelled one, or with `labels` (a
    dict, e.g. {"source": "storage"}) the one with exactly those labels. A series the page lacks
    is `default` when one is given (a labelled counter appears only once counted), else an
    AssertionError."""
    if labels is None:
        for line in metrics_text(daemon).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    else:
        want = {str(k): str(v) for k, v in labels.items()}
        for line in metrics_text(daemon).splitlines():
            if line.startswith("#"):
                continue
            series = _parse_series(line)
            if series and series[0] == name and series[1] == want:
                return series[2]
    if default is not None:
        return default
    raise AssertionError("%s%s not in /metrics" % (name, "" if labels is None else labels))
