#!/usr/bin/env python3
"""Writes the seeds of fuzz_import_hf and fuzz_import_llmc: a GPT-2 small
enough to mutate (vocabulary 8, context 4, 4 channels, 2 heads, 1 block) as
a Hugging Face folder (config.json and model.safetensors, joined as
fuzz_import_hf reads them) and as llm.c checkpoint and token files (behind
the byte that picks the reader). Run from the repository root."""
import json
import struct

V, T, C, H, L = 8, 4, 4, 2, 1
VP = 16  # llm.c pads the vocabulary

def floats(n, k):
    return [((i * 7 + k * 3) % 11 - 5) / 16.0 for i in range(n)]

def safetensors(tensors):
    header, data = {}, b""
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        raw = struct.pack("<%df" % n, *floats(n, len(header)))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data

def hf():
    cfg = json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                      "activation_function": "gelu_new", "n_embd": C, "n_head": H, "n_layer": L,
                      "n_positions": T, "vocab_size": V, "layer_norm_epsilon": 1e-5,
                      "tie_word_embeddings": True}).encode()
    t = [("wte.weight", [V, C]), ("wpe.weight", [T, C])]
    for b in range(L):
        p = "h.%d." % b
        t += [(p + "ln_1.weight", [C]), (p + "ln_1.bias", [C]),
              (p + "attn.c_attn.weight", [C, 3 * C]), (p + "attn.c_attn.bias", [3 * C]),
              (p + "attn.c_proj.weight", [C, C]), (p + "attn.c_proj.bias", [C]),
              (p + "ln_2.weight", [C]), (p + "ln_2.bias", [C]),
              (p + "mlp.c_fc.weight", [C, 4 * C]), (p + "mlp.c_fc.bias", [4 * C]),
              (p + "mlp.c_proj.weight", [4 * C, C]), (p + "mlp.c_proj.bias", [C])]
    t += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    return struct.pack("<H", len(cfg)) + cfg + safetensors(t)

def llmc_model():
    h = [20240326, 3, T, V, L, H, C, VP] + [0] * 248
    sizes = [VP * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C,
             L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
    body = b"".join(struct.pack("<%df" % n, *floats(n, k)) for k, n in enumerate(sizes))
    return b"\x00" + struct.pack("<256i", *h) + body

def llmc_tokens():
    toks = [i * 37 % 50257 for i in range(24)]
    h = [20240520, 1, len(toks)] + [0] * 253
    return b"\x01" + struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks)

open("fuzz/seeds/import_hf/tiny", "wb").write(hf())
open("fuzz/seeds/import_llmc/model", "wb").write(llmc_model())
open("fuzz/seeds/import_llmc/tokens", "wb").write(llmc_tokens())
