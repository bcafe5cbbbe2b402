"""bench/generate's engine: batch-1 generation with tandem and its peers.

Run through bench/generate (which sets up the venv). Makes each model (GPT-2
and a Llama), converts and exports it once under --workdir, measures the
machine's read bandwidth, then runs every engine in a child process per round
(the engines in a rotated order each round) and prints the medians, the
memory-floor ratios and the floors. --peer NAME runs one peer once and prints
'result PREFILL_MS DECODE_MS_PER_TOKEN', then 'tokens ID ...' (the greedy
tokens it generated), or 'notrun: REASON' (the parent's protocol).

    generate.py --tandem PATH [--rounds N] [--quick] [--only gpt2|llama]
                [--json FILE] [--workdir DIR]
"""
import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

FULL = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
QUICK = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
# SmolLM-135M's shape (transformers' LlamaConfig fields); --quick: a tiny one.
# rope_theta as SmolLM (v1) has it; SmolLM2-135M has 100000 and a context of
# 8192, which changes no timing here.
LLAMA_FULL = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                  num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                  max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=True)
LLAMA_QUICK = dict(LLAMA_FULL, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=128, vocab_size=512,
                   max_position_embeddings=64)
THREADS = 2

# A reader of `size` bytes on `threads` threads (each its own half), timed;
# prints the best GB/s of `reps` passes after one that faults the pages in.
READER_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef struct { const uint64_t *p; size_t n; uint64_t sum; pthread_t t; } part;
static void *run(void *a) {
    part *q = a; uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= q->n; i += 4) { s0 += q->p[i]; s1 += q->p[i + 1]; s2 += q->p[i + 2]; s3 += q->p[i + 3]; }
    q->sum = s0 ^ s1 ^ s2 ^ s3; return NULL;
}
static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec; }
int main(int argc, char **argv) {
    size_t size = (size_t)atoll(argv[1]); int threads = atoi(argv[2]), reps = atoi(argv[3]);
    size_t n = size / 8; uint64_t *buf = aligned_alloc(64, n * 8), chk = 0; double best = 0;
    part ps[64];
    if (!buf || threads < 1 || threads > 64) return 1;
    memset(buf, 1, n * 8);
    for (int r = 0; r <= reps; r++) {
        double t0 = now();
        for (int i = 0; i < threads; i++) {
            ps[i].p = buf + n * i / threads; ps[i].n = n * (i + 1) / threads - n * i / threads;
            pthread_create(&ps[i].t, NULL, run, &ps[i]);
        }
        for (int i = 0; i < threads; i++) { pthread_join(ps[i].t, NULL); chk ^= ps[i].sum; }
        double gbs = (double)n * 8 / (now() - t0) / 1e9;
        if (r > 0 && gbs > best) best = gbs;
    }
    printf("%.3f %llu\n", best, (unsigned long long)chk);
    return 0;
}
"""


def log(*a):
    print(*a, flush=True)


# Bytes a weight of a matrix takes in each format (q8_0: 32 int8 and a 2-byte scale).
MATRIX_BYTES = {"f32": 4.0, "bf16": 2.0, "q8_0": 34.0 / 32.0}


def weight_bytes_per_token(c, fmt="f32"):
    """Bytes of the weights one decode step reads: every block, the final
    layer norm and the (tied) head; of the embeddings one row each. The
    matrices in fmt, the rest (norms, biases, embedding rows) in f32."""
    e, layers, v = c["n_embd"], c["n_layer"], c["vocab_size"]
    matrices = layers * (3 * e * e + e * e + 4 * e * e + 4 * e * e) + v * e
    rest = layers * (2 * 2 * e + 3 * e + e + 4 * e + e) + 2 * e + 2 * e
    return MATRIX_BYTES[fmt] * matrices + 4 * rest


def llama_weight_bytes_per_token(c):
    """The same for a Llama: per block q, k, v, o and the SwiGLU's three
    matrices and two RMSNorm weights; the final norm, the (tied) head and one
    embedding row. All f32."""
    e, layers, v, hid = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], \
        c["intermediate_size"]
    kv = c["num_key_value_heads"] * (e // c["num_attention_heads"])
    matrices = layers * (2 * e * e + 2 * e * kv + 3 * e * hid) + v * e
    rest = layers * 2 * e + e + e
    return 4.0 * (matrices + rest)


def measure_bandwidth(workdir, threads, size):
    exe = os.path.join(workdir, "read_bw")
    src = exe + ".c"
    if not os.path.exists(exe):
        with open(src, "w") as f:
            f.write(READER_C)
        cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if not cc:
            return None
        subprocess.run([cc, "-O3", "-march=native", "-pthread", "-o", exe, src], check=True)
    out = subprocess.run([exe, str(size), str(threads), "5"], check=True, capture_output=True,
                         text=True).stdout
    return float(out.split()[0])


# Models ---------------------------------------------------------------------------


def write_safetensors(path, shapes, ones):
    """Random N(0, 0.02) f32 tensors of `shapes` ({name: shape}), those whose
    name ends with one of `ones` all ones, as model.safetensors in path. numpy
    when there is one; the standard library alone otherwise (slow but fine
    for the --quick models)."""
    rng = random.Random(1)
    try:  # numpy writes the full size in seconds; the standard library alone is slow
        import numpy as np
        nrng = np.random.default_rng(1)
    except ImportError:
        np = None
    header, blobs, off = {}, [], 0
    for name, shape in shapes.items():
        n = 1
        for s in shape:
            n *= s
        one = name.endswith(ones)
        if np is not None:
            vals = np.ones(n) if one else nrng.normal(0.0, 0.02, n)
            blob = vals.astype("<f4").tobytes()
        else:
            vals = [1.0] * n if one else [rng.gauss(0.0, 0.02) for _ in range(n)]
            blob = struct.pack(f"<{n}f", *vals)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    hj = json.dumps(header).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))


def write_tiny_hf(cfg, path):
    """A GPT-2 as save_pretrained writes it (config.json, model.safetensors),
    random weights, with the standard library only: the --quick model."""
    e, v, t = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    shapes = {"transformer.wte.weight": (v, e), "transformer.wpe.weight": (t, e),
              "transformer.ln_f.weight": (e,), "transformer.ln_f.bias": (e,)}
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        shapes.update({p + "ln_1.weight": (e,), p + "ln_1.bias": (e,),
                       p + "attn.c_attn.weight": (e, 3 * e), p + "attn.c_attn.bias": (3 * e,),
                       p + "attn.c_proj.weight": (e, e), p + "attn.c_proj.bias": (e,),
                       p + "ln_2.weight": (e,), p + "ln_2.bias": (e,),
                       p + "mlp.c_fc.weight": (e, 4 * e), p + "mlp.c_fc.bias": (4 * e,),
                       p + "mlp.c_proj.weight": (4 * e, e), p + "mlp.c_proj.bias": (e,)})
    write_safetensors(path, shapes, ("ln_1.weight", "ln_2.weight", "ln_f.weight"))
    conf = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_ctx=t,
                layer_norm_epsilon=1e-5, activation_function="gelu_new",
                tie_word_embeddings=True, **cfg)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(conf, f)


def write_tiny_llama_hf(cfg, path):
    """A LlamaForCausalLM as save_pretrained writes it (tied head: no
    lm_head.weight), random weights, without transformers."""
    e, v, hid = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * (e // cfg["num_attention_heads"])
    shapes = {"model.embed_tokens.weight": (v, e), "model.norm.weight": (e,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (e,),
                       p + "self_attn.q_proj.weight": (e, e), p + "self_attn.k_proj.weight": (kv, e),
                       p + "self_attn.v_proj.weight": (kv, e), p + "self_attn.o_proj.weight": (e, e),
                       p + "post_attention_layernorm.weight": (e,),
                       p + "mlp.gate_proj.weight": (hid, e), p + "mlp.up_proj.weight": (hid, e),
                       p + "mlp.down_proj.weight": (e, hid)})
    write_safetensors(path, shapes, ("layernorm.weight", "norm.weight"))
    conf = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
                attention_bias=False, mlp_bias=False, **cfg)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(conf, f)


def write_hf(cfg, path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**cfg)).eval().save_pretrained(path)


def add_id_vocabulary(w, vocab):
    """llama.cpp takes its vocabulary size from the tokenizer ("none" gives
    0): a SentencePiece-style list whose pieces are named by their ids
    (<t3>, <t4>, ...), since the bench feeds and reads ids only."""
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"<t{i}>".encode() for i in range(3, vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([2, 3, 3] + [1] * (vocab - 3))


def f32_adder(w):
    """add(name, array): the array as an f32 tensor of w."""
    import numpy as np

    def add(name, arr):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    return add


def finish_gguf(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(hfdir, cfg, path):
    """The same weights as an f32 GGUF for llama.cpp's gpt2 architecture, as
    llama.cpp's convert_hf_to_gguf.py lays them out (Conv1D weights
    transposed to (out, in); the head written out as output.weight)."""
    import gguf
    from safetensors.numpy import load_file
    st = load_file(os.path.join(hfdir, "model.safetensors"))
    pre = "transformer." if "transformer.wte.weight" in st else ""
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_context_length(cfg["n_positions"])
    w.add_embedding_length(cfg["n_embd"])
    w.add_feed_forward_length(4 * cfg["n_embd"])
    w.add_block_count(cfg["n_layer"])
    w.add_head_count(cfg["n_head"])
    w.add_layer_norm_eps(1e-5)
    w.add_file_type(0)  # all f32
    add_id_vocabulary(w, cfg["vocab_size"])
    add = f32_adder(w)
    add("token_embd.weight", st[pre + "wte.weight"])
    add("position_embd.weight", st[pre + "wpe.weight"])
    for i in range(cfg["n_layer"]):
        p, b = f"{pre}h.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", st[p + "ln_1.weight"])
        add(b + "attn_norm.bias", st[p + "ln_1.bias"])
        add(b + "attn_qkv.weight", st[p + "attn.c_attn.weight"].T)
        add(b + "attn_qkv.bias", st[p + "attn.c_attn.bias"])
        add(b + "attn_output.weight", st[p + "attn.c_proj.weight"].T)
        add(b + "attn_output.bias", st[p + "attn.c_proj.bias"])
        add(b + "ffn_norm.weight", st[p + "ln_2.weight"])
        add(b + "ffn_norm.bias", st[p + "ln_2.bias"])
        add(b + "ffn_up.weight", st[p + "mlp.c_fc.weight"].T)
        add(b + "ffn_up.bias", st[p + "mlp.c_fc.bias"])
        add(b + "ffn_down.weight", st[p + "mlp.c_proj.weight"].T)
        add(b + "ffn_down.bias", st[p + "mlp.c_proj.bias"])
    add("output_norm.weight", st[pre + "ln_f.weight"])
    add("output_norm.bias", st[pre + "ln_f.bias"])
    add("output.weight", st[pre + "wte.weight"])
    finish_gguf(w)


def write_llama_hf(cfg, path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**cfg)).eval().save_pretrained(path)


def permute_qk(w, heads):
    """llama.cpp's rotary layout from transformers' (LlamaModel.permute in its
    convert_hf_to_gguf.py): transformers rotates the pairs (j, j + d/2) of
    each head (rotate_half), llama.cpp's `llama` architecture the pairs
    (2j, 2j + 1); so each head's rows are interleaved, half by half. heads:
    the query heads for q_proj, the key/value heads for k_proj."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_llama_gguf(hfdir, cfg, path):
    """The same weights as an f32 GGUF of llama.cpp's `llama` architecture, as
    its convert_hf_to_gguf.py writes a LlamaForCausalLM: q and k permuted for
    its rotary layout, the tied head left to token_embd (no output.weight)."""
    import gguf
    from safetensors.numpy import load_file
    st = load_file(os.path.join(hfdir, "model.safetensors"))
    h, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(h)
    w.add_head_count_kv(kvh)
    w.add_rope_dimension_count(cfg["hidden_size"] // h)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(0)  # all f32
    add_id_vocabulary(w, cfg["vocab_size"])
    add = f32_adder(w)
    add("token_embd.weight", st["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", st[p + "input_layernorm.weight"])
        add(b + "attn_q.weight", permute_qk(st[p + "self_attn.q_proj.weight"], h))
        add(b + "attn_k.weight", permute_qk(st[p + "self_attn.k_proj.weight"], kvh))
        add(b + "attn_v.weight", st[p + "self_attn.v_proj.weight"])
        add(b + "attn_output.weight", st[p + "self_attn.o_proj.weight"])
        add(b + "ffn_norm.weight", st[p + "post_attention_layernorm.weight"])
        add(b + "ffn_gate.weight", st[p + "mlp.gate_proj.weight"])
        add(b + "ffn_up.weight", st[p + "mlp.up_proj.weight"])
        add(b + "ffn_down.weight", st[p + "mlp.down_proj.weight"])
    add("output_norm.weight", st["model.norm.weight"])
    if "lm_head.weight" in st:  # an untied head
        add("output.weight", st["lm_head.weight"])
    finish_gguf(w)


# llama.cpp's own file types (llama.h's llama_ftype) for its quantizer
LLAMA_FTYPE = {"q8_0": 7, "bf16": 32}


def quantize_gguf(src, dst, fmt):
    """The f32 GGUF quantized by llama.cpp itself (llama_model_quantize)."""
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE[fmt]
    params.nthread = THREADS
    # its C code lists every tensor on stderr: keep the bench's output readable
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    if rc != 0 or not os.path.exists(dst):
        raise RuntimeError(f"llama_model_quantize returned {rc}")


def export_onnx(hfdir, path):
    from optimum.onnxruntime import ORTModelForCausalLM
    m = ORTModelForCausalLM.from_pretrained(hfdir, export=True, use_cache=True)
    m.save_pretrained(path)


# Peers (each in its own process) ----------------------------------------------------


def time_generate(gen, ids, n):
    """Prefill ms (a generate of 1 token) and decode ms/token ((a generate of n
    minus that) / (n - 1)), after a warm-up of 2 tokens; and the n tokens
    the last generate chose (gen returns them)."""
    gen(ids, 2)
    t0 = time.perf_counter()
    gen(ids, 1)
    t1 = time.perf_counter()
    toks = gen(ids, n)
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0), 1e3 * ((t2 - t1) - (t1 - t0)) / (n - 1), toks


# tandem's generate, without a tokenizer, writes bytes: it picks among the
# first 256 ids (its logits are all computed). The peers pick so too, so the
# greedy tokens compare as they are; it costs them nothing measurable.
TOKEN_LIMIT = 256


def bytes_only():
    """A transformers logits processor: the ids from TOKEN_LIMIT on never win."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class BytesOnly(LogitsProcessor):
        def __call__(self, input_ids, scores):
            scores[:, TOKEN_LIMIT:] = -float("inf")
            return scores
    return LogitsProcessorList([BytesOnly()])


def peer_torch(a, ids):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(THREADS)
    m = AutoModelForCausalLM.from_pretrained(a.model).eval()
    x = torch.tensor([ids])
    procs = bytes_only()

    def gen(ids_, n):
        # no end-of-sequence token, so min_new_tokens masks none out of the
        # arg-max (were it kept, min_new_tokens still keeps the length)
        with torch.inference_mode():
            out = m.generate(x, max_new_tokens=n, do_sample=False, use_cache=True,
                             min_new_tokens=n, pad_token_id=0, eos_token_id=None,
                             logits_processor=procs, attention_mask=torch.ones_like(x))
        return out[0, len(ids_):].tolist()
    return time_generate(gen, ids, a.new_tokens)


def peer_ort(a, ids):
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    m = ORTModelForCausalLM.from_pretrained(a.onnx, session_options=so, use_cache=True)
    x = torch.tensor([ids])
    procs = bytes_only()

    def gen(ids_, n):
        out = m.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True,
                         pad_token_id=0, logits_processor=procs, attention_mask=torch.ones_like(x))
        return out[0, len(ids_):].tolist()
    return time_generate(gen, ids, a.new_tokens)


def peer_llama(a, ids):
    import llama_cpp
    import numpy as np
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=2 * len(ids) + a.new_tokens, n_batch=512,
                          n_threads=THREADS, n_threads_batch=THREADS, logits_all=False,
                          verbose=False)
    vocab = a.vocab

    def run(n):
        llm.reset()
        toks = []
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for _ in range(n):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                           shape=(vocab,))
            toks.append(int(np.argmax(logits[:TOKEN_LIMIT])))
            llm.eval([toks[-1]])
        t2 = time.perf_counter()
        return 1e3 * (t1 - t0), 1e3 * (t2 - t1) / max(n, 1), toks
    run(2)
    return run(a.new_tokens)


def peer_main(a):
    ids = list(open(a.prompt, "rb").read())
    fn = {"torch": peer_torch, "ort": peer_ort, "llama": peer_llama}[a.peer]
    try:
        pre, dec, toks = fn(a, ids)
    except Exception as e:  # the parent prints the reason in the peer's row
        print(f"notrun: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 0
    print(f"result {pre:.3f} {dec:.4f}")
    print("tokens " + " ".join(str(t) for t in toks))
    return 0


def compact_floors(med, why, floors):
    """The compact formats' floors: tandem's decode <= 1.0x llama.cpp's in the
    same format, and <= 1.3x the format's memory floor. A list of verdicts."""
    verdicts = []
    for fmt, fl in floors.items():
        ours, theirs = med.get(f"tandem cpu {fmt}"), med.get(f"llama.cpp {fmt}")
        label = f"FLOOR tandem cpu {fmt} decode <= 1.0x llama.cpp {fmt}'s ms/token"
        if ours and theirs:
            ok = ours[1] <= theirs[1]
            verdicts.append(ok)
            log(f"{label}: {ours[1] / theirs[1]:.2f}x: {'PASS' if ok else 'FAIL'}")
        else:
            log(f"{label}: not judged ({why.get(f'llama.cpp {fmt}', why.get(f'tandem cpu {fmt}', 'no result'))})")
        if ours:
            ok = ours[1] <= 1.3 * fl
            verdicts.append(ok)
            log(f"FLOOR tandem cpu {fmt} decode <= 1.3x its memory floor: {ours[1] / fl:.2f}x: "
                f"{'PASS' if ok else 'FAIL'}")
    return verdicts


# tandem -------------------------------------------------------------------------------


KERNELS = {}  # the instructions tandem's compact kernels used, from its summary


def run_tandem(a, ckpt, prompt, devices, strategy, weights="f32"):
    """One `tandem generate`: prefill ms, decode ms/token, the generated tokens
    (ids below 256, each written as its byte) and an error (None when it ran)."""
    cmd = [a.tandem, "generate", "--checkpoint", ckpt, "--prompt-file", prompt, "--tokens",
           str(a.new_tokens), "--temperature", "0", "--summary", "--devices", devices,
           "--weights", weights]
    if strategy:
        cmd += ["--strategy", strategy]
    p = subprocess.run(cmd, capture_output=True)
    out = p.stdout
    at = out.rfind(b"\nsummary: ")
    if at >= 0:
        s = json.loads(out[at + len(b"\nsummary: "):].splitlines()[0])
        if "kernels" in s:
            KERNELS[weights] = s["kernels"]
        # the prompt, the tokens, a newline, the summary
        plen = os.path.getsize(prompt)
        return s["prefill_ms"], s["decode_ms_per_token"], list(out[plen:at]), None
    err = (p.stderr.decode(errors="replace").strip().splitlines() or ["no summary line"])[-1]
    return None, None, None, err


def run_rounds(a, engines, files, vocab, notes):
    """Every engine once a round, the order rotated each round. engines:
    (name, kind, devices, strategy, floor); kind "t" or "t:FMT" for tandem,
    else a peer ("torch", "ort", "llama", "llama_FMT"). Returns the medians
    {name: (prefill, decode)}, why an engine has none {name: reason} and the
    first round's tokens {name: [ids]}."""
    res = {e[0]: [] for e in engines}
    why, tokens = {}, {}
    for r in range(a.rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for name, kind, dev, strat, _ in order:
            if name in why:
                continue
            if kind == "t" or kind.startswith("t:"):
                fmt = kind[2:] or "f32"
                pre, dec, toks, err = run_tandem(a, files["ckpt"], files["prompt"], dev, strat, fmt)
                if err:
                    why[name] = ("not built: " if strat else "failed: ") + err
                    continue
            else:
                if kind in notes:
                    why[name] = notes[kind]
                    continue
                gg = files["gguf"] if kind == "llama" else files["gguf"].replace(
                    "-f32.gguf", f"-{kind[len('llama_'):]}.gguf")
                p = subprocess.run([sys.executable, __file__, "--peer", kind.split("_")[0],
                                    "--model", files["hf"], "--onnx", files["onnx"], "--gguf", gg,
                                    "--prompt", files["prompt"],
                                    "--new-tokens", str(a.new_tokens), "--vocab",
                                    str(vocab)], capture_output=True, text=True)
                line = next((l for l in p.stdout.splitlines()
                             if l.startswith(("result ", "notrun: "))), None)
                if not line or line.startswith("notrun: "):
                    why[name] = line[len("notrun: "):] if line else (
                        "failed: " + ((p.stderr.strip().splitlines() or ["no output"])[-1]))
                    continue
                pre, dec = (float(v) for v in line.split()[1:3])
                toks = next(([int(t) for t in l.split()[1:]] for l in p.stdout.splitlines()
                             if l.startswith("tokens ")), None)
            res[name].append((pre, dec))
            tokens.setdefault(name, toks)
            log(f"round {r + 1}: {name}: prefill {pre:.1f} ms, decode {dec:.2f} ms/token")
    med = {}
    for name in res:
        if name not in why and res[name]:
            med[name] = (statistics.median(v[0] for v in res[name]),
                         statistics.median(v[1] for v in res[name]))
    return med, why, tokens


def print_table(a, engines, med, why):
    log(f"\n{a.prompt_tokens}-token prompt, {a.new_tokens} generated tokens, greedy; medians of "
        f"{a.rounds} rounds")
    log(f"{'engine':34} {'prefill ms':>11} {'decode ms/tok':>14} {'x floor':>8}")
    for name, _, _, _, fl in engines:
        if name not in med:
            log(f"{name:34} {why.get(name, 'no result')}")
            continue
        pre, dec = med[name]
        log(f"{name:34} {pre:11.1f} {dec:14.2f} {dec / fl:7.2f}x" if fl else
            f"{name:34} {pre:11.1f} {dec:14.2f}")


def agreement(ours, theirs):
    """How many leading greedy tokens two engines share, and whether all."""
    n = 0
    for x, y in zip(ours, theirs):
        if x != y:
            break
        n += 1
    return n, n == len(ours) == len(theirs)


def bench_gpt2(a, work, prompt, bw2, bw1):
    """The GPT-2-124M rows and floors. Returns (verdicts, whether every tandem
    row has a result, the JSON record)."""
    cfg = QUICK if a.quick else FULL
    log("\nGPT-2: {n_layer} layers, {n_embd} channels, {n_head} heads, vocabulary {vocab_size}, "
        "context {n_positions}, f32, random weights".format(**cfg))
    tag = "quick" if a.quick else "gpt2-124m"
    hfdir = os.path.join(work, f"{tag}-hf")
    ckpt = os.path.join(work, f"{tag}.safetensors")
    onnxdir = os.path.join(work, f"{tag}-onnx")
    ggufp = os.path.join(work, f"{tag}-f32.gguf")
    if not os.path.exists(os.path.join(hfdir, "model.safetensors")):
        try:
            (write_tiny_hf if a.quick else write_hf)(cfg, hfdir)
        except ImportError as e:  # no torch here: the same shape, written with numpy
            log(f"model written without transformers ({e}); PyTorch and ONNX rows will say so")
            write_tiny_hf(cfg, hfdir)
    if not os.path.exists(ckpt):
        subprocess.run([a.tandem, "convert", "--from", "hf", hfdir, "--out", ckpt, "--optimizer",
                        "none"], check=True, stdout=subprocess.DEVNULL)
    notes = {}
    if not a.quick:
        if not os.path.exists(os.path.join(onnxdir, "model.onnx")):
            try:
                log("exporting to ONNX with the KV cache (optimum) ...")
                export_onnx(hfdir, onnxdir)
            except Exception as e:
                notes["ort"] = f"ONNX export failed: {type(e).__name__}: {e}".splitlines()[0]
        if not os.path.exists(ggufp):
            try:
                write_gguf(hfdir, cfg, ggufp)
            except Exception as e:
                notes["llama"] = f"GGUF not written: {type(e).__name__}: {e}".splitlines()[0]
        for fmt in ("q8_0", "bf16"):
            dst = ggufp.replace("-f32.gguf", f"-{fmt}.gguf")
            if "llama" in notes:
                notes["llama_" + fmt] = notes["llama"]
            elif not os.path.exists(dst):
                try:
                    quantize_gguf(ggufp, dst, fmt)
                except Exception as e:
                    notes["llama_" + fmt] = (f"llama.cpp did not quantize: {type(e).__name__}: "
                                             f"{e}").splitlines()[0]

    wbytes = weight_bytes_per_token(cfg)
    wq8, wbf = weight_bytes_per_token(cfg, "q8_0"), weight_bytes_per_token(cfg, "bf16")
    floor2 = 1e3 * wbytes / (bw2 * 1e9)
    floor1 = 1e3 * wbytes / (bw1 * 1e9)
    log(f"weights read per token: {wbytes / 1e6:.1f} MB; memory floor: {floor2:.2f} ms/token "
        f"on {THREADS} threads, {floor1:.2f} on 1")
    fq8 = 1e3 * wq8 / (bw2 * 1e9)
    fbf = 1e3 * wbf / (bw2 * 1e9)
    log(f"q8_0: {wq8 / 1e6:.1f} MB a token, floor {fq8:.2f} ms/token on {THREADS} threads; "
        f"bf16: {wbf / 1e6:.1f} MB, floor {fbf:.2f}")

    engines = [("tandem cpu (2 cores)", "t", "cpu", None, floor2),
               ("tandem cpu:0 (1 core)", "t", "cpu:0", None, floor1),
               ("tandem cpu*2 --strategy tensor", "t", "cpu*2", "tensor", floor2),
               ("tandem cpu q8_0", "t:q8_0", "cpu", None, fq8),
               ("tandem cpu bf16", "t:bf16", "cpu", None, fbf)]
    if not a.quick:
        engines += [("transformers generate (PyTorch)", "torch", None, None, floor2),
                    ("ONNX Runtime (optimum, KV cache)", "ort", None, None, floor2),
                    ("llama.cpp (llama-cpp-python)", "llama", None, None, floor2),
                    ("llama.cpp q8_0", "llama_q8_0", None, None, fq8),
                    ("llama.cpp bf16", "llama_bf16", None, None, fbf)]
    files = dict(ckpt=ckpt, prompt=prompt, hf=hfdir, onnx=onnxdir, gguf=ggufp)
    med, why, _ = run_rounds(a, engines, files, cfg["vocab_size"], notes)
    print_table(a, engines, med, why)
    t2 = med.get(engines[0][0])
    verdicts = []
    if a.quick:
        log("FLOORS: not judged (--quick)")
    elif t2:
        for peer in ("llama.cpp (llama-cpp-python)", "ONNX Runtime (optimum, KV cache)"):
            label = f"FLOOR tandem cpu decode <= 1.0x {peer.split(' (')[0]}'s ms/token"
            if peer in med:
                ok = t2[1] <= med[peer][1]
                verdicts.append(ok)
                log(f"{label}: {t2[1] / med[peer][1]:.2f}x: {'PASS' if ok else 'FAIL'}")
            else:
                log(f"{label}: not judged ({why.get(peer, 'no result')})")
        ok = t2[1] <= 1.5 * floor2
        verdicts.append(ok)
        log(f"FLOOR tandem cpu decode <= 1.5x the memory floor: {t2[1] / floor2:.2f}x: "
            f"{'PASS' if ok else 'FAIL'}")
        one, split = med.get(engines[1][0]), med.get(engines[2][0])
        # A read-bound decode gains what a second core adds to the reading
        # (2x where it doubles it, as the floor was first meant): 0.85 of that.
        gain = 0.85 * bw2 / bw1
        label = (f"FLOOR tandem cpu*2 tensor decode >= 0.85x the 2-thread read gain "
                 f"({bw2 / bw1:.2f}x here, so >= {gain:.2f}x) faster than cpu:0")
        if one and split:
            ok = one[1] >= gain * split[1]
            verdicts.append(ok)
            log(f"{label}: {one[1] / split[1]:.2f}x: {'PASS' if ok else 'FAIL'}")
        else:
            log(f"{label}: not judged ({why.get(engines[2][0], why.get(engines[1][0], 'no result'))})")
        verdicts += compact_floors(med, why, {"q8_0": fq8, "bf16": fbf})
    else:
        verdicts.append(False)
        log(f"FLOORS: not judged: tandem cpu has no result ({why.get(engines[0][0])})")
    for fmt, k in sorted(KERNELS.items()):
        log(f"tandem --weights {fmt}: kernels {k}")
    record = {"weight_bytes_per_token": wbytes,
              "rows": {k: {"prefill_ms": v[0], "decode_ms_per_token": v[1]}
                       for k, v in med.items()},
              "not_run": why}
    return verdicts, all(e[0] in med for e in engines[:5]), record


def bench_llama(a, work, prompt, bw2):
    """The Llama rows (SmolLM-135M's shape): tandem on cpu against llama.cpp
    and transformers; the floors and the greedy tokens' agreement. Returns
    (verdicts, whether tandem's row has a result, the JSON record)."""
    cfg = LLAMA_QUICK if a.quick else LLAMA_FULL
    log("\nLlama (SmolLM-135M's shape{}): {num_hidden_layers} layers, {hidden_size} channels, "
        "{num_attention_heads} heads, {num_key_value_heads} key/value heads, SwiGLU hidden "
        "{intermediate_size}, vocabulary {vocab_size} (tied head), context "
        "{max_position_embeddings}, rope_theta {rope_theta:g}, f32, random weights".format(
            " scaled down, --quick" if a.quick else "", **cfg))
    tag = "quick-llama" if a.quick else "smollm-135m"
    hfdir = os.path.join(work, f"{tag}-hf")
    ckpt = os.path.join(work, f"{tag}.safetensors")
    ggufp = os.path.join(work, f"{tag}-f32.gguf")
    notes = {}
    if not os.path.exists(os.path.join(hfdir, "model.safetensors")):
        try:
            (write_tiny_llama_hf if a.quick else write_llama_hf)(cfg, hfdir)
        except ImportError as e:
            log(f"model written without transformers ({e}); the PyTorch row will say so")
            write_tiny_llama_hf(cfg, hfdir)
            notes["torch"] = f"no transformers here ({e})"
    if not os.path.exists(ckpt):
        subprocess.run([a.tandem, "convert", "--from", "hf", hfdir, "--out", ckpt, "--optimizer",
                        "none"], check=True, stdout=subprocess.DEVNULL)
    if not a.quick and not os.path.exists(ggufp):
        try:
            write_llama_gguf(hfdir, cfg, ggufp)
        except Exception as e:
            notes["llama"] = f"GGUF not written: {type(e).__name__}: {e}".splitlines()[0]
    wbytes = llama_weight_bytes_per_token(cfg)
    floor2 = 1e3 * wbytes / (bw2 * 1e9)
    log(f"weights read per token: {wbytes / 1e6:.1f} MB; memory floor: {floor2:.2f} ms/token "
        f"on {THREADS} threads")
    tname, lname, pname = ("tandem cpu (2 cores)", "llama.cpp (llama-cpp-python)",
                           "transformers generate (PyTorch)")
    engines = [(tname, "t", "cpu", None, floor2)]
    if not a.quick:
        engines += [(pname, "torch", None, None, floor2), (lname, "llama", None, None, floor2)]
    files = dict(ckpt=ckpt, prompt=prompt, hf=hfdir, onnx="", gguf=ggufp)
    med, why, tokens = run_rounds(a, engines, files, cfg["vocab_size"], notes)
    print_table(a, engines, med, why)
    verdicts, agree = [], {}
    # Greedy tokens (every engine picking among ids below 256, as tandem's
    # generate does without a tokenizer), engine against engine.
    for x, y in ((tname, lname), (tname, pname), (lname, pname)):
        if tokens.get(x) is not None and tokens.get(y) is not None:
            n, same = agreement(tokens[x], tokens[y])
            agree[f"{x.split(' (')[0]} / {y.split(' (')[0]}"] = n
            log(f"greedy tokens, {x.split(' (')[0]} and {y.split(' (')[0]}: "
                f"{'agree, all ' + str(n) if same else f'DISAGREE from token {n + 1} of {len(tokens[x])}'}")
    if a.quick:
        log("FLOORS: not judged (--quick)")
    elif tname not in med:
        verdicts.append(False)
        log(f"FLOORS: not judged: tandem cpu has no result ({why.get(tname)})")
    elif lname not in med:
        log(f"FLOOR tandem cpu Llama decode and prefill against llama.cpp: not judged "
            f"({why.get(lname, 'no result')})")
    else:
        (tp, td), (lp, ld) = med[tname], med[lname]
        ok = td <= ld
        verdicts.append(ok)
        log(f"FLOOR tandem cpu Llama decode <= 1.0x llama.cpp's ms/token: {td / ld:.2f}x: "
            f"{'PASS' if ok else 'FAIL'}")
        ok = tp <= 1.2 * lp
        verdicts.append(ok)
        log(f"FLOOR tandem cpu Llama prefill of {a.prompt_tokens} tokens <= 1.2x llama.cpp's: "
            f"{tp / lp:.2f}x: {'PASS' if ok else 'FAIL'}")
        key = "tandem cpu / llama.cpp"
        if key in agree:
            ok = agree[key] == a.new_tokens
            verdicts.append(ok)
            log(f"CHECK tandem's greedy tokens equal llama.cpp's (the GGUF read as tandem "
                f"reads the weights): {agree[key]} of {a.new_tokens}: {'PASS' if ok else 'FAIL'}")
    record = {"config": cfg, "weight_bytes_per_token": wbytes,
              "rows": {k: {"prefill_ms": v[0], "decode_ms_per_token": v[1]}
                       for k, v in med.items()},
              "greedy_tokens_agreeing": agree, "not_run": why}
    return verdicts, tname in med, record


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", default="build/tandem")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("gpt2", "llama"), help="one model's rows (default: both)")
    ap.add_argument("--json")
    ap.add_argument("--workdir", default="bench/out/generate")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    # a peer child's arguments
    ap.add_argument("--peer")
    ap.add_argument("--model")
    ap.add_argument("--onnx")
    ap.add_argument("--gguf")
    ap.add_argument("--prompt")
    ap.add_argument("--vocab", type=int)
    a = ap.parse_args()
    if a.peer:
        return peer_main(a)
    if a.quick:
        a.prompt_tokens, a.new_tokens, a.rounds = 16, 16, min(a.rounds, 1)
    context = min(QUICK["n_positions"] if a.quick else FULL["n_positions"],
                  (LLAMA_QUICK if a.quick else LLAMA_FULL)["max_position_embeddings"])
    if a.rounds < 1 or a.new_tokens < 2 or not 1 <= a.prompt_tokens <= context // 2:
        sys.exit("generate: --rounds >= 1, --new-tokens >= 2, --prompt-tokens up to half the context")
    work = tempfile.mkdtemp(prefix="generate-") if a.quick else a.workdir
    os.makedirs(work, exist_ok=True)
    cpu = "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next(l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    log(f"CPU: {cpu} ({os.cpu_count()} cores available); {THREADS} threads per engine")
    prompt = os.path.join(work, "prompt.txt")
    # bytes as tokens: tandem reads the prompt so, the peers get the same ids
    text = ("The quick brown fox jumps over the lazy dog. " * 64).encode()[:a.prompt_tokens]
    with open(prompt, "wb") as f:
        f.write(text)
    bw_size = (64 if a.quick else 1024) << 20
    bw2 = measure_bandwidth(work, THREADS, bw_size)
    bw1 = measure_bandwidth(work, 1, bw_size)
    log(f"read bandwidth {bw2:.1f} GB/s on {THREADS} threads, {bw1:.1f} on 1 (best of 5 passes "
        f"over {bw_size >> 20} MiB)")
    verdicts, ran_all, record = [], True, {"cpu": cpu, "bandwidth_gbs": {"2": bw2, "1": bw1}}
    if a.only in (None, "gpt2"):
        v, ran, r = bench_gpt2(a, work, prompt, bw2, bw1)
        verdicts += v
        ran_all = ran_all and ran
        record.update(r)
    if a.only in (None, "llama"):
        v, ran, r = bench_llama(a, work, prompt, bw2)
        verdicts += v
        ran_all = ran_all and ran
        record["llama"] = r
    if a.json:
        with open(a.json, "w") as f:
            json.dump(record, f, indent=1)
    if a.quick:
        shutil.rmtree(work, ignore_errors=True)
        return 0 if ran_all else 1
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
