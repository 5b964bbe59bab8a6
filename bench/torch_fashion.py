#!/usr/bin/python3
"""torch_fashion.py — PyTorch 1.13 twin of examples/fashion (issue 16, demo 1).

The same CNN (conv 1->32 3x3 no bias, BatchNorm2d, ReLU, max_pool 2, conv
32->64 3x3 no bias, BatchNorm2d, ReLU, max_pool 2, dropout 0.25, Linear
1600->128, ReLU, Linear 128->10), PyTorch's default initialisation (which
Kiln's kl_params_add_* reproduce), AdamW (lr 2e-3, weight decay 0.01) with a
cosine decay to 0 over the run, mean cross-entropy.

    /usr/bin/python3 bench/torch_fashion.py [--threads T] [--batch B] [--steps N]
                                             [--data DIR] [--epochs E] [--limit N] [--profile]

Default: times N training steps (zero_grad, forward, backward, AdamW step)
after 3 warm-up steps on random batches of the training images (DIR,
default data/fashion; random images without it) and prints the median per
step in the format of `fashion --bench-steps N`; with --profile, the N steps
run under torch.profiler (CPU) and its key_averages table by self CPU time
follows (where PyTorch's step goes: bench/RESULTS.md). --epochs E trains E epochs
on the real data (the first --limit images) instead and prints the train
loss, test accuracy and images/s of each, as the Kiln demo does.
"""
import argparse
import gzip
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--data", default=None)
ap.add_argument("--epochs", type=int, default=0)
ap.add_argument("--limit", type=int, default=0)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--profile", action="store_true")
args = ap.parse_args()
# Debian's torch calls the system OpenBLAS (pthread build), which reads its
# thread count from the environment when it loads: set it before the import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
data_dir = args.data or os.path.join(os.environ.get("KILN_DATA_DIR") or os.path.join(repo, "data"), "fashion")


def read_idx(path, ndim):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[:4] != bytes([0, 0, 8, ndim]):
        sys.exit(f"torch_fashion: {path}: bad magic {raw[:4].hex()}")
    dims = [int.from_bytes(raw[4 + 4 * d:8 + 4 * d], "big") for d in range(ndim)]
    body = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        sys.exit(f"torch_fashion: {path}: {body.size} data bytes, want {int(np.prod(dims))}")
    return body.reshape(dims)


def load(prefix, limit=0):
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), 3)
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), 1)
    if limit:
        x, y = x[:limit], y[:limit]
    return (torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1),
            torch.from_numpy(y.astype(np.int64)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(32)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(64)
        self.drop = torch.nn.Dropout(0.25)
        self.fc1 = torch.nn.Linear(64 * 5 * 5, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.drop(x)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def make(total_steps):
    torch.manual_seed(args.seed)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    return model, opt, sched


def step(model, opt, sched, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    return loss


def bench():
    have = os.path.exists(os.path.join(data_dir, "train-images-idx3-ubyte.gz"))
    if have:
        xtr, _ = load("train", args.limit or 10000)  # as run_fashion_bench.sh gives Kiln
    else:
        g = torch.Generator().manual_seed(1)
        xtr = torch.rand(10000, 1, 28, 28, generator=g)
    ytr = torch.randint(0, 10, (xtr.shape[0],), generator=torch.Generator().manual_seed(2))
    model, opt, sched = make(10 ** 9)
    model.train()
    rng = np.random.default_rng(args.seed + 1)
    ms = []
    prof = None
    for s in range(-3, args.steps):
        if s == 0 and args.profile:
            from torch.profiler import profile, ProfilerActivity
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        idx = torch.from_numpy(rng.integers(0, xtr.shape[0], args.batch))
        t0 = time.perf_counter()
        step(model, opt, sched, xtr[idx], ytr[idx])
        if s >= 0:
            ms.append(1e3 * (time.perf_counter() - t0))
    if prof is not None:
        prof.__exit__(None, None, None)
    ms.sort()
    print(f"torch eager    batch {args.batch}, {torch.get_num_threads()} threads: median {ms[len(ms) // 2]:.2f} ms/step "
          f"over {args.steps} steps (min {ms[0]:.2f}, max {ms[-1]:.2f}){'' if have else ' [random images]'}")
    if prof is not None:
        print(f"torch.backends.mkldnn.is_available(): {torch.backends.mkldnn.is_available()}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def train():
    xtr, ytr = load("train", args.limit)
    xte, yte = load("t10k")
    n = xtr.shape[0]
    spe = (n + args.batch - 1) // args.batch
    model, opt, sched = make(spe * args.epochs)
    print(f"torch_fashion: PyTorch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"{n} train / {xte.shape[0]} test images")
    print("epoch  train loss  test acc  images/s")
    g = torch.Generator().manual_seed(args.seed)
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(n, generator=g)
        t0, tot = time.perf_counter(), 0.0
        for s in range(0, n, args.batch):
            idx = order[s:s + args.batch]
            tot += step(model, opt, sched, xtr[idx], ytr[idx]).item() * idx.numel()
        dt = time.perf_counter() - t0
        model.eval()
        with torch.no_grad():
            hits = sum((model(xte[i:i + 500]).argmax(1) == yte[i:i + 500]).sum().item() for i in range(0, xte.shape[0], 500))
        print(f"{epoch:5d}  {tot / n:10.4f}  {100.0 * hits / xte.shape[0]:7.2f}%  {n / dt:8.0f}", flush=True)


if args.epochs:
    train()
else:
    bench()
