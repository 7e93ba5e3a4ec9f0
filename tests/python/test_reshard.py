"""Save with one sharding, load with others (docs/design.md §4).

Two processes save a model whose 2-D weights are row-sharded (ckptd.Shard with row offsets), a
1-D tensor split in two and a replicated scalar. Then three processes load it column-sharded
(1-D tensors as flat ranges, ckptd.FlatShard) from the daemon's memory, and — after a daemon
restart, so from storage — one process loads every tensor whole. Every value is compared with
the original full tensors.
"""

import argparse
import os
import subprocess
import sys
import unittest

JOB = "reshard"
# name -> (shape, dtype name)
SPECS = {
    "layers.0.weight": ((12, 10), "float32"),
    "layers.1.weight": ((9, 7), "bfloat16"),
    "embed.table": ((5, 33), "int32"),
    "bias": ((11,), "int64"),
    "scale": ((), "float64"),
}


def full_tensors():
    import torch
    g = torch.Generator().manual_seed(4242)
    out = {}
    for name, (shape, dtype) in SPECS.items():
        dt = getattr(torch, dtype)
        if dt.is_floating_point:
            out[name] = torch.randn(shape, generator=g).to(dt)
        else:
            out[name] = torch.randint(-10**6, 10**6, shape, generator=g).to(dt)
    return out


def split(n, parts, k):
    """[start, stop) of part k when n is split into `parts` nearly equal runs."""
    base, extra = divmod(n, parts)
    start = k * base + min(k, extra)
    return start, start + base + (1 if k < extra else 0)


def save_worker(args):
    import ckptd
    full = full_tensors()
    r, world = args.rank, 2
    tensors = {}
    for name, t in full.items():
        if t.dim() == 0:
            tensors[name] = t.clone()                   # replicated on every rank
            continue
        a, b = split(t.shape[0], world, r)
        tensors[name] = ckptd.Shard(t[a:b].clone(), tuple(t.shape), (a,) + (0,) * (t.dim() - 1))
    with ckptd.Client(JOB, r, world, socket=args.socket) as c:
        c.save(1, tensors, extra=b"saver-%d" % r)
        c.wait_snapshot()
        c.wait(1, "committed", timeout=60)
    return 0


def load_worker(args):
    import torch
    import ckptd
    full = full_tensors()
    r, world = args.rank, 3
    targets, expected = {}, {}
    for name, t in full.items():
        if t.dim() == 0:
            targets[name] = torch.zeros_like(t)
            expected[name] = t
        elif t.dim() == 1:
            a, b = split(t.numel(), world, r)
            targets[name] = ckptd.FlatShard(torch.zeros(b - a, dtype=t.dtype), tuple(t.shape), a)
            expected[name] = t[a:b]
        else:
            a, b = split(t.shape[1], world, r)
            targets[name] = ckptd.Shard(torch.zeros(t.shape[0], b - a, dtype=t.dtype),
                                        tuple(t.shape), (0, a))
            expected[name] = t[:, a:b]
    with ckptd.Client(JOB, r, world, socket=args.socket) as c:
        extra = c.load(targets)
        info = c.last_load
    bad = []
    for name, want in expected.items():
        got = targets[name].tensor if hasattr(targets[name], "tensor") else targets[name]
        if not torch.equal(got, want):
            bad.append(name)
    if r < 2 and extra != b"saver-%d" % r:
        bad.append("extra %r" % (extra,))
    if info.step != 1:
        bad.append("step %d" % info.step)
    if bad:
        print("rank %d: wrong values in %s" % (r, ", ".join(bad)), file=sys.stderr)
        return 1
    print("rank %d ok: %d bytes from memory, %d from storage"
          % (r, info.bytes_from_memory, info.bytes_from_storage))
    return 0


class ReshardTest(unittest.TestCase):
    def run_ranks(self, role, n, socket):
        me = os.path.abspath(__file__)
        procs = [subprocess.Popen([sys.executable, me, "--worker", role, "--rank", str(r),
                                   "--socket", socket],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(n)]
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, "%s rank %d: %s%s" % (role, r, out, err))

    def test_rows_to_columns_to_whole(self):
        import torch
        import ckptd_testutil as util

        d1 = util.Daemon().start()
        self.addCleanup(d1.cleanup)
        self.run_ranks("save", 2, d1.socket)      # 2 ranks, row shards
        self.run_ranks("load", 3, d1.socket)      # 3 ranks, column / flat shards (hot memory)
        d1.stop()

        d2 = util.Daemon(directory=d1.dir).start()   # same storage root: a cold load
        self.addCleanup(d2.stop)
        full = full_tensors()
        whole = {name: torch.zeros_like(t) for name, t in full.items()}
        with d2.client(JOB, 0, 1) as c:
            self.assertEqual(c.latest(), 1)
            extra = c.load(whole)
            info = c.last_load
        self.assertEqual(extra, b"saver-0")
        self.assertEqual(info.step, 1)
        self.assertGreater(info.bytes_from_storage, 0)
        for name, t in full.items():
            self.assertTrue(torch.equal(whole[name], t), name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["save", "load"])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--socket")
    args, rest = parser.parse_known_args()
    if args.worker == "save":
        sys.exit(save_worker(args))
    if args.worker == "load":
        sys.exit(load_worker(args))
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
