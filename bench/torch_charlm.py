#!/usr/bin/python3
"""torch_charlm.py — PyTorch 1.13 eager twin of examples/charlm's training step.

The same model (token + learned position embeddings; per layer pre-LayerNorm,
causal multi-head self-attention with one qkv projection, residual,
pre-LayerNorm, 4x exact-GELU MLP, residual; final LayerNorm; untied output
layer with bias), the same initialisation scheme (embeddings and linear
weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 layers)),
biases 0, LayerNorm 1/0), the same batch of random windows of the fortune
text (byte vocabulary of the corpus), the same step: zero_grad, forward,
mean cross-entropy, backward, clip_grad_norm_(1.0), warm-up + cosine
learning rate, AdamW (betas 0.9/0.99, eps 1e-8, weight decay 0.01).
PyTorch 1.13 has no F.scaled_dot_product_attention: attention is written
out (q k^T * scale, causal mask, softmax, @ v), which is also what Kiln's
kl_scaled_dot_product_attention computes on the CPU.

Times the step: 2 warm-up steps, then the median (and quartiles) of N steps.

    /usr/bin/python3 bench/torch_charlm.py [--threads T] [--steps N] [--batch B]
        [--layers L] [--heads H] [--embed C] [--context T] [--data PATH]
"""
import argparse
import math
import os
import sys

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=20, help="timed steps")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--embed", type=int, default=128)
ap.add_argument("--context", type=int, default=128)
ap.add_argument("--lr", type=float, default=2e-3)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--data", default=None, help="fortune folder or text file (default $KILN_DATA_DIR/fortunes or data/fortunes)")
args = ap.parse_args()

# Debian's torch calls the system OpenBLAS (pthread build), which reads its
# thread count from the environment when it loads: set it before the import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)


def read_corpus(path):
    """The bytes charlm reads: a file, or a folder's regular files (no *.dat, no SOURCES) by name."""
    if os.path.isdir(path):
        parts = []
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            if name.startswith(".") or name == "SOURCES" or name.endswith(".dat"):
                continue
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            with open(full, "rb") as f:
                parts.append(f.read())
        return b"".join(parts)
    with open(path, "rb") as f:
        return f.read()


class Block(torch.nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln1 = torch.nn.LayerNorm(c)
        self.qkv = torch.nn.Linear(c, 3 * c)
        self.proj = torch.nn.Linear(c, c)
        self.ln2 = torch.nn.LayerNorm(c)
        self.fc = torch.nn.Linear(c, 4 * c)
        self.mproj = torch.nn.Linear(4 * c, c)

    def attention(self, x, mask):
        b, t, c = x.shape
        h, d = self.h, c // self.h
        q, k, v = self.qkv(x).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        att = att.masked_fill(~mask[:t, :t], float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        return x + self.mproj(F.gelu(self.fc(self.ln2(x))))


class CharLM(torch.nn.Module):
    def __init__(self, vocab, layers, heads, embed, context):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, embed)
        self.pos = torch.nn.Embedding(context, embed)
        self.blocks = torch.nn.ModuleList(Block(embed, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(embed)
        self.head = torch.nn.Linear(embed, vocab)
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).tril())
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif "ln" in name:
                torch.nn.init.ones_(p)
            elif name.endswith("proj.weight"):
                torch.nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            else:
                torch.nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln_f(x))


def lr_at(step, base, warmup, total, min_lr):
    """kl_lr_cosine_warmup."""
    if step < warmup:
        return base * (step + 1) / warmup
    if step >= total:
        return min_lr
    return min_lr + (base - min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


def main():
    path = args.data or os.path.join(os.environ.get("KILN_DATA_DIR") or "data", "fortunes")
    try:
        text = read_corpus(path)
    except OSError as e:
        sys.exit(f"torch_charlm: {e}; run scripts/fetch_fortunes.sh (or pass --data PATH)")
    vocab = sorted(set(text))
    lut = torch.full((256,), -1, dtype=torch.long)
    lut[torch.tensor(vocab)] = torch.arange(len(vocab))
    data = lut[torch.frombuffer(bytearray(text), dtype=torch.uint8).long()]
    torch.manual_seed(args.seed)
    B, T = args.batch, args.context
    model = CharLM(len(vocab), args.layers, args.heads, args.embed, T)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    nparams = sum(p.numel() for p in model.parameters())
    total = args.steps + 2
    warmup = max(1, total // 10)

    def step(s):
        starts = torch.randint(0, len(data) - T - 1, (B,))
        x = torch.stack([data[i:i + T] for i in starts.tolist()])
        y = torch.stack([data[i + 1:i + T + 1] for i in starts.tolist()])
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(s, args.lr, warmup, total, args.lr / 10)
        opt.step()
        dt = time.perf_counter() - t0
        return dt, loss.item()

    for s in range(2):
        step(s)
    times = []
    for s in range(2, total):
        dt, loss = step(s)
        times.append(dt)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
    print(f"torch_charlm: PyTorch {torch.__version__}, {torch.get_num_threads()} threads, {args.layers} layers, "
          f"{args.heads} heads, embedding {args.embed}, context {T}, batch {B}, vocabulary {len(vocab)}, "
          f"{nparams} parameters")
    print(f"torch eager median {1e3 * med:8.2f} ms/step over {n} steps (q1 {1e3 * times[n // 4]:.2f}, "
          f"q3 {1e3 * times[(3 * n) // 4]:.2f}), {B * T / med:.0f} tokens/s; last loss {loss:.4f}")


if __name__ == "__main__":
    main()
