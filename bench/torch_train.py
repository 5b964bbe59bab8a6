#!/usr/bin/python3
"""torch_train.py — PyTorch 1.13 eager reference for bench/train_bench.c.

The digits_step workload of shared/WORKLOADS.md: MLP 64 -> 256 -> 256 -> 10
with (exact, erf) GELU, mean cross-entropy, backward, AdamW (lr 1e-3, wd 1e-2),
on random inputs (randn, fixed seed) and random labels. Same method and output
format as train_bench.c: warm-up, then at least 10 steps and 0.5 s, median
and interquartile range of one step (zero_grad + forward + backward + step).

    /usr/bin/python3 bench/torch_train.py [threads] [batch ...]
"""
import os
import sys

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
batches = [int(b) for b in sys.argv[2:]] or [64, 256]
# Debian's torch calls the system OpenBLAS (pthread build), which reads its
# thread count from the environment when it loads: set it before the import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(threads))
os.environ.setdefault("OMP_NUM_THREADS", str(threads))

import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(threads)


def timeit(fn):
    for _ in range(3):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < 10 or time.perf_counter() - start < 0.5:
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    times.sort()
    n = len(times)
    return times[n // 2], times[n // 4], times[(3 * n) // 4]


def main():
    print(f"torch_train: {torch.get_num_threads()} threads, PyTorch {torch.__version__}")
    for batch in batches:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.GELU(),
            torch.nn.Linear(256, 256), torch.nn.GELU(),
            torch.nn.Linear(256, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
        x = torch.randn(batch, 64)
        y = torch.randint(0, 10, (batch,))

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        med, q1, q3 = timeit(step)
        print(f"digits_step batch {batch:4d}  {med * 1e3:8.3f} ms  [{q1 * 1e3:8.3f}, {q3 * 1e3:8.3f}]")


main()
