"""A cold load across nodes from PyTorch (docs/design.md §4.7): each stored byte read once per job.

One ckpt-coordinator and two ckptd "nodes" n0 and n1 on one shared storage root (the loopback
stand-in for a parallel filesystem), each daemon with a data plane (--peer-listen 127.0.0.1:0).

1. Two data-parallel ranks (world size 2, one per node, each its own process) train the same
   seeded ~12 MiB model with AdamW for 2 steps and save step 2 with ckptd.torch.Checkpointer.
2. Both daemons are stopped and replaced by fresh ones: nothing of the step is in memory.
3. Two fresh ranks restore step 2 at the same time, each through its own daemon.

It proves that
- every rank's parameters and optimizer state are restored bit-exact (a sha256 over them equals
  the one taken at save);
- some of what the ranks restored came over the daemon-to-daemon data plane
  (Checkpointer.last_restore["bytes_from_peers"] > 0);
- the two daemons together read the step's unique bytes from storage about once, not once per
  node: 1.0 ≤ sum of ckptd_read_bytes_total{source="storage"} / unique bytes ≤ 1.25 (without the
  plan each node would read everything, 2×).
"""

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import ckptd_testutil as util

JOB = "cold"
STEP = 2
WORLD = 2
NODES = ("n0", "n1")
WIDTH = 1024  # 3 nn.Linear(1024, 1024): 12 MiB of float32 parameters, 36 MiB with AdamW's state


# -- the ranks (this file run with --worker) ---------------------------------------------------

def build(seed):
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer


def digest(model, optimizer):
    """sha256 over the bytes of every parameter (named order), then, per parameter index, every
    optimizer state value (sorted keys: tensors by their bytes, the rest by repr) and the
    param_groups' hyperparameters."""
    import torch
    h = hashlib.sha256()

    def tensor(t):
        t = t.detach().contiguous().cpu()
        h.update(("%s%s" % (t.dtype, tuple(t.shape))).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")

    for name, p in model.named_parameters():
        h.update(name.encode())
        tensor(p)
    state = optimizer.state_dict()
    for index in sorted(state["state"]):
        for key in sorted(state["state"][index]):
            value = state["state"][index][key]
            h.update(("%d.%s" % (index, key)).encode())
            if isinstance(value, torch.Tensor):
                tensor(value)
            else:
                h.update(repr(value).encode())
    for group in state["param_groups"]:
        h.update(repr(sorted(group.items())).encode())
    return h.hexdigest()


def save_worker(args):
    import torch
    import ckptd
    import ckptd.torch
    model, optimizer = build(seed=1234)
    # The same data on both ranks: data-parallel replicas whose gradients an all-reduce would
    # make equal; replicas with different bytes would fail the commit (design §4.4).
    data = torch.Generator().manual_seed(7)
    for _ in range(STEP):
        model(torch.randn(64, WIDTH, generator=data)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert len(optimizer.state) == 6, "AdamW has no state"
    with ckptd.Client(JOB, args.rank, WORLD, socket=args.socket) as client:
        ck = ckptd.torch.Checkpointer(client, model, optimizer, on_error="raise")
        ck.save(STEP)
        ck.fence()
        client.wait(STEP, "committed", timeout=60)
        ck.remove_hook()
    with open(args.out, "w") as f:
        json.dump({"digest": digest(model, optimizer)}, f)
    return 0


def load_worker(args):
    import ckptd
    import ckptd.torch
    model, optimizer = build(seed=99)  # another init, and no optimizer state yet
    before = digest(model, optimizer)
    with ckptd.Client(JOB, args.rank, WORLD, socket=args.socket) as client:
        ck = ckptd.torch.Checkpointer(client, model, optimizer, on_error="raise")
        loaded = ck.load(STEP)
        node = client.node_id
    with open(args.out, "w") as f:
        json.dump({"digest": digest(model, optimizer), "before": before, "loaded": loaded,
                   "last_restore": ck.last_restore, "node": node}, f)
    return 0


# -- the test ----------------------------------------------------------------------------------

def tail(path, lines=40):
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)\n"


class Coordinator:
    """A real ckpt-coordinator on unix:<dir>/coordinator.sock; start() returns once its socket
    accepts a connection (polled with backoff, failing at once if the process exits)."""

    def __init__(self, directory, root):
        util.require_env()
        self.bin = os.path.join(util.BIN_DIR, "ckpt-coordinator")
        self.socket = os.path.join(directory, "coordinator.sock")
        self.address = "unix:" + self.socket
        self.root = root
        self.log_path = os.path.join(directory, "coordinator.log")
        self.proc = None

    def start(self, ready_timeout=20.0):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.bin, "--listen", self.address, "--storage-root", self.root,
                 "--log-level", "info"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout
        pause = 0.001
        while True:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(self.socket)
                    return self
                except OSError:
                    pass
            if self.proc.poll() is not None:
                raise AssertionError("ckpt-coordinator exited %d:\n%s"
                                     % (self.proc.returncode, tail(self.log_path)))
            if time.monotonic() > deadline:
                raise AssertionError("ckpt-coordinator's socket did not accept within %gs:\n%s"
                                     % (ready_timeout, tail(self.log_path)))
            time.sleep(pause)  # retry backoff while the socket is absent
            pause = min(pause * 2, 0.05)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ColdLoadTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ckptd-cold-")
        if not os.environ.get("CKPT_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.root = os.path.join(self.tmp, "root")
        self.logs = []   # (what, path) of every process started, printed when the test fails
        self.procs = []  # rank processes, killed in cleanup if still running

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def start_nodes(self, tag):
        nodes = []
        for node in NODES:
            directory = os.path.join(self.tmp, "%s-%s" % (tag, node))
            os.mkdir(directory)
            d = util.Daemon("--coordinator", self.coordinator.address,
                            "--peer-listen", "127.0.0.1:0",
                            directory=directory, root=self.root, node_id=node)
            self.addCleanup(d.cleanup)  # stops it; its directory is under self.tmp
            self.logs.append(("daemon %s (%s)" % (node, tag), d.log_path))
            nodes.append(d.start())
        return nodes

    def stop_nodes(self, nodes):
        for d in nodes:
            d.stop()
            self.assertEqual(d.proc.returncode, 0, "%s did not exit cleanly" % d.node_id)

    def run_ranks(self, role, nodes):
        """Rank r on nodes[r], all started before any is waited for; their JSON outputs."""
        me = os.path.abspath(__file__)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs, outs = [], []
        for rank, d in enumerate(nodes):
            out = os.path.join(self.tmp, "%s-rank%d.json" % (role, rank))
            outs.append(out)
            p = subprocess.Popen([sys.executable, me, "--worker", role, "--rank", str(rank),
                                  "--socket", d.socket, "--out", out], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.procs.append(p)
            procs.append(p)
        for rank, p in enumerate(procs):
            text = p.communicate(timeout=90)[0]
            self.assertEqual(p.returncode, 0, "%s rank %d failed:\n%s" % (role, rank, text))
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
        return results

    def unique_bytes(self):
        """The step's unique stored bytes: the sum of its stored shards' lengths in the MANIFEST.
        ckptd.offline gives each tensor's dtype and global shape; in a data-parallel job every
        tensor is stored whole, once (identical replicas are written by one rank or merged to one
        copy, design §4.4, and none is partial), so its stored shards' lengths add up to
        numel × element size."""
        import torch
        import ckptd.offline
        ck = ckptd.offline.open(self.root, JOB, STEP)
        total = 0
        for name, info in ck.tensors.items():
            self.assertFalse(info.partial, name)
            numel = 1
            for d in info.shape:
                numel *= d
            total += numel * torch.empty((), dtype=info.dtype).element_size()
        return total

    def test_cold_load_reads_each_stored_byte_once_per_job(self):
        try:
            self.coordinator = Coordinator(self.tmp, self.root)
            self.logs.append(("coordinator", self.coordinator.log_path))
            self.addCleanup(self.coordinator.stop)
            self.coordinator.start()

            # Save step 2 from two data-parallel ranks, then drop the daemons' memory.
            nodes = self.start_nodes("save")
            saved = self.run_ranks("save", nodes)
            self.assertEqual(saved[0]["digest"], saved[1]["digest"], "the replicas differ")
            self.stop_nodes(nodes)
            self.assertEqual(util.committed_steps(self.root, JOB), [STEP])
            unique = self.unique_bytes()

            # Fresh daemons, both ranks restoring at once.
            nodes = self.start_nodes("load")
            loaded = self.run_ranks("load", nodes)
            storage = [util.metric(d, "ckptd_read_bytes_total", {"source": "storage"}, default=0.0)
                       for d in nodes]
            received = [util.metric(d, "ckptd_peer_bytes_total", {"direction": "received"},
                                    default=0.0) for d in nodes]
            from_peers = [r["last_restore"]["bytes_from_peers"] for r in loaded]
            sys.stderr.write(
                "\ncold load: unique bytes %d; storage reads %s = %.3f x unique; bytes from peers "
                "per rank %s; peer bytes received per daemon %s; last_restore %s\n"
                % (unique, [int(s) for s in storage], sum(storage) / unique, from_peers,
                   [int(r) for r in received], [r["last_restore"] for r in loaded]))

            for rank, r in enumerate(loaded):
                self.assertEqual(r["loaded"], STEP)
                self.assertEqual(r["node"], NODES[rank])
                self.assertNotEqual(r["before"], saved[rank]["digest"], "rank %d" % rank)
                self.assertEqual(r["digest"], saved[rank]["digest"],
                                 "rank %d: not restored bit-exact" % rank)
            self.assertGreater(sum(from_peers), 0, "nothing came from the other node")
            # Every stored byte was read from storage at least once (nothing else has it), and
            # about once in all: reading per node would be 2x.
            self.assertGreaterEqual(sum(storage), 1.0 * unique, "less than the step was read")
            self.assertLessEqual(sum(storage), 1.25 * unique,
                                 "more than 1.25x the step's unique bytes read from storage")
            self.stop_nodes(nodes)
        except BaseException:
            for what, path in self.logs:
                sys.stderr.write("---- tail of the %s log %s ----\n%s" % (what, path, tail(path)))
            sys.stderr.write("---- end ----\n")
            raise


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["save", "load"])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--socket")
    parser.add_argument("--out")
    args, rest = parser.parse_known_args()
    if args.worker == "save":
        sys.exit(save_worker(args))
    if args.worker == "load":
        sys.exit(load_worker(args))
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
