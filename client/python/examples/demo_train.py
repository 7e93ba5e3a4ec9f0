"""A small PyTorch trainer that checkpoints every step through ckptd (the README demo).

It trains an MLP with AdamW on synthetic data, deterministically. On start it restores the
newest committed checkpoint of its job, if any, and says where the bytes came from (the
daemon's memory or storage). Each step it prints the loss and what checkpointing cost the
trainer: the save() call and the fence before the next optimizer step. With --kill-at STEP it
SIGKILLs itself right after saving that step, like a crashed trainer. With --report FILE it
writes a digest of its final parameters and optimizer state there.
"""
import argparse
import hashlib
import os
import signal
import sys
import time

import torch

import ckptd
import ckptd.torch


def build(seed, width):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, width), torch.nn.GELU(),
        torch.nn.Linear(width, width), torch.nn.GELU(),
        torch.nn.Linear(width, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer


def batch(seed, step):
    g = torch.Generator().manual_seed(seed * 100003 + step)
    x = torch.randn(128, 256, generator=g)
    y = torch.randint(0, 10, (128,), generator=g)
    return x, y


def digest(model, optimizer):
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.numpy().tobytes())
    for state in optimizer.state.values():
        for k in sorted(state):
            v = state[k]
            h.update(v.numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--socket", default="/run/ckptd/ckptd.sock")
    p.add_argument("--job", default="demo")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--report", default="")
    args = p.parse_args()

    torch.set_num_threads(1)
    model, optimizer = build(args.seed, args.width)
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
    client = ckptd.Client(args.job, 0, 1, socket=args.socket)
    ckpt = ckptd.torch.Checkpointer(client, model, optimizer, extra_state=ckptd.torch.RNGState())

    t0 = time.perf_counter()
    restored = ckpt.load()
    if restored is None:
        start = 1
        print(f"[trainer pid {os.getpid()}] no checkpoint of job '{args.job}': starting fresh "
              f"(~{state_bytes / 2**20:.0f} MiB of model + optimizer state)")
    else:
        r = ckpt.last_restore
        where = ("the daemon's memory (hot restore)" if r["bytes_from_storage"] == 0
                 else "storage")
        print(f"[trainer pid {os.getpid()}] restored step {restored} in "
              f"{(time.perf_counter() - t0) * 1e3:.0f} ms from {where}: "
              f"{r['bytes_from_memory'] / 2**20:.1f} MiB from memory, "
              f"{r['bytes_from_storage'] / 2**20:.1f} MiB from storage")
        start = restored + 1

    stalls = []
    for step in range(start, args.steps + 1):
        x, y = batch(args.seed, step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        f0 = time.perf_counter()
        ckpt.fence()                 # what the optimizer hook does: wait for the last capture
        fence_ms = (time.perf_counter() - f0) * 1e3
        optimizer.step()
        optimizer.zero_grad()
        s0 = time.perf_counter()
        ckpt.save(step)
        save_ms = (time.perf_counter() - s0) * 1e3
        stalls.append(save_ms + fence_ms)
        print(f"  step {step:3d}  loss {loss.item():.4f}  save() {save_ms:6.2f} ms  "
              f"fence {fence_ms:6.2f} ms")
        sys.stdout.flush()
        if step == args.kill_at:
            client.wait_snapshot()   # captured: the daemon persists it even without us
            print(f"[trainer pid {os.getpid()}] killing myself with SIGKILL after saving "
                  f"step {step}")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    client.wait(args.steps, "committed")
    if stalls:
        stalls.sort()
        print(f"[trainer pid {os.getpid()}] done: steps {start}..{args.steps}, checkpoint stall "
              f"per step median {stalls[len(stalls) // 2]:.2f} ms, max {stalls[-1]:.2f} ms; "
              f"step {args.steps} committed")
    if args.report:
        with open(args.report, "w") as f:
            f.write(digest(model, optimizer))
    client.close()


if __name__ == "__main__":
    main()
