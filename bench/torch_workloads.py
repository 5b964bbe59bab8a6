#!/usr/bin/env python3
"""torch_workloads.py — the PyTorch side of kiln-bench --compare torch.

shared/WORKLOADS.md's standard workloads written with the same primitive ops
as src/bench/workloads.c (keep the two in step), at the same sizes (small,
medium, large as that file's size table), thread count and method (warm-up,
then at least --min-runs calls and --min-time seconds; median and quartiles
by linear interpolation, as kl_bench). Systems: PyTorch eager, TorchScript
(torch.jit.script; for the training steps the scripted forward and loss, with
eager backward and torch.optim.AdamW) and torch.compile when PyTorch >= 2.

Output, one line each, read by kiln-bench:
  SYS <system> ok <torch version>           a system that runs
  SYS <system> not-installed <why>          one that does not (never omitted)
  RES <workload> <system> <size> <median_s> <q1_s> <q3_s> <runs>
  ERR <workload> <system> <message>

    python3 bench/torch_workloads.py --size medium --threads 2 --workloads chain5,mlp
    python3 bench/torch_workloads.py --device cuda --size large      # on a GPU
"""
import argparse
import math
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--size", default="medium", choices=["small", "medium", "large"])
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--min-time", type=float, default=0.5)
ap.add_argument("--min-runs", type=int, default=10)
ap.add_argument("--warmup", type=int, default=3)
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
ap.add_argument("--workloads", default="chain5,gelu,softmax,layernorm,xent,mlp,mlp_step,digits_step,adamw,attention")
args = ap.parse_args()

SYSTEMS = ["torch_eager", "torchscript", "torch_compile"]
# Debian's torch reads its BLAS / OpenMP thread counts when it loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
try:
    import torch
    import torch.nn.functional as F  # noqa: F401
except Exception as e:  # noqa: BLE001 - any import failure means "not installed"
    for s in SYSTEMS:
        print(f"SYS {s} not-installed python3 cannot import torch ({type(e).__name__}: {e})", flush=True)
    sys.exit(0)

torch.set_num_threads(args.threads)
if args.device == "cuda" and not torch.cuda.is_available():
    for s in SYSTEMS:
        print(f"SYS {s} not-installed torch {torch.__version__} sees no CUDA device", flush=True)
    sys.exit(0)
# CUDA calls return before the GPU finishes: each timed call ends with a
# synchronize, as kiln-bench's CUDA rows do.
sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
MAJOR = int(torch.__version__.split(".")[0])
print(f"SYS torch_eager ok torch {torch.__version__}", flush=True)
print(f"SYS torchscript ok torch.jit.script, torch {torch.__version__}", flush=True)
if MAJOR >= 2:
    print(f"SYS torch_compile ok torch.compile, torch {torch.__version__}", flush=True)
else:
    print(f"SYS torch_compile not-installed torch.compile needs PyTorch >= 2 (installed: {torch.__version__})",
          flush=True)
S = ["small", "medium", "large"].index(args.size)


def quartiles(t):
    t = sorted(t)
    n = len(t)

    def at(p):
        r = p * (n - 1)
        lo = int(math.floor(r))
        return t[-1] if lo >= n - 1 else t[lo] + (r - lo) * (t[lo + 1] - t[lo])
    return at(0.25), at(0.5), at(0.75)


def timeit(fn):
    for _ in range(args.warmup):
        fn()
    sync()
    times, total = [], 0.0
    while len(times) < args.min_runs or total < args.min_time:
        s = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - s)
        total += times[-1]
    q1, med, q3 = quartiles(times)
    return med, q1, q3, len(times)


# ---- the workloads (src/bench/workloads.c) ----------------------------------------

def chain5(x):
    return torch.tanh(torch.sigmoid(x * 2 + 1) * x)


def gelu(x):
    x3 = x * 0.044715 * x * x
    return x * 0.5 * (torch.tanh((x + x3) * 0.7978845608) + 1)


def softmax(x):
    e = torch.exp(x - torch.amax(x, -1, True))
    return e / torch.sum(e, -1, True)


def layernorm(x, w, b):
    d = x - torch.mean(x, -1, True)
    v = torch.mean(d * d, -1, True)
    return d * torch.rsqrt(v + 1e-5) * w + b


def xent(x, t):
    s = x - torch.amax(x, -1, True)
    ls = s - torch.log(torch.sum(torch.exp(s), -1, True))
    return -torch.mean(torch.gather(ls, 1, t.unsqueeze(1)))


def mlp(x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(x @ w1 + b1)
    return h @ w2 + b2


def mlp_loss(x, target, w1, b1, w2, b2):
    return torch.nn.functional.mse_loss(mlp(x, w1, b1, w2, b2), target)


def digits_loss(x, y, w1, b1, w2, b2, w3, b3):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
    h = torch.nn.functional.gelu(torch.nn.functional.linear(h, w2, b2))
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w3, b3), y)


def adamw(p, g, m, v):
    bc1, bc2 = 1 - 0.9 ** 10, 1 - 0.999 ** 10
    p.mul_(1 - 1e-3 * 1e-2)
    m.mul_(0.9).add_(g * (1 - 0.9))
    v.mul_(0.999).add_(g * g * (1 - 0.999))
    den = torch.sqrt(v / bc2) + 1e-8
    return p.sub_(m / den * (1e-3 / bc1))


def attention(x, wqkv, wo, lw, lb, mask):
    B, T, C = x.shape
    H = 8
    D = C // H
    qkv = (x @ wqkv).reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(D))
    pr = softmax(s.masked_fill(mask, float("-inf")))
    o = (pr @ v).permute(0, 2, 1, 3).reshape(B, T, C)
    return layernorm(x + o @ wo, lw, lb)


def randn(*shape, scale=1.0):
    t = torch.randn(*shape)
    return t if scale == 1.0 else t * scale


def case(wid):
    """(size name, function, inputs, parameters or None) at args.size, as workloads.c."""
    torch.manual_seed(0)
    if wid in ("chain5", "gelu"):
        n = [1 << 16, 1 << 20, 1 << 24][S]
        return str(n), globals()[wid], [randn(n)], None
    if wid == "adamw":
        n = [1 << 16, 1 << 20, 10000000][S]
        return str(n), adamw, [randn(n), randn(n), randn(n, scale=0.1), torch.randn(n).abs() * 0.01], None
    if wid in ("softmax", "layernorm"):
        R, C = [(64, 256), (256, 4096), (4096, 1024)][S]
        ins = [randn(R, C)] + ([randn(C), randn(C)] if wid == "layernorm" else [])
        return f"{R}x{C}", globals()[wid], ins, None
    if wid == "xent":
        B, C = (256, 100) if S == 0 else (4096, 1000)
        return f"{B}x{C}", xent, [randn(B, C), torch.randint(0, C, (B,))], None
    if wid in ("mlp", "mlp_step"):
        M, K = (32, 128) if S == 0 else (256, 1024)
        H, N = 4 * K, K
        x = randn(M, K)
        w = [randn(K, H, scale=1 / math.sqrt(K)), randn(H, scale=0.1), randn(H, N, scale=1 / math.sqrt(H)),
             randn(N, scale=0.1)]
        if wid == "mlp":
            return f"{M}x{K}", mlp, [x] + w, None
        return f"{M}x{K}", mlp_loss, [x, randn(M, N)], w
    if wid == "digits_step":
        B = 32 if S == 0 else 256
        dims = [64, 256, 256, 10]
        x, y = randn(B, 64), torch.randint(0, 10, (B,))
        w = []
        for l in range(3):
            k = 1 / math.sqrt(dims[l])
            w += [randn(dims[l + 1], dims[l], scale=k), randn(dims[l + 1], scale=k)]
        return f"b{B}", digits_loss, [x, y], w
    if wid == "attention":
        B, T, C = (2, 32, 64) if S == 0 else (8, 256, 512)
        ins = [randn(B, T, C), randn(C, 3 * C, scale=1 / math.sqrt(C)), randn(C, C, scale=1 / math.sqrt(C)),
               randn(C), randn(C, scale=0.1), torch.triu(torch.ones(T, T, dtype=torch.bool), 1)]
        return f"{B}x{T}x{C}", attention, ins, None
    raise ValueError(f"unknown workload {wid}")


def runner(fn, ins, params):
    """A no-argument callable doing one call (a training step for params)."""
    if params is None:
        def call():
            with torch.no_grad():
                fn(*ins)
        return call
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2)

    def step():
        opt.zero_grad(set_to_none=True)
        fn(*ins, *ps).backward()
        opt.step()
    return step


def on_device(c):
    """case()'s tensors, drawn on the CPU (same seeds), moved to --device."""
    size, fn, ins, params = c
    dev = torch.device(args.device)
    return size, fn, [t.to(dev) for t in ins], None if params is None else [p.to(dev) for p in params]


for wid in args.workloads.split(","):
    try:
        size, fn, ins, params = on_device(case(wid))
    except Exception as e:  # noqa: BLE001
        for s in SYSTEMS:
            print(f"ERR {wid} {s} {type(e).__name__}: {e}", flush=True)
        continue
    systems = [("torch_eager", lambda f: f), ("torchscript", torch.jit.script)]
    if MAJOR >= 2:
        systems.append(("torch_compile", torch.compile))
    for name, wrap in systems:
        try:
            f = wrap(fn)
            med, q1, q3, runs = timeit(runner(f, [t.clone() for t in ins], params))
            print(f"RES {wid} {name} {size} {med:.6g} {q1:.6g} {q3:.6g} {runs}", flush=True)
        except Exception as e:  # noqa: BLE001
            msg = " ".join(str(e).split())[:150]
            print(f"ERR {wid} {name} {type(e).__name__}: {msg}", flush=True)
