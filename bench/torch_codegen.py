#!/usr/bin/python3
"""torch_codegen.py — PyTorch 1.13 side of bench/codegen_bench.c.

The workloads of shared/WORKLOADS.md written with the same primitive ops as
codegen_bench.c (chain5, gelu, softmax, layernorm, xent, mlp, adamw in place),
in torch eager and TorchScript (torch.jit.script; the mlp as a frozen module
with optimize_for_inference, its weights being constants there), at the same
sizes and thread count, same method: warm-up (TorchScript's profiling executor
specializes during it), then at least 10 repetitions and 0.5 s, median and
interquartile range. Output lines use codegen_bench's format so
bench/run_codegen_bench.sh can join them:

  RES <workload> <size> <system> <median ms> <q1 ms> <q3 ms> <floor bytes> <flops>
  FUSER <what>: <value>          (TorchScript's CPU fuser state, see below)
  PROBE ...                      (what happens when the CPU fuser is forced on)

    /usr/bin/python3 bench/torch_codegen.py [threads] [filter ...]

KB_QUICK=1 cuts the method to 3 repetitions and 0.05 s (development only).
"""
import math
import os
import sys

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
filters = sys.argv[2:]
# Debian's torch uses the system OpenBLAS and OpenMP, which read their thread
# counts from the environment when they load: set them before the import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(threads))
os.environ.setdefault("OMP_NUM_THREADS", str(threads))

import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(threads)
QUICK = os.environ.get("KB_QUICK", "0") not in ("", "0")
MIN_REPS, MIN_TIME = (3, 0.05) if QUICK else (10, 0.5)


def timeit(fn, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < MIN_REPS or time.perf_counter() - start < MIN_TIME:
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    times.sort()
    n = len(times)
    return times[n // 2], times[n // 4], times[(3 * n) // 4]


def res(wl, size, system, t, nbytes, flops=0):
    med, q1, q3 = t
    print(f"RES {wl:<9s} {size:<10s} {system:<13s} {med * 1e3:10.4f} {q1 * 1e3:10.4f} {q3 * 1e3:10.4f} "
          f"{nbytes:.6g} {flops:.6g}", flush=True)


# ---- the workloads, primitive ops in the order of codegen_bench.c ---------------

def chain5(x):
    return torch.tanh(torch.sigmoid(x * 2 + 1) * x)


def chain5_probe(x):
    # a separate function: torch.jit.script caches per Python function, and the
    # probe's fused plans must not leak into the timed chain5
    return torch.tanh(torch.sigmoid(x * 2 + 1) * x)


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


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
    h = F.gelu(torch.matmul(x, w1) + b1)
    return torch.matmul(h, w2) + b2


class MLP(torch.nn.Module):
    def __init__(self, w1, b1, w2, b2):
        super().__init__()
        self.w1, self.b1 = torch.nn.Parameter(w1, False), torch.nn.Parameter(b1, False)
        self.w2, self.b2 = torch.nn.Parameter(w2, False), torch.nn.Parameter(b2, False)

    def forward(self, x):
        h = F.gelu(torch.matmul(x, self.w1) + self.b1)
        return torch.matmul(h, self.w2) + self.b2


LR, B1, B2, EPS, WD, T = 1e-3, 0.9, 0.999, 1e-8, 1e-2, 10
BC1, BC2 = 1 - B1 ** T, 1 - B2 ** T


def adamw(p, g, m, v):
    p.mul_(1 - LR * WD)
    m.mul_(B1).add_(g * (1 - B1))
    v.mul_(B2).add_(g * g * (1 - B2))
    den = torch.sqrt(v / BC2) + EPS
    p.sub_(m / den * (LR / BC1))
    return p


def adamw_script(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # TorchScript has no closure over module constants: the same step, literal scalars
    p.mul_(1 - 1e-3 * 1e-2)
    m.mul_(0.9).add_(g * (1 - 0.9))
    v.mul_(0.999).add_(g * g * (1 - 0.999))
    den = torch.sqrt(v / (1 - 0.999 ** 10)) + 1e-8
    p.sub_(m / den * (1e-3 / (1 - 0.9 ** 10)))
    return p


def selected(wl, size):
    return not filters or any(f in f"{wl}/{size}" for f in filters)


def bench(wl, size, fn, args, nbytes, flops=0, script=None):
    res(wl, size, "torch_eager", timeit(lambda: fn(*args)), nbytes, flops)
    sf = script if script is not None else torch.jit.script(fn)
    with torch.no_grad():
        res(wl, size, "torch_script", timeit(lambda: sf(*args), warmup=5), nbytes, flops)


def fuser_state():
    c = torch._C
    print(f"FUSER texpr_fuser_enabled: {c._jit_texpr_fuser_enabled()}")
    print(f"FUSER can_fuse_on_cpu: {c._jit_can_fuse_on_cpu()}")
    print(f"FUSER llvm_enabled: {c._llvm_enabled()}")
    print(f"FUSER te_must_use_llvm_cpu: {c._jit_get_te_must_use_llvm_cpu()}")
    cap = [ln.strip() for ln in torch.__config__.show().splitlines() if "CPU capability" in ln]
    print(f"FUSER {cap[0] if cap else 'CPU capability: unknown'}", flush=True)


def fuser_probe():
    """Forces TorchScript's CPU fuser on, on a small chain5, and says what it did."""
    c = torch._C
    n = 1 << 12
    x = torch.randn(n)
    eager = timeit(lambda: chain5(x))
    c._jit_override_can_fuse_on_cpu(True)
    for must_llvm in (True, False):
        c._jit_set_te_must_use_llvm_cpu(must_llvm)
        sf = torch.jit.script(chain5_probe)
        head = f"PROBE override_can_fuse_on_cpu=True te_must_use_llvm_cpu={must_llvm}:"
        try:
            for _ in range(3):
                sf(x)
        except RuntimeError as e:
            print(f"{head} the scripted call fails: RuntimeError: {str(e).splitlines()[0]}", flush=True)
            continue
        graph = str(torch.jit.last_executed_optimized_graph())
        fused = "TensorExprGroup" in graph
        t = timeit(lambda: sf(x), warmup=0) if fused else None
        err = float((sf(x) - chain5(x)).abs().max())
        print(f"{head} fusion group formed: {fused}; chain5 2^12 " +
              (f"fused {t[0] * 1e3:.3f} ms vs eager {eager[0] * 1e3:.3f} ms ({t[0] / eager[0]:.0f}x slower), "
               if fused else f"unfused (eager {eager[0] * 1e3:.3f} ms), ") + f"max |diff| {err:.2g}", flush=True)
    c._jit_set_te_must_use_llvm_cpu(True)
    c._jit_override_can_fuse_on_cpu(False)


def main():
    print(f"INFO torch_codegen: {torch.get_num_threads()} threads, PyTorch {torch.__version__}"
          + (", KB_QUICK (numbers not for reporting)" if QUICK else ""), flush=True)
    fuser_state()
    if not filters or "probe" in filters:
        fuser_probe()
    torch.manual_seed(0)
    for n in (1 << 16, 1 << 20, 1 << 24):
        if selected("chain5", n):
            bench("chain5", str(n), chain5, (torch.randn(n),), 8.0 * n)
    for n in (1 << 16, 1 << 20, 1 << 24):
        if selected("gelu", n):
            bench("gelu", str(n), gelu, (torch.randn(n),), 8.0 * n)
    for r, c in ((4096, 1024), (256, 4096)):
        if selected("softmax", f"{r}x{c}"):
            bench("softmax", f"{r}x{c}", softmax, (torch.randn(r, c),), 8.0 * r * c)
    for r, c in ((4096, 1024), (256, 4096)):
        if selected("layernorm", f"{r}x{c}"):
            bench("layernorm", f"{r}x{c}", layernorm, (torch.randn(r, c), torch.randn(c), torch.randn(c)),
                  8.0 * r * c + 8.0 * c)
    b, c = 4096, 1000
    if selected("xent", f"{b}x{c}"):
        bench("xent", f"{b}x{c}", xent, (torch.randn(b, c), torch.randint(0, c, (b,))), 4.0 * b * c + 8.0 * b + 4)
    m, k, h, n = 256, 1024, 4096, 1024
    if selected("mlp", "256x1024"):
        w1, b1 = torch.randn(k, h) / math.sqrt(k), torch.randn(h)
        w2, b2 = torch.randn(h, n) / math.sqrt(h), torch.randn(n)
        x = torch.randn(m, k)
        mod = torch.jit.script(MLP(w1, b1, w2, b2).eval())
        try:
            mod = torch.jit.optimize_for_inference(torch.jit.freeze(mod))
        except Exception as e:  # noqa: BLE001 - report and keep the frozen module
            print(f"NOTE mlp optimize_for_inference failed: {e}")
            mod = torch.jit.freeze(torch.jit.script(MLP(w1, b1, w2, b2).eval()))
        res("mlp", "256x1024", "torch_eager", timeit(lambda: mlp(x, w1, b1, w2, b2)), 0, 2.0 * m * k * h + 2.0 * m * h * n)
        with torch.no_grad():
            res("mlp", "256x1024", "torch_script", timeit(lambda: mod(x), warmup=5), 0, 2.0 * m * k * h + 2.0 * m * h * n)
    n = 10_000_000
    if selected("adamw", "10M"):
        p, g, mm, v = torch.randn(n), torch.randn(n), torch.randn(n) * 0.1, torch.randn(n).abs() * 0.01
        bench("adamw", "10M", adamw, (p, g, mm, v), 28.0 * n, script=torch.jit.script(adamw_script))


main()
