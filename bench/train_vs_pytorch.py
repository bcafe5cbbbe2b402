"""tandem against PyTorch on the same three models, side by side.

Run through bench/train_vs_pytorch, which builds tandem and sets up bench/.venv.
Each model is trained with the same shapes, batch size, optimizer, schedule and
data (f32, 2 threads) by `tandem train` and by PyTorch, one after the other;
throughput is samples per second over the training steps, batch gathering
included, evaluation excluded. --full trains long enough for the accuracy
floors and checks them too.

--devices cuda:0 --torch-device cuda compares on a GPU: PyTorch keeps the
training images on the GPU and waits for it (torch.cuda.synchronize) before
reading the clock; the floors are then the GPU ones (MLP >= 2x PyTorch eager,
where launch overhead dominates; GPT-tiny >= 1x; LeNet-5 has none).
"""
import argparse
import gzip
import json
import math
import os
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

# name, model file, data, batch, optimizer, lr, quick steps, full run, floors;
# gpu_floor: the speed floor against PyTorch on a GPU (None: no floor); gpu_steps: quick
# steps there (long enough for a GPU's steady state). label: the name in the
# summary lines that scripts/gpu-check reads.
MODELS = [
    dict(name="mnist_mlp", label="MLP", file="examples/mnist_mlp.json", data=MNIST, batch=64,
         opt="sgd", lr=0.05, quick_steps=938, gpu_steps=2000, full_epochs=3, speed_floor=1.5,
         gpu_floor=2.0, metric="test accuracy", floor=0.975),
    dict(name="lenet5", label="LeNet-5", file="examples/lenet5.json", data=MNIST, batch=64,
         opt="sgd", lr=0.05, quick_steps=300, gpu_steps=1000, full_epochs=3, speed_floor=1.2,
         gpu_floor=None, metric="test accuracy", floor=0.988),
    dict(name="gpt_tiny", label="GPT-tiny", file="examples/gpt_tiny.json", data=TEXT,
         batch=32, opt="adamw", lr=1e-3, quick_steps=20, gpu_steps=300, full_steps=3000,
         warmup=100, clip=1.0, speed_floor=1.0, gpu_floor=1.0, metric="validation loss",
         floor=1.8),
]


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


def torch_run(spec, steps, full, dev):
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(1)
    b = spec["batch"]
    if spec["data"] == MNIST:
        (xtr, ytr), (xte, yte) = mnist()
        model = MLP() if spec["name"] == "mnist_mlp" else LeNet5()
        perm, pos = torch.randperm(len(xtr), generator=g), 0
        # On a GPU the training set lives there, as a fast PyTorch program keeps it.
        xtr_d, ytr_d = xtr.to(dev), ytr.to(dev)
        xte, yte = xte.to(dev), yte.to(dev)

        def batch():
            nonlocal perm, pos
            if pos >= len(perm):
                perm, pos = torch.randperm(len(xtr), generator=g), 0
            idx = perm[pos:pos + b].to(dev)
            pos += b
            return xtr_d[idx], ytr_d[idx]
    else:
        tr, va = text()
        model = GPTTiny()

        def batch():
            s = torch.randint(0, len(tr) - 128, (b,), generator=g)
            w = torch.stack([tr[i:i + 129] for i in s.tolist()]).to(dev)
            return w[:, :-1], w[:, 1:]
    model = model.to(dev)
    opt, sched = make_optimizer(model, spec, steps)
    model.train()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        if spec.get("clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        opt.step()
        sched.step()
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


def tandem_run(exe, spec, steps, full, devices, checkpoint=None):
    cmd = [exe, "train", "--model", os.path.join(ROOT, spec["file"]), "--data", spec["data"],
           "--batch", str(spec["batch"]), "--optimizer", spec["opt"], "--lr", str(spec["lr"]),
           "--schedule", "cosine", "--precision", "f32", "--devices", devices, "--seed", "1",
           "--no-epoch-eval", "--quiet", "--summary"]
    if spec["opt"] == "sgd":
        cmd += ["--momentum", "0.9"]
    if spec.get("warmup"):
        cmd += ["--warmup", str(spec["warmup"])]
    if spec.get("clip"):
        cmd += ["--clip", str(spec["clip"])]
    if full and "full_epochs" in spec:
        cmd += ["--epochs", str(spec["full_epochs"])]
    else:
        cmd += ["--steps", str(steps)]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True, help="the tandem executable")
    ap.add_argument("--full", action="store_true", help="train to the accuracy floors too")
    ap.add_argument("--models", default="mnist_mlp,lenet5,gpt_tiny")
    ap.add_argument("--devices", default="cpu:0{cores=2}")
    ap.add_argument("--torch-device", default="cpu",
                    help="where PyTorch trains: cpu (default) or cuda[:N]; cuda uses the GPU "
                    "floors")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch.set_num_interop_threads(1)
    dev = torch.device(a.torch_device)
    gpu = dev.type == "cuda"
    if gpu and not torch.cuda.is_available():
        sys.exit("train_vs_pytorch: --torch-device %s, but this PyTorch sees no GPU" %
                 a.torch_device)
    print("PyTorch %s (%s), tandem %s on %s, f32" %
          (torch.__version__, torch.cuda.get_device_name(dev) if gpu else
           "%d threads" % torch.get_num_threads(), a.tandem, a.devices))
    rows, ok = [], True
    for spec in MODELS:
        if spec["name"] not in a.models.split(","):
            continue
        if a.full:
            steps = spec.get("full_steps") or spec["full_epochs"] * math.ceil(60000 / spec["batch"])
        else:
            steps = spec["gpu_steps"] if gpu else spec["quick_steps"]
        floor = spec["gpu_floor"] if gpu else spec["speed_floor"]
        print("\n%s: batch %d, %s lr %g, %d steps" % (spec["name"], spec["batch"], spec["opt"],
                                                     spec["lr"], steps), flush=True)
        ckpt = os.path.join(ROOT, "bench", "out", spec["name"] + ".safetensors")
        os.makedirs(os.path.dirname(ckpt), exist_ok=True)
        td = tandem_run(a.tandem, spec, steps, a.full, a.devices, ckpt)
        print("  tandem : %9.1f samples/s  (%.1f s, last loss %.4f)" %
              (td["samples_per_s"], td["seconds"], td["final_loss"]), flush=True)
        if spec["name"] == "mnist_mlp":
            ok &= interop_check(a.tandem, ckpt)
        pt = torch_run(spec, steps, a.full, dev)
        print("  pytorch: %9.1f samples/s  (%.1f s, last loss %.4f)" %
              (pt["samples_per_s"], pt["seconds"], pt["final_loss"]), flush=True)
        ratio = td["samples_per_s"] / pt["samples_per_s"]
        speed_ok = floor is None or ratio >= floor
        ok &= speed_ok
        row = dict(model=spec["name"], label=spec["label"], tandem=td["samples_per_s"],
                   pytorch=pt["samples_per_s"], ratio=ratio, floor=floor, speed_pass=speed_ok)
        if a.full:
            m = td["metric"]
            good = m >= spec["floor"] if spec["metric"] == "test accuracy" else m <= spec["floor"]
            ok &= good
            row.update(metric=spec["metric"], tandem_metric=m, pytorch_metric=pt["metric"],
                       metric_floor=spec["floor"], metric_pass=good)
        rows.append(row)
    print("\n%-10s %14s %14s %8s %7s  %s" % ("model", "tandem/s", "pytorch/s", "ratio", "floor",
                                            "speed"))
    for r in rows:
        print("%-10s %14.1f %14.1f %7.2fx %7s  %s" %
              (r["model"], r["tandem"], r["pytorch"], r["ratio"],
               "-" if r["floor"] is None else "%.1fx" % r["floor"],
               "-" if r["floor"] is None else "PASS" if r["speed_pass"] else "FAIL"))
    # One line per model for scripts/gpu-check: "<label>: ...".
    print()
    for r in rows:
        verdict = ("no floor" if r["floor"] is None else "floor %.1fx %s" %
                   (r["floor"], "PASS" if r["speed_pass"] else "FAIL"))
        print("%s: tandem %.0f/s, PyTorch (%s) %.0f/s, %.2fx, %s" %
              (r["label"], r["tandem"], a.torch_device, r["pytorch"], r["ratio"], verdict))
    if a.full:
        print()
        for r in rows:
            cmp_ = ">=" if r["metric"] == "test accuracy" else "<="
            print("%-10s %s: tandem %.4f (pytorch %.4f), floor %s %.4f  %s" %
                  (r["model"], r["metric"], r["tandem_metric"], r["pytorch_metric"], cmp_,
                   r["metric_floor"], "PASS" if r["metric_pass"] else "FAIL"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\ntrain_vs_pytorch: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
