"""The Checkpointer restores into a job of any size, growing or shrinking: 1 → 2, 2 → 3 and
3 → 1 ranks, bit-exact on every rank, optimizer state and param groups included.

Each rank is a Checkpointer of its own (ranks of one process, each with its own client, model
and optimizer: the daemon cannot tell them from processes). The model's data-parallel replicas
are trained identically; one parameter is also row-sharded across the ranks by ``shard_fn``, so
both a replicated and a resharded tensor cross the change of world size. A rank that did not
exist at save time finds the Checkpointer's metadata (optimizer layout, param groups, user
state) in the blob of rank (rank % saved world size): LoadInfo.extra_rank.
"""

import unittest

import torch

import ckptd
import ckptd.torch
import ckptd_testutil as util

ROWS = 6  # of the row-sharded parameter: divisible by 1, 2 and 3


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, ROWS), torch.nn.Tanh(), torch.nn.Linear(ROWS, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optimizer


def row_shard(rank, world):
    """shard_fn: '0.weight' (ROWS x 8) split by rows across the ranks; everything else whole."""
    rows = ROWS // world

    def fn(name, t):
        if name in ("0.weight", "optimizer.state.0.weight.exp_avg",
                    "optimizer.state.0.weight.exp_avg_sq"):
            return ckptd.Shard(t[rank * rows:(rank + 1) * rows], global_shape=tuple(t.shape),
                               offsets=(rank * rows, 0))
        return t
    return fn


def train(model, optimizer, steps):
    torch.manual_seed(1234)  # the same batches on every replica
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def snapshot(model, optimizer):
    out = {"param." + k: v.detach().clone() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in optimizer.state.items():
        for k, v in st.items():
            out["opt.%s.%s" % (names[id(p)], k)] = v.clone() if torch.is_tensor(v) else v
    out["lr"] = [g["lr"] for g in optimizer.param_groups]
    out["weight_decay"] = [g["weight_decay"] for g in optimizer.param_groups]
    return out


class WorldSizeTest(unittest.TestCase):
    def roundtrip(self, daemon, job, saved_world, loaded_world):
        step = 2
        # Save: `saved_world` identical replicas, trained for `step` optimizer steps.
        savers, expected = [], None
        for rank in range(saved_world):
            model, optimizer = build(seed=7)
            client = daemon.client(job, rank, saved_world)
            ckpt = ckptd.torch.Checkpointer(client, model, optimizer,
                                            shard_fn=row_shard(rank, saved_world),
                                            extra_state=lambda: {"epoch": 3})
            train(model, optimizer, step)
            ckpt.save(step)
            savers.append((client, ckpt))
            snap = snapshot(model, optimizer)
            if expected is None:
                expected = snap
            for key, value in snap.items():  # the replicas really are identical
                if torch.is_tensor(value):
                    self.assertTrue(torch.equal(value, expected[key]), key)
        for client, ckpt in savers:
            ckpt.fence()
            client.wait(step, "committed", timeout=60)
            client.close()

        # Load: `loaded_world` fresh ranks (other values, no optimizer state yet).
        rows = ROWS // loaded_world
        for rank in range(loaded_world):
            model, optimizer = build(seed=100 + rank)
            with daemon.client(job, rank, loaded_world) as client:
                ckpt = ckptd.torch.Checkpointer(client, model, optimizer,
                                                shard_fn=row_shard(rank, loaded_world))
                self.assertEqual(ckpt.load(), step)
                info = client.last_load
                self.assertEqual(info.saved_world_size, saved_world)
                self.assertEqual(info.extra_rank, rank % saved_world)
                self.assertEqual(ckpt.loaded_extra_state, {"epoch": 3})
                got = snapshot(model, optimizer)
            self.assertEqual(set(got), set(expected), "rank %d" % rank)
            for key, want in expected.items():
                have = got[key]
                if key in ("param.0.weight", "opt.0.weight.exp_avg", "opt.0.weight.exp_avg_sq"):
                    # Row-sharded: this rank loaded its rows only.
                    want, have = want[rank * rows:(rank + 1) * rows], have[rank * rows:(rank + 1) * rows]
                if torch.is_tensor(want):
                    self.assertTrue(torch.equal(have, want), "rank %d: %s" % (rank, key))
                else:
                    self.assertEqual(have, want, "rank %d: %s" % (rank, key))

    def test_grow_and_shrink(self):
        with util.Daemon() as d:
            for saved, loaded in ((1, 2), (2, 3), (3, 1)):
                with self.subTest(saved=saved, loaded=loaded):
                    self.roundtrip(d, "worlds-%d-%d" % (saved, loaded), saved, loaded)

    def test_restore_point_is_one_answer_per_rank_of_a_restart(self):
        # The daemon's side of the restart race is forced in restore_point_test.cpp; here the
        # Python binding: both ranks get the pinned answer, a question repeated by a rank (the
        # next restart) and a new step resolve anew.
        with util.Daemon() as d:
            t = torch.arange(8, dtype=torch.float32)
            ranks = [d.client("restore", r, 2) for r in range(2)]
            for c in ranks:
                self.assertIsNone(c.restore_point())
            for c in ranks:
                c.save(1, {"t": t})
            for c in ranks:
                c.wait(1, "committed", timeout=60)
            self.assertEqual(ranks[0].restore_point(), 1)
            self.assertEqual(ranks[1].restore_point(), 1)
            for c in ranks:
                c.save(2, {"t": t})
            for c in ranks:
                c.wait(2, "committed", timeout=60)
            self.assertEqual(ranks[1].restore_point(), 2)
            out = torch.zeros(8)
            ranks[0].load({"t": out})  # step=None: the restore point
            self.assertEqual(ranks[0].last_load.step, 2)
            self.assertTrue(torch.equal(out, t))
            for c in ranks:
                c.close()


if __name__ == "__main__":
    unittest.main()
