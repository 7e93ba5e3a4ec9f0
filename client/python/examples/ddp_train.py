"""A data-parallel PyTorch trainer under torchrun, checkpointing every step through ckptd.

    torchrun --nproc-per-node 2 --rdzv-id myjob client/python/examples/ddp_train.py \\
        --socket /run/ckptd/ckptd.sock --steps 200

Each rank is one process of a gloo process group (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT); ``ckptd.Client()`` reads its job (TORCHELASTIC_RUN_ID), rank and
world size from the same variables. The model is wrapped in DistributedDataParallel and trained
with AdamW, an LR scheduler, a dynamic loss scaler (what ``torch.cuda.amp.GradScaler`` does,
written out so that it runs on CPU: it scales the loss, unscales the gradients, skips steps
whose gradients overflowed and grows or backs off the scale), dropout and a stateful data loader.
Everything that decides the next step is checkpointed:

- parameters and AdamW's moments — by the Checkpointer, under the unwrapped model's names;
- the scheduler, the scaler, the loader's position and the RNGs — as ``extra_state``, per rank
  (each rank draws its own dropout masks and reads its own batches).

So a job killed at any point restarts from the newest committed step and continues exactly as if
it had never stopped, and a restart with another number of ranks restores the same parameters,
optimizer and scheduler on every rank (a rank the checkpoint did not have takes the per-rank
state of rank ``rank % saved world size``). tests/python/test_ddp_example.py kills both ranks
with SIGKILL mid-run and checks both claims bit for bit.

Each step rank 0 prints ``step N loss L``; with --dump DIR every rank writes its final state
(and the losses it computed) to DIR/rank-<rank>.pt.
"""
import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ckptd
import ckptd.torch


class DynamicLossScaler:
    """Dynamic loss scaling as torch.cuda.amp.GradScaler does it, on any device. The scale is a
    power of two, so scaling and unscaling are exact."""

    def __init__(self, scale=2.0 ** 10, growth_interval=8, growth_factor=2.0, backoff=0.5):
        self.scale = scale
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff = backoff
        self.growth_tracker = 0
        self.skipped = 0

    def step(self, optimizer, loss):
        (loss * self.scale).backward()
        finite = True
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.div_(self.scale)
                    finite = finite and bool(torch.isfinite(p.grad).all())
        if finite:
            optimizer.step()
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale *= self.growth_factor
                self.growth_tracker = 0
        else:
            self.scale *= self.backoff
            self.growth_tracker = 0
            self.skipped += 1
        optimizer.zero_grad(set_to_none=True)

    def state_dict(self):
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "skipped": self.skipped}

    def load_state_dict(self, state):
        self.scale = state["scale"]
        self.growth_tracker = state["growth_tracker"]
        self.skipped = state["skipped"]


class SyntheticLoader:
    """A stateful data loader: batch ``position`` of rank ``rank`` is a function of both, so a
    restored position reads on where the checkpoint left off."""

    def __init__(self, rank, batch_size=32):
        self.rank = rank
        self.batch_size = batch_size
        self.position = 0

    def next(self):
        g = torch.Generator().manual_seed(1_000_003 * self.rank + self.position)
        self.position += 1
        x = torch.randn(self.batch_size, 32, generator=g)
        y = x[:, :4].sum(dim=1, keepdim=True).tanh() + 0.1 * torch.randn(self.batch_size, 1,
                                                                          generator=g)
        return x, y

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def build_model():
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                               torch.nn.Linear(64, 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", default=os.environ.get("CKPTD_SOCKET", ckptd.DEFAULT_SOCKET))
    parser.add_argument("--steps", type=int, default=100, help="train up to this step")
    parser.add_argument("--dump", help="write each rank's final state to DIR/rank-<rank>.pt")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()

    model = DistributedDataParallel(build_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    scaler = DynamicLossScaler()
    loader = SyntheticLoader(rank)
    torch.manual_seed(1000 + rank)  # per-rank dropout masks

    client = ckptd.Client(socket=args.socket)  # job, rank, world size: torchrun's environment
    # on_error="warn" (the default): a failed save is a warning and a count, training goes on.
    ckpt = ckptd.torch.Checkpointer(
        client, model, optimizer,
        extra_state={"scheduler": scheduler, "scaler": scaler, "loader": loader,
                     "rng": ckptd.torch.RNGState()})
    restored = ckpt.load()  # the same step on every rank (the job's restore point)
    if rank == 0:
        print("restored step %s (world size %d)" % (restored, world_size), flush=True)

    losses = {}
    step = restored or 0
    for step in range(step + 1, args.steps + 1):
        x, y = loader.next()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.step(optimizer, loss)  # backward (DDP all-reduces), unscale, optimizer.step()
        scheduler.step()
        ckpt.save(step)  # returns at once; the daemon copies while the next step computes
        losses[step] = loss.item()
        if rank == 0:
            print("step %d loss %.9g" % (step, losses[step]), flush=True)
    if args.steps > (restored or 0):
        client.wait(args.steps, "committed", timeout=60)

    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        state = {"restored": restored, "world_size": world_size, "losses": losses,
                 "model": ckpt.model.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                 "loader": loader.state_dict()}
        torch.save(state, os.path.join(args.dump, "rank-%d.pt" % rank))
    ckpt.remove_hook()
    client.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
