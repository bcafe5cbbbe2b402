"""PyTorch's side of bench/model_parallel_pytorch: the GPT of bench/model_parallel.c
trained at batch 1 in one process on one core, and with PyTorch's own tensor
parallelism (torch.distributed.tensor.parallel) on 2 processes of one core
each, over the gloo backend on the CPU.

The model is the C bench's: 4 pre-LN blocks (layernorm -> causal attention
with a fused qkv linear and a proj linear, both with bias; layernorm -> linear
4C -> exact erf GELU, tandem's "gelu" -> linear C), residuals around both,
learned token and position embeddings, a final layernorm and a linear to the
256-symbol vocabulary; f32, cross-entropy over every position, AdamW (lr 1e-4,
betas 0.9/0.999, eps 1e-8, no weight decay: tandem's defaults). Tokens and
labels are the C bench's.

Tensor parallelism follows PyTorch's TP tutorial (Megatron style): in each
block the attention's qkv and the MLP's first linear are ColwiseParallel, the
attention's proj and the MLP's second linear RowwiseParallel, on a
DeviceMesh("cpu", [0, 1]); each rank's attention runs heads / 2 local heads.
Embeddings, layernorms and the head stay replicated. The fused qkv output is
laid out as (groups, q|k|v, heads / groups, head dim) with groups = 2 in both
modes, so that column sharding gives each rank whole heads' q, k and v and the
one-process model is the same function as the two-process one: the first
losses of the two modes are printed and compared.

Prints machine-readable lines:
    pytorch_single_s_per_step 0.123
    pytorch_tp_s_per_step 0.080
(medians over timed windows), or `pytorch_tp: not run: <reason>` (exit 0) when
the tensor-parallel run fails.

    model_parallel_pytorch.py [--mode single|tp|both] [--windows N] [--steps N] [--quick]
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

TP_SIZE = 2


def set_affinity(cpus):
    """Sets every thread of this process to the cpus (threads made later inherit it)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def pin(core, cpus):
    """Pins this process to the core-th of the cpus it was allowed at the start."""
    cpu = cpus[core % len(cpus)]
    set_affinity({cpu})
    return cpu


def one_thread():
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already started
        pass


class Attention(nn.Module):
    def __init__(self, c, heads, groups):
        super().__init__()
        self.heads, self.head_dim, self.groups = heads, c // heads, groups
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, _ = x.shape
        # self.heads and self.groups are the local ones once tensor-parallel:
        # the local qkv holds (groups, 3, heads / groups, head_dim).
        g, hg, d = self.groups, self.heads // self.groups, self.head_dim
        qkv = self.qkv(x).view(b, t, g, 3, hg, d).permute(3, 0, 2, 4, 1, 5)
        q, k, v = (z.reshape(b, g * hg, t, d) for z in qkv.unbind(0))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, self.heads * d))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc, self.out = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        return self.out(F.gelu(self.fc(x)))  # approximate="none": erf, as tandem's


class Block(nn.Module):
    def __init__(self, c, heads, groups):
        super().__init__()
        self.ln1, self.att = nn.LayerNorm(c, eps=1e-5), Attention(c, heads, groups)
        self.ln2, self.mlp = nn.LayerNorm(c, eps=1e-5), MLP(c)

    def forward(self, x):
        x = x + self.att(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c, t, vocab=256, layers=4, heads=8, groups=TP_SIZE):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(t, c)
        self.blocks = nn.ModuleList([Block(c, heads, groups) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(c, eps=1e-5), nn.Linear(c, vocab)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def batch(context):
    """bench/model_parallel.c's tokens and labels, batch 1."""
    tok = [(i * 7919) % 256 for i in range(context)]
    lab = [(i * 104729 + 1) % 256 for i in range(context)]
    return torch.tensor([tok]), torch.tensor([lab])


def build(cfg):
    torch.manual_seed(1)  # the same full model on every rank and in both modes
    model = GPT(cfg["channels"], cfg["context"])
    model.train()
    return model


def optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                             weight_decay=0.0)


def train(model, opt, x, y, cfg, barrier=None):
    """Warm-up steps (their losses kept), then timed windows; s/step per window."""
    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    losses = [step().item() for _ in range(cfg["warmup"])]
    windows = []
    for _ in range(cfg["windows"]):
        if barrier:
            barrier()
        t0 = time.perf_counter()
        for _ in range(cfg["steps"]):
            step()
        windows.append((time.perf_counter() - t0) / cfg["steps"])
    return losses, windows


def run_single(cfg):
    one_thread()
    cpu = pin(0, cfg["cpus"])
    try:
        x, y = batch(cfg["context"])
        model = build(cfg)
        losses, windows = train(model, optimizer(model), x, y, cfg)
    finally:  # the TP workers, spawned from this process, must not inherit the pinning
        set_affinity(set(cfg["cpus"]))
    return cpu, losses, windows


def tp_worker(rank, cfg, init_method, queue):
    try:
        cpu = pin(rank, cfg["cpus"])
        one_thread()
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=TP_SIZE,
                                timeout=datetime.timedelta(seconds=120))
        mesh = DeviceMesh("cpu", list(range(TP_SIZE)))
        model = build(cfg)
        for blk in model.blocks:
            parallelize_module(blk, mesh, {
                "att.qkv": ColwiseParallel(),
                "att.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(),
                "mlp.out": RowwiseParallel(),
            })
            blk.att.heads //= TP_SIZE  # local heads, as the PyTorch TP tutorial does
            blk.att.groups //= TP_SIZE
        qkv = model.blocks[0].att.qkv.weight
        if os.environ.get("TP_DEBUG"):
            sys.stderr.write("rank %d cpu %d: qkv weight %s %s local %s\n"
                             % (rank, cpu, type(qkv).__name__, tuple(qkv.shape),
                                tuple(qkv.to_local().shape)))
        x, y = batch(cfg["context"])
        losses, windows = train(model, optimizer(model), x, y, cfg, barrier=dist.barrier)
        dist.barrier()
        if rank == 0:
            queue.put(("ok", cpu, losses, windows))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - report anything as "not run"
        queue.put(("error", rank, "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e)
                                                else ""), traceback.format_exc()))
        raise


def run_tp(cfg):
    """Returns (cpu, losses, windows) or raises RuntimeError with the reason."""
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build")
    if not dist.is_gloo_available():
        raise RuntimeError("the gloo backend is not available in this build")
    import torch.distributed.tensor.parallel  # noqa: F401 - fail early on an import error
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # everything is on this machine
    tmp = tempfile.mkdtemp(prefix="tp_rdzv_")
    init_method = "file://" + os.path.join(tmp, "rendezvous")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = mp.start_processes(tp_worker, args=(cfg, init_method, queue), nprocs=TP_SIZE,
                               join=False, start_method="spawn")
    deadline = time.monotonic() + cfg["timeout"]
    died = timed_out = None
    msgs = []
    try:
        while True:
            try:
                if procs.join(timeout=1):
                    break
            except Exception as e:  # noqa: BLE001 - ProcessRaisedException, ProcessExitedException
                died = "%s: %s" % (type(e).__name__, (str(e).strip().splitlines() or [""])[-1])
                break
            while not queue.empty():
                msgs.append(queue.get())
            if any(m[0] == "error" for m in msgs):
                break
            if time.monotonic() > deadline:
                timed_out = "timed out after %d s" % cfg["timeout"]
                break
        time.sleep(0.2)  # let the other rank report too
        while not queue.empty():
            msgs.append(queue.get())
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
        for p in procs.processes:
            p.join(5)
        try:
            os.remove(os.path.join(tmp, "rendezvous"))
        except OSError:
            pass
        try:
            os.rmdir(tmp)
        except OSError:
            pass
    errors = [m for m in msgs if m[0] == "error"]
    oks = [m for m in msgs if m[0] == "ok"]
    if errors:
        if os.environ.get("TP_DEBUG"):
            sys.stderr.write(errors[0][3])
        raise RuntimeError("rank %d: %s" % (errors[0][1], errors[0][2]))
    if died or timed_out or not oks:
        raise RuntimeError(died or timed_out or "the workers ended without a result")
    return oks[0][1], oks[0][2], oks[0][3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["single", "tp", "both"], default="both")
    ap.add_argument("--windows", type=int, default=3, help="timed windows (default 3)")
    ap.add_argument("--steps", type=int, default=3, help="steps per window (default 3)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (default 2)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds for the TP run")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 64 channels, context 16, 2 timed steps")
    a = ap.parse_args()
    cfg = dict(channels=512, context=128, windows=a.windows, steps=a.steps, warmup=a.warmup,
               timeout=a.timeout, cpus=sorted(os.sched_getaffinity(0)))
    if a.quick:
        cfg.update(channels=64, context=16, windows=1, steps=2, warmup=2)
    if cfg["windows"] < 1 or cfg["steps"] < 1 or cfg["warmup"] < 1:
        ap.error("--windows, --steps and --warmup must be >= 1")
    print("pytorch %s; GPT: 4 layers, 8 heads, %d channels, context %d, vocabulary 256; "
          "batch 1, f32, AdamW; %d windows of %d steps after %d warm-up steps; 1 thread per "
          "process" % (torch.__version__, cfg["channels"], cfg["context"], cfg["windows"],
                       cfg["steps"], cfg["warmup"]), flush=True)
    single_losses = None
    if a.mode in ("single", "both"):
        cpu, single_losses, w = run_single(cfg)
        print("pytorch_single_cpu %d" % cpu)
        print("pytorch_single_windows " + " ".join("%.4f" % s for s in w))
        print("pytorch_single_losses " + " ".join("%.5f" % v for v in single_losses))
        print("pytorch_single_s_per_step %.4f" % statistics.median_high(w), flush=True)
    if a.mode in ("tp", "both"):
        try:
            cpu, losses, w = run_tp(cfg)
        except Exception as e:  # noqa: BLE001
            print("pytorch_tp: not run: %s" % e, flush=True)
            return 0
        cpus = cfg["cpus"]
        print("pytorch_tp_cpus " + ",".join(str(cpus[r % len(cpus)]) for r in range(TP_SIZE)))
        print("pytorch_tp_windows " + " ".join("%.4f" % s for s in w))
        print("pytorch_tp_losses " + " ".join("%.5f" % v for v in losses))
        if single_losses is not None:
            worst = max(abs(p - q) for p, q in zip(single_losses, losses))
            print("pytorch_tp_matches_single %s (largest loss difference %.2e)"
                  % ("yes" if worst <= 1e-3 else "NO", worst))
        print("pytorch_tp_s_per_step %.4f" % statistics.median_high(w), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
