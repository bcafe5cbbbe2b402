"""tandem against PyTorch, side by side: the same models, shapes, batch sizes,
optimizer, schedule and data (f32, 2 threads).

Run through bench/train_vs_pytorch, which builds tandem and sets up bench/.venv.
Each row trains with `tandem train` and with PyTorch eager for at least
--seconds (8) each, alternating which goes first, for --rounds (3) rounds;
throughput is samples per second over the training steps, batch gathering
included, evaluation excluded; the medians are printed with their min-max.
Floors (CPU):
  MNIST MLP batch 64 >= 2x PyTorch, LeNet-5 batch 64 >= 1.5x, GPT-tiny batch 32
  >= 1.2x, MNIST MLP batch 1024 >= 1.2x, GPT (4 layers, 8 heads, 512 channels,
  context 128) batch 16 >= 1.2x;
  GPT on llm.c's config (vocabulary 256, 4 layers, 4 heads, 256 channels,
  batch 8 x context 128, AdamW): tandem at >= 55% of this machine's 2-thread
  FMA peak, which the bench measures with a small C program of its own.
--full trains long enough for the accuracy floors and checks them too.

--precision bf16 runs the bf16 rows (GPT-tiny, MLP batch 1024, GPT-512):
tandem with --precision bf16 against PyTorch under torch.autocast(dtype=
torch.bfloat16), and tandem in f32 beside them in every round. Floors: where
the CPU has AVX512-BF16 or AMX, tandem bf16 >= 1.2x PyTorch autocast; where it
has neither, tandem bf16 >= 0.95x tandem f32. The bench says which case it
measured.

--devices cuda:0 --torch-device cuda compares on a GPU: PyTorch keeps the
training images on the GPU and waits for it (torch.cuda.synchronize) before
reading the clock; the first three rows run, with the GPU floors (MLP >= 2x
PyTorch eager, where launch overhead dominates; GPT-tiny >= 1x; LeNet-5 has
none), one round of 3 s unless --rounds and --seconds say otherwise.
"""
import argparse
import gzip
import json
import math
import os
import statistics
import tempfile
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST = os.path.join(ROOT, "data", "mnist")
TEXT = os.path.join(ROOT, "data", "text", "tinyshakespeare.txt")

# Llama-512's SwiGLU hidden features: 4 x 512 x 2/3 rounded up to a multiple of 32.
LLAMA_HIDDEN = 1376

# name, model file (or a GPT's shape: gpt=(layers, heads, channels), or a
# Llama's: llama=(layers, heads, kv_heads, channels, hidden)), data,
# batch, optimizer, lr, full run, floors: speed_floor against PyTorch on CPUs,
# gpu_floor on a GPU (None: no floor), peak_floor: the share of the FMA peak
# (None: none); cpu_only: not a GPU row. label: the name in the summary lines
# scripts/gpu-check reads.
MODELS = [
    dict(name="mnist_mlp", label="MLP", file="examples/mnist_mlp.json", data=MNIST, batch=64,
         opt="sgd", lr=0.05, full_epochs=3, speed_floor=2.0, gpu_floor=2.0,
         metric="test accuracy", floor=0.975),
    dict(name="lenet5", label="LeNet-5", file="examples/lenet5.json", data=MNIST, batch=64,
         opt="sgd", lr=0.05, full_epochs=3, speed_floor=1.5, gpu_floor=None,
         metric="test accuracy", floor=0.988),
    dict(name="gpt_tiny", label="GPT-tiny", file="examples/gpt_tiny.json", data=TEXT,
         gpt=(4, 4, 128), batch=32, opt="adamw", lr=1e-3, full_steps=3000, warmup=100, clip=1.0,
         speed_floor=1.2, gpu_floor=1.0, metric="validation loss", floor=1.8, bf16=True),
    dict(name="mnist_mlp_1024", label="MLP-1024", file="examples/mnist_mlp.json", data=MNIST,
         batch=1024, opt="sgd", lr=0.05, speed_floor=1.2, cpu_only=True, bf16=True),
    dict(name="gpt_512", label="GPT-512", gpt=(4, 8, 512), data=TEXT, batch=16, opt="adamw",
         lr=3e-4, warmup=100, clip=1.0, speed_floor=1.2, cpu_only=True, bf16=True),
    dict(name="llama_512", label="Llama-512", llama=(4, 8, 2, 512, LLAMA_HIDDEN), data=TEXT,
         batch=16, opt="adamw", lr=3e-4, warmup=100, clip=1.0, speed_floor=1.2, cpu_only=True),
    dict(name="gpt_llmc", label="GPT-llm.c", gpt=(4, 4, 256), data=TEXT, batch=8, opt="adamw",
         lr=3e-4, warmup=100, clip=1.0, speed_floor=None, peak_floor=0.55, cpu_only=True),
]

CONTEXT, VOCAB = 128, 256
ROPE_THETA = 10000.0
# The schedule's length: long enough that a timed round never reaches it.
NOMINAL_STEPS = 1000000


def gpt_json(layers, heads, c):
    """examples/gpt_tiny.json's layers at another size."""
    block = [{"type": "residual", "layers": [{"type": "layernorm"},
                                             {"type": "attention", "heads": heads}]},
             {"type": "residual", "layers": [{"type": "layernorm"},
                                             {"type": "linear", "out": 4 * c}, {"type": "gelu"},
                                             {"type": "linear", "out": c}]}]
    return {"name": "gpt_%d_%d_%d" % (layers, heads, c),
            "input": {"tokens": CONTEXT, "vocab": VOCAB},
            "layers": [{"type": "embedding", "vocab": VOCAB, "dim": c, "positions": True},
                       {"type": "repeat", "count": layers, "layers": block},
                       {"type": "layernorm"}, {"type": "linear", "out": VOCAB}]}


def llama_json(layers, heads, kv_heads, c, hidden):
    """examples/llama_tiny.json's layers at another size."""
    block = [{"type": "residual", "layers": [
                 {"type": "rmsnorm", "eps": 1e-5},
                 {"type": "attention", "heads": heads, "kv_heads": kv_heads,
                  "rope_theta": ROPE_THETA, "qkv_bias": False, "proj_bias": False}]},
             {"type": "residual", "layers": [{"type": "rmsnorm", "eps": 1e-5},
                                             {"type": "swiglu", "hidden": hidden}]}]
    return {"name": "llama_%d_%d_%d_%d" % (layers, heads, kv_heads, c),
            "input": {"tokens": CONTEXT, "vocab": VOCAB},
            "layers": [{"type": "embedding", "vocab": VOCAB, "dim": c, "positions": False},
                       {"type": "repeat", "count": layers, "layers": block},
                       {"type": "rmsnorm", "eps": 1e-5},
                       {"type": "linear", "out": VOCAB, "bias": False}]}


def model_file(spec, workdir):
    if "file" in spec:
        return os.path.join(ROOT, spec["file"])
    path = os.path.join(workdir, spec["name"] + ".json")
    with open(path, "w") as f:
        json.dump(llama_json(*spec["llama"]) if "llama" in spec else gpt_json(*spec["gpt"]), f)
    return path


def flops_per_token(layers, c, t=CONTEXT, v=VOCAB):
    """6 x the parameters of the blocks and the head (the final layer norm with it), plus
    attention's 6 C T per layer."""
    block = 12 * c * c + 13 * c
    params = layers * block + 2 * c + c * v + v
    return 6 * params + 6 * c * t * layers, params


# The machine's FMA peak: every thread multiply-adds into 12 independent
# vector accumulators (the widest vectors -march=native gives), so the FMA
# units, not their latency, set the pace.
PEAK_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef __AVX512F__
#define VB 64
#else
#define VB 32
#endif
typedef float vf __attribute__((vector_size(VB)));
#define ACC 12
static long iters;
static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
static void *run(void *arg) {
    vf a[ACC], b, c;
    float sum = 0;
    for (int k = 0; k < ACC; k++) for (int j = 0; j < VB / 4; j++) a[k][j] = 1.0f + k + j;
    for (int j = 0; j < VB / 4; j++) { b[j] = 0.999999f; c[j] = 1e-7f; }
    double t0 = now();
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < ACC; k++) a[k] = a[k] * b + c;
    *(double *)arg = now() - t0;
    for (int k = 0; k < ACC; k++) for (int j = 0; j < VB / 4; j++) sum += a[k][j];
    if (sum == 12345.0f) puts("");
    return NULL;
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    pthread_t th[64]; double secs[64], worst = 0;
    iters = atol(argv[2]);
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, run, &secs[i]);
    for (int i = 0; i < n; i++) { pthread_join(th[i], NULL); if (secs[i] > worst) worst = secs[i]; }
    printf("%.3f\n", 2.0 * ACC * (VB / 4) * (double)iters * n / worst * 1e-9);
    return 0;
}
"""


def fma_peak(workdir, threads=2):
    """GFLOP/s of `threads` threads multiply-adding, best of 5 runs."""
    src, exe = os.path.join(workdir, "fma_peak.c"), os.path.join(workdir, "fma_peak")
    with open(src, "w") as f:
        f.write(PEAK_C)
    subprocess.run(["cc", "-O3", "-march=native", "-ffp-contract=fast", "-pthread", src, "-o",
                    exe], check=True)
    return max(float(subprocess.run([exe, str(threads), "100000000"], capture_output=True,
                                    text=True, check=True).stdout) for _ in range(5))


# Data, read and normalised as tandem does (docs/train.md) ---------------------

def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def mnist():
    def part(prefix):
        x = read_idx(os.path.join(MNIST, prefix + "-images-idx3-ubyte.gz"))
        y = read_idx(os.path.join(MNIST, prefix + "-labels-idx1-ubyte.gz"))
        x = ((x.astype(np.float32) / 255.0 - 0.1307) / 0.3081).reshape(-1, 1, 28, 28)
        return torch.from_numpy(x.copy()), torch.from_numpy(y.astype(np.int64))
    return part("train"), part("t10k")


def text():
    data = np.frombuffer(open(TEXT, "rb").read(), dtype=np.uint8).astype(np.int64)
    n = int(len(data) * 0.9)
    return torch.from_numpy(data[:n].copy()), torch.from_numpy(data[n:].copy())


# The same models as examples/*.json ------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                                 nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.net(x)


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln1, self.att = nn.LayerNorm(c), Attention(c, heads)
        self.ln2 = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):
        x = x + self.att(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTTiny(nn.Module):
    def __init__(self, vocab=256, c=128, t=128, layers=4, heads=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(t, c)
        self.blocks = nn.Sequential(*[Block(c, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(c), nn.Linear(c, vocab)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.wte(idx) + self.wpe(pos))))


def rms_norm(c):
    """torch.nn.RMSNorm where this PyTorch has it (2.4 on), else Llama's own."""
    if hasattr(nn, "RMSNorm"):
        return nn.RMSNorm(c, eps=1e-5)
    return LlamaRMSNorm(c)


class LlamaRMSNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(c))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


# scaled_dot_product_attention's enable_gqa (PyTorch 2.5 on): grouped key and
# value heads without copying them out per query head first.
SDPA_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


class LlamaAttention(nn.Module):
    """tandem's attention with kv_heads and rope_theta (docs/models.md): one
    projection, q's rows then k's then v's; rotary positions in transformers'
    rotate_half form, the pairs (j, j + d/2) of each head turned by position x
    theta^(-2j/d); key/value head j serves query heads [j g, (j + 1) g)."""

    def __init__(self, c, heads, kv_heads, t=CONTEXT):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv_heads, c // heads
        self.qkv = nn.Linear(c, (heads + 2 * kv_heads) * self.d, bias=False)
        self.proj = nn.Linear(c, c, bias=False)
        inv = ROPE_THETA ** (-torch.arange(0, self.d, 2, dtype=torch.float64) / self.d)
        ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]  # (T, d/2)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def rope(self, x):  # x (B, heads, T, d)
        t, h = x.shape[2], self.d // 2
        c, s = self.cos[:t], self.sin[:t]
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split((self.heads * self.d, self.kv * self.d, self.kv * self.d), 2)
        q = self.rope(q.view(b, t, self.heads, self.d).transpose(1, 2))
        k = self.rope(k.view(b, t, self.kv, self.d).transpose(1, 2))
        v = v.view(b, t, self.kv, self.d).transpose(1, 2)
        if SDPA_GQA:  # the grouped heads read in place, PyTorch's fastest way here
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # transformers' repeat_kv
            g = self.heads // self.kv
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up one projection (gate's rows first)."""

    def __init__(self, c, hidden):
        super().__init__()
        self.gate_up = nn.Linear(c, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, c, bias=False)

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class LlamaBlock(nn.Module):
    def __init__(self, c, heads, kv_heads, hidden):
        super().__init__()
        self.n1, self.att = rms_norm(c), LlamaAttention(c, heads, kv_heads)
        self.n2, self.mlp = rms_norm(c), SwiGLU(c, hidden)

    def forward(self, x):
        x = x + self.att(self.n1(x))
        return x + self.mlp(self.n2(x))


class Llama(nn.Module):
    """The model llama_json describes: no position table, no biases."""

    def __init__(self, layers, heads, kv_heads, c, hidden, vocab=VOCAB):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.blocks = nn.Sequential(*[LlamaBlock(c, heads, kv_heads, hidden)
                                      for _ in range(layers)])
        self.norm, self.head = rms_norm(c), nn.Linear(c, vocab, bias=False)

    def forward(self, idx):
        return self.head(self.norm(self.blocks(self.wte(idx))))


# PyTorch training ------------------------------------------------------------

def make_optimizer(model, spec, total_steps):
    if spec["opt"] == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.0)
    warm = spec.get("warmup", 0)

    def factor(step):  # tandem's schedule: linear warm-up, then cosine to 0
        if step < warm:
            return (step + 1) / warm
        p = min(1.0, (step - warm) / max(1, total_steps - warm))
        return 0.5 * (1 + math.cos(math.pi * p))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def torch_run(spec, dev, seconds=None, steps=None, full=False, bf16=False):
    """Trains for `seconds` (or `steps`); samples/s over the training steps. bf16:
    the forward and the loss under torch.autocast(dtype=torch.bfloat16), as
    PyTorch's mixed-precision recipe has it (the backward follows the forward's
    dtypes; the weights and optimizer stay f32)."""
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(1)
    b = spec["batch"]
    if spec["data"] == MNIST:
        (xtr, ytr), (xte, yte) = mnist()
        model = MLP() if spec["name"].startswith("mnist_mlp") else LeNet5()
        perm, pos = torch.randperm(len(xtr), generator=g), 0
        # On a GPU the training set lives there, as a fast PyTorch program keeps it.
        xtr_d, ytr_d = xtr.to(dev), ytr.to(dev)
        xte, yte = xte.to(dev), yte.to(dev)

        def batch():
            nonlocal perm, pos
            if pos + b > len(perm):
                perm, pos = torch.randperm(len(xtr), generator=g), 0
            idx = perm[pos:pos + b].to(dev)
            pos += b
            return xtr_d[idx], ytr_d[idx]
    else:
        tr, va = text()
        if "llama" in spec:
            model = Llama(*spec["llama"])
        else:
            layers, heads, c = spec["gpt"]
            model = GPTTiny(c=c, layers=layers, heads=heads)

        def batch():
            s = torch.randint(0, len(tr) - CONTEXT, (b,), generator=g)
            w = torch.stack([tr[i:i + CONTEXT + 1] for i in s.tolist()]).to(dev)
            return w[:, :-1], w[:, 1:]
    model = model.to(dev)
    opt, sched = make_optimizer(model, spec, steps or NOMINAL_STEPS)
    model.train()
    sync(dev)
    t0 = time.perf_counter()
    done = 0
    while (done < steps) if steps else (done == 0 or time.perf_counter() - t0 < seconds):
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        if spec.get("clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        opt.step()
        sched.step()
        done += 1
        if seconds and done % 8 == 0:
            sync(dev)
    steps = done
    sync(dev)
    secs = time.perf_counter() - t0
    result = dict(samples_per_s=steps * b / secs, seconds=secs, final_loss=loss.item())
    if full:
        model.eval()
        with torch.no_grad():
            if spec["data"] == MNIST:
                correct = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                              for i in range(0, len(xte), 1000))
                result["metric"] = correct / len(xte)
            else:
                n = (len(va) - 1) // 128
                w = torch.stack([va[i * 128:i * 128 + 129] for i in range(n)]).to(dev)
                tot = 0.0
                for i in range(0, n, 64):
                    out = model(w[i:i + 64, :-1])
                    tot += F.cross_entropy(out.reshape(-1, 256), w[i:i + 64, 1:].reshape(-1),
                                           reduction="sum").item()
                result["metric"] = tot / (n * 128)
    return result


# tandem ----------------------------------------------------------------------

def interop_check(exe, ckpt):
    """PyTorch loads the weights tandem trained (safetensors) into its own MLP: the test
    accuracy must be what `tandem eval` reports."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        print("  tandem's checkpoint in PyTorch: skipped (no safetensors here)", flush=True)
        return True
    p = subprocess.run([exe, "eval", "--checkpoint", ckpt, "--data", MNIST, "--json"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("tandem eval failed: %s" % p.stderr)
    td_acc = json.loads(p.stdout)["accuracy"]
    w = load_file(ckpt)
    model = MLP()
    for i, j in ((0, 1), (2, 3), (4, 5)):
        model.net[j].weight.data.copy_(w["layers.%d.weight" % i])
        model.net[j].bias.data.copy_(w["layers.%d.bias" % i])
    _, (xte, yte) = mnist()
    with torch.no_grad():
        pt_acc = (model(xte).argmax(1) == yte).float().mean().item()
    ok = abs(pt_acc - td_acc) <= 2e-4  # argmax ties may fall either way, rarely
    print("  tandem's checkpoint in PyTorch: test accuracy %.4f, tandem eval %.4f  %s" %
          (pt_acc, td_acc, "PASS" if ok else "FAIL"), flush=True)
    return ok


def tandem_run(exe, spec, model, devices, seconds=None, steps=None, full=False,
               checkpoint=None, precision="f32"):
    """Trains for `seconds` (or `steps`, or the full run)."""
    cmd = [exe, "train", "--model", model, "--data", spec["data"],
           "--batch", str(spec["batch"]), "--optimizer", spec["opt"], "--lr", str(spec["lr"]),
           "--schedule", "cosine", "--precision", precision, "--devices", devices, "--seed", "1",
           "--no-epoch-eval", "--quiet", "--summary"]
    if spec["opt"] == "sgd":
        cmd += ["--momentum", "0.9"]
    if spec.get("warmup"):
        cmd += ["--warmup", str(spec["warmup"])]
    if spec.get("clip"):
        cmd += ["--clip", str(spec["clip"])]
    if full and "full_epochs" in spec:
        cmd += ["--epochs", str(spec["full_epochs"])]
    elif steps:
        cmd += ["--steps", str(steps)]
    else:
        cmd += ["--steps", str(NOMINAL_STEPS), "--max-seconds", str(seconds)]
    if not full:
        cmd += ["--eval-samples", "256"]
    if checkpoint:
        cmd += ["--checkpoint", checkpoint]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("tandem failed: %s\n%s" % (" ".join(cmd), p.stderr))
    line = [l for l in p.stdout.splitlines() if l.startswith("summary: ")][-1]
    s = json.loads(line[len("summary: "):])
    result = dict(samples_per_s=s["samples_per_s"], seconds=s["train_seconds"],
                  final_loss=s["final_loss"])
    if full:
        result["metric"] = s["test_accuracy"] if spec["data"] == MNIST else s["test_loss"]
    return result


def spread(v):
    return "%s (%s-%s)" % (fmt(statistics.median(v)), fmt(min(v)), fmt(max(v)))


def fmt(x):
    return "%.0f" % x if x >= 100 else "%.1f" % x if x >= 10 else "%.2f" % x


def cpu_has_bf16():
    """Whether this CPU multiplies bf16 itself (AVX512-BF16 or AMX)."""
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo")
                  if l.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def timed_row(a, spec, dev, gpu, workdir):
    """Rounds of tandem and PyTorch, alternating which goes first; in bf16, tandem
    in f32 as well, third or first."""
    model = model_file(spec, workdir)
    bf16 = a.precision == "bf16"
    td, pt, td32 = [], [], []
    print("\n%s: batch %d, %s lr %g, %s, %d rounds of %g s each side" %
          (spec["name"], spec["batch"], spec["opt"], spec["lr"],
           "bf16 (PyTorch autocast)" if bf16 else "f32", a.rounds, a.seconds), flush=True)
    for r in range(a.rounds):
        order = ["tandem", "pytorch"] if r % 2 == 0 else ["pytorch", "tandem"]
        if bf16:
            order = order + ["tandem-f32"] if r % 2 == 0 else ["tandem-f32"] + order
        for side in order:
            if side == "tandem":
                v = tandem_run(a.tandem, spec, model, a.devices, seconds=a.seconds,
                               precision=a.precision)["samples_per_s"]
                td.append(v)
            elif side == "tandem-f32":
                v = tandem_run(a.tandem, spec, model, a.devices, seconds=a.seconds)["samples_per_s"]
                td32.append(v)
            else:
                v = torch_run(spec, dev, seconds=a.seconds, bf16=bf16)["samples_per_s"]
                pt.append(v)
            print("  round %d: %-10s %10.1f samples/s" % (r + 1, side, v), flush=True)
    floor = spec["gpu_floor"] if gpu else spec["speed_floor"]
    ratios = [x / y for x, y in zip(td, pt)]
    ratio = statistics.median(td) / statistics.median(pt)
    row = dict(model=spec["name"], label=spec["label"], tandem=statistics.median(td),
               pytorch=statistics.median(pt), ratio=ratio, floor=floor,
               speed_pass=floor is None or ratio >= floor, tandem_runs=td, pytorch_runs=pt,
               ratio_runs=ratios)
    if bf16:
        # Against its own f32 where the CPU has no bf16 arithmetic to win with.
        own = statistics.median(td) / statistics.median(td32)
        row.update(tandem_f32=statistics.median(td32), tandem_f32_runs=td32, bf16_over_f32=own,
                   bf16_over_f32_runs=[x / y for x, y in zip(td, td32)])
        if not gpu and not a.bf16_hw:
            row.update(floor=None, own_floor=0.95, speed_pass=own >= 0.95)
    if spec.get("peak_floor") and not gpu:
        per_token, params = flops_per_token(spec["gpt"][0], spec["gpt"][2])
        gflops = row["tandem"] * CONTEXT * per_token * 1e-9
        row.update(peak=a.peak, gflops=gflops, peak_share=gflops / a.peak,
                   peak_floor=spec["peak_floor"], peak_pass=gflops / a.peak >= spec["peak_floor"],
                   flops_formula="6 x %d parameters + 6 x C %d x T %d x %d layers = %d FLOPs "
                   "per token" % (params, spec["gpt"][2], CONTEXT, spec["gpt"][0], per_token))
    return row


def full_row(a, spec, dev, workdir):
    """The full run: tandem and PyTorch to the accuracy floors, once each."""
    steps = spec.get("full_steps") or spec["full_epochs"] * math.ceil(60000 / spec["batch"])
    ckpt = os.path.join(ROOT, "bench", "out", spec["name"] + ".safetensors")
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    td = tandem_run(a.tandem, spec, model_file(spec, workdir), a.devices, steps=steps, full=True,
                    checkpoint=ckpt, precision=a.precision)
    pt = torch_run(spec, dev, steps=steps, full=True, bf16=a.precision == "bf16")
    floor = spec["speed_floor"]
    ratio = td["samples_per_s"] / pt["samples_per_s"]
    m = td["metric"]
    good = m >= spec["floor"] if spec["metric"] == "test accuracy" else m <= spec["floor"]
    ok = good and (spec["name"] != "mnist_mlp" or interop_check(a.tandem, ckpt))
    return dict(model=spec["name"], label=spec["label"], tandem=td["samples_per_s"],
                pytorch=pt["samples_per_s"], ratio=ratio, floor=floor,
                speed_pass=floor is None or ratio >= floor, tandem_runs=[td["samples_per_s"]],
                pytorch_runs=[pt["samples_per_s"]], ratio_runs=[ratio], metric=spec["metric"],
                tandem_metric=m, pytorch_metric=pt["metric"], metric_floor=spec["floor"],
                metric_pass=ok)


def report(rows, a):
    print("\n%-15s %24s %24s %20s %7s  %s" % ("model", "tandem samples/s", "PyTorch samples/s",
                                             "ratio", "floor", "speed"))
    for r in rows:
        print("%-15s %24s %24s %20s %7s  %s" %
              (r["model"], spread(r["tandem_runs"]), spread(r["pytorch_runs"]),
               "%.2fx (%.2f-%.2f)" % (r["ratio"], min(r["ratio_runs"]), max(r["ratio_runs"])),
               "-" if r["floor"] is None else "%.1fx" % r["floor"],
               "-" if r["floor"] is None else "PASS" if r["speed_pass"] else "FAIL"))
    for r in rows:
        if "bf16_over_f32" in r:
            print("%-15s tandem bf16 over tandem f32: %.2fx (%.2f-%.2f), f32 %s samples/s%s" %
                  (r["model"], r["bf16_over_f32"], min(r["bf16_over_f32_runs"]),
                   max(r["bf16_over_f32_runs"]), spread(r["tandem_f32_runs"]),
                   "  floor 0.95x %s" % ("PASS" if r["speed_pass"] else "FAIL")
                   if "own_floor" in r else ""))
    for r in rows:
        if "peak" in r:
            print("\n%s: %s" % (r["model"], r["flops_formula"]))
            print("FLOOR %s at >= %.0f%% of the 2-thread FMA peak (%.1f GFLOP/s): %.1f GFLOP/s, "
                  "%.1f%%: %s" % (r["model"], 100 * r["peak_floor"], r["peak"], r["gflops"],
                                  100 * r["peak_share"], "PASS" if r["peak_pass"] else "FAIL"))
    # One line per model for scripts/gpu-check: "<label>: ...".
    print()
    for r in rows:
        verdict = ("no floor" if r["floor"] is None else "floor %.1fx %s" %
                   (r["floor"], "PASS" if r["speed_pass"] else "FAIL"))
        print("%s: tandem %.0f/s, PyTorch (%s) %.0f/s, %.2fx, %s" %
              (r["label"], r["tandem"], a.torch_device, r["pytorch"], r["ratio"], verdict))
    for r in rows:
        if "metric" in r:
            cmp_ = ">=" if r["metric"] == "test accuracy" else "<="
            print("%-10s %s: tandem %.4f (pytorch %.4f), floor %s %.4f  %s" %
                  (r["model"], r["metric"], r["tandem_metric"], r["pytorch_metric"], cmp_,
                   r["metric_floor"], "PASS" if r["metric_pass"] else "FAIL"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True, help="the tandem executable")
    ap.add_argument("--full", action="store_true", help="train to the accuracy floors too")
    ap.add_argument("--models", help="rows to run, by name (default: all that apply)")
    ap.add_argument("--devices", default="cpu:0{cores=2}")
    ap.add_argument("--torch-device", default="cpu",
                    help="where PyTorch trains: cpu (default) or cuda[:N]; cuda uses the GPU "
                    "floors")
    ap.add_argument("--rounds", type=int, help="rounds per row (default 3; 1 on a GPU)")
    ap.add_argument("--seconds", type=float, help="each side's training per round (default 8; "
                    "3 on a GPU)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                    help="bf16: the bf16 rows, tandem --precision bf16 against PyTorch autocast")
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.set_num_interop_threads(1)
    dev = torch.device(a.torch_device)
    gpu = dev.type == "cuda"
    if gpu and not torch.cuda.is_available():
        sys.exit("train_vs_pytorch: --torch-device %s, but this PyTorch sees no GPU" %
                 a.torch_device)
    a.rounds = a.rounds or (1 if gpu else 3)
    a.seconds = a.seconds or (3.0 if gpu else 8.0)
    workdir = tempfile.mkdtemp(prefix="train_vs_pytorch-")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "unknown CPU")
    a.bf16_hw = cpu_has_bf16()
    print("PyTorch %s (%s), tandem %s on %s, %s; %s" %
          (torch.__version__, torch.cuda.get_device_name(dev) if gpu else
           "%d threads" % torch.get_num_threads(), a.tandem, a.devices, a.precision, cpu))
    if a.precision == "bf16" and not gpu:
        print("bf16 case: %s" % ("the CPU has AVX512-BF16 or AMX: floor tandem bf16 >= 1.2x "
                                 "PyTorch autocast" if a.bf16_hw else
                                 "the CPU has neither AVX512-BF16 nor AMX: floor tandem bf16 "
                                 ">= 0.95x tandem f32"))
    if not gpu:
        a.peak = fma_peak(workdir)
        print("FMA peak, 2 threads: %.1f GFLOP/s (fp32, best of 5)" % a.peak)
    names = a.models.split(",") if a.models else None
    rows = []
    for spec in MODELS:
        if names is not None and spec["name"] not in names:
            continue
        if names is None and (gpu and spec.get("cpu_only") or a.full and "metric" not in spec or
                              a.precision == "bf16" and not spec.get("bf16")):
            continue
        rows.append(full_row(a, spec, dev, workdir) if a.full and "metric" in spec else
                    timed_row(a, spec, dev, gpu, workdir))
    report(rows, a)
    ok = all(r["speed_pass"] and r.get("peak_pass", True) and r.get("metric_pass", True)
             for r in rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\ntrain_vs_pytorch: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
