"""End to end: ViT towers with attention through ``torch.ops.mla.context_attention`` vs SDPA.

Two towers with random weights, plain ``torch.nn``, bf16, each layer compiled once with
``torch.compile`` (regional compilation: identical layers share the compiled code):

- SigLIP-shaped (Gemma 3's encoder): 27 layers, width 1152, 16 heads of 72, MLP 4304
  (GELU-tanh), LayerNorm; 4096 tokens per 896x896 image (patch 14).
- Qwen2.5-VL-shaped: 32 layers, width 1280, 16 heads of 80, SwiGLU MLP 3420, RMSNorm; 4096
  tokens per 896x896 image. Every layer runs full attention here (the real tower uses 112-px
  windows in 28 of its 32 layers), so this is the attention-heaviest variant of that shape.

The same tower runs in one process with each attention asked for: ``attn="mla"`` (packed
[B*S, H, D] with q/k/v as strided views of the fused QKV projection, no copies, through
``torch.ops.mla.context_attention``: the launch the table picks), ``"mla-triton"`` /
``"mla-gluon"`` (the same with the portable or the sm_90 Gluon kernel forced, through a custom op
of this script that passes ``config={"family": ...}``, so the compiled layers stay one graph)
and ``attn="sdpa"`` (SDPA's default backend on [B, H, S, D] views). Latency per image batch is
the median of ``do_bench`` over whole-tower forwards from patch embedding to the last layer.

    PYTHONPATH=. python3 benchmarks/vit_towers_e2e.py --images 1,4 --json towers.json
    PYTHONPATH=. python3 benchmarks/vit_towers_e2e.py --attn mla-gluon,mla-triton,sdpa

``--interpret`` runs two tiny layers (fp32, eager) on the CPU through the Triton interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import harness, results  # noqa: E402
from benchmarks.shapes import (  # noqa: E402
    INTERPRET_IMAGE,
    INTERPRET_TOWER,
    TOWER_IMAGE,
    TOWER_PATCH,
    TOWERS,
)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

PROG = "vit_towers_e2e.py"


@torch.library.custom_op("mla_bench::context_attention_family", mutates_args=("o",))
def _context_attention_family(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              o: torch.Tensor, b_start: torch.Tensor, b_len: torch.Tensor,
                              max_len: int, family: str) -> None:
    """``mla_ops.context_attention_fwd`` (non-causal) with the kernel family forced."""
    import mla_ops

    mla_ops.context_attention_fwd(q, k, v, o, b_start, b_len, max_len, False,
                                  config={"family": family})


@_context_attention_family.register_fake
def _(q, k, v, o, b_start, b_len, max_len, family):
    return None


class Attention(nn.Module):
    def __init__(self, width, heads, attn):
        super().__init__()
        self.heads, self.head_dim, self.attn = heads, width // heads, attn
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x, b_start, b_len):  # x [B, S, W]
        batch, seq, width = x.shape
        qkv = self.qkv(x)  # [B, S, 3*W]
        if self.attn.startswith("mla"):
            qkv = qkv.view(batch * seq, 3, self.heads, self.head_dim)
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [B*S, H, D] strided views
            o = torch.empty_like(q, memory_format=torch.contiguous_format)
            if self.attn == "mla":
                torch.ops.mla.context_attention(q, k, v, o, b_start, b_len, seq, False)
            else:  # "mla-triton" / "mla-gluon"
                _context_attention_family(q, k, v, o, b_start, b_len, seq, self.attn[len("mla-"):])
            o = o.view(batch, seq, width)
        else:
            qkv = qkv.view(batch, seq, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # [B, H, S, D]
            o = o.transpose(1, 2).reshape(batch, seq, width)
        return self.proj(o)


class Block(nn.Module):
    def __init__(self, width, heads, mlp, swiglu, rms, attn):
        super().__init__()
        norm = nn.RMSNorm if rms else nn.LayerNorm
        self.norm1, self.norm2 = norm(width, eps=1e-6), norm(width, eps=1e-6)
        self.attn = Attention(width, heads, attn)
        self.swiglu = swiglu
        if swiglu:
            self.gate_up = nn.Linear(width, 2 * mlp)
        else:
            self.up = nn.Linear(width, mlp)
        self.down = nn.Linear(mlp, width)

    def forward(self, x, b_start, b_len):
        x = x + self.attn(self.norm1(x), b_start, b_len)
        h = self.norm2(x)
        if self.swiglu:
            gate, up = self.gate_up(h).chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(self.up(h), approximate="tanh")
        return x + self.down(h)


class Tower(nn.Module):
    def __init__(self, layers, width, heads, mlp, swiglu, rms, attn):
        super().__init__()
        self.patch = nn.Conv2d(3, width, TOWER_PATCH, stride=TOWER_PATCH)
        self.blocks = nn.ModuleList(Block(width, heads, mlp, swiglu, rms, attn) for _ in range(layers))

    def forward(self, images, b_start, b_len):
        x = self.patch(images).flatten(2).transpose(1, 2)  # [B, S, W]
        for blk in self.blocks:
            x = blk(x, b_start, b_len)
        return x


def run_tower(name, images, attn_impls, compile_layers=True, rep_ms=300, device="cuda"):
    """One tower at one image batch, each attention in turn: the row."""
    interpret = device != "cuda"
    cfg = INTERPRET_TOWER if interpret else TOWERS[name]
    image = INTERPRET_IMAGE if interpret else TOWER_IMAGE
    dtype = torch.float32 if interpret else torch.bfloat16  # the interpreter is wrong for bf16
    torch.manual_seed(0)
    ref_tower = Tower(attn="sdpa", **cfg).to(device, dtype).eval()
    state = ref_tower.state_dict()
    seq = (image // TOWER_PATCH) ** 2
    x = torch.randn(images, 3, image, image, device=device, dtype=dtype)
    b_start = torch.arange(images, dtype=torch.int32, device=device) * seq
    b_len = torch.full((images,), seq, dtype=torch.int32, device=device)
    row = {"tower": name, "images": images, "tokens_per_image": seq, **cfg}
    outs = {}
    for attn in attn_impls:
        tower = Tower(attn=attn, **cfg).to(device, dtype).eval()
        tower.load_state_dict(state)
        if compile_layers:
            for blk in tower.blocks:
                blk.compile(fullgraph=True, dynamic=False)
        t0 = time.time()
        with torch.inference_mode():
            outs[attn] = tower(x, b_start, b_len).float()
            if device == "cuda":
                torch.cuda.synchronize()
            row[f"{attn}_first_call_s"] = time.time() - t0
            ms = harness.time_ms(lambda: tower(x, b_start, b_len), device, warmup_ms=50,
                                 rep_ms=rep_ms)
        row[f"{attn}_ms"] = ms
        row[f"{attn}_ms_per_image"] = ms / images
        del tower
        if device == "cuda":
            torch.cuda.empty_cache()
    if "sdpa" in outs:
        b = outs["sdpa"]
        for attn in outs:
            if attn.startswith("mla"):
                tag = "" if attn == "mla" else f"_{attn}"
                row[f"speedup{tag}"] = row["sdpa_ms"] / row[f"{attn}_ms"]
                row[f"rel_err{tag}"] = ((outs[attn] - b).norm() / b.norm()).item()
    return row


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--towers", default="siglip,qwen2.5-vl")
    p.add_argument("--images", default="1,4", help="image batch sizes, comma-separated")
    p.add_argument("--attn", default="mla,sdpa",
                   help="comma-separated of mla (the table's launch), mla-triton, mla-gluon "
                   "(a kernel family forced), sdpa")
    p.add_argument("--eager", action="store_true", help="skip torch.compile")
    p.add_argument("--rep-ms", type=int, default=300)
    cli.add_common(p)
    args = p.parse_args(argv)
    towers = cli.split_names(p, [args.towers], list(TOWERS), "--towers")
    device = cli.pick_device(args.interpret, PROG)
    if device is None:
        return 2

    import mla_ops  # noqa: F401  (registers torch.ops.mla)

    # One compiled entry per (tower, attention, batch): more than dynamo's default of 8.
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    env = results.env_info()
    command = results.command_line(PROG, argv)
    cli.banner("ViT towers", env, " (tiny towers, eager, fp32)" if args.interpret else "")
    rows = []
    for name in towers:
        for n in (int(i) for i in args.images.split(",")):
            row = run_tower(name, n, args.attn.split(","),
                            not (args.eager or args.interpret), args.rep_ms, device)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:  # after every row: a run cut short still leaves what it measured
                results.write_json(args.json, rows, command=command, env=env)
    cli.finish(rows, ["tower", "images", "mla_ms", "mla-triton_ms", "mla-gluon_ms", "sdpa_ms",
                      "speedup", "speedup_mla-triton", "speedup_mla-gluon", "mla_ms_per_image",
                      "sdpa_ms_per_image", "rel_err"], None, command=command, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
