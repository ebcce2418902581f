"""A speculative-decoding verify step of a DeepSeek-V3-shaped MLA model, as an engine runs it.

The attention stack of the model (random weights, N layers): per layer, the query and latent KV
projections, rotary embedding of the rope part, the new tokens' latent KV written into a
cross-layer paged cache (page 64), the absorbed query ``q_nope @ W_UK``, verify attention over
the cache, ``o @ W_UV`` and the output projection with a residual. Each step verifies qlen draft
tokens per request; real lengths differ per request and grow step by step.

The engines run the same model, each captured in one CUDA graph per batch bucket (1, 2, 4, …,
128) after its plan's warmup, replayed with new lengths and block tables:

- ``verify``: ``mla_ops.plan_verify(batch, qlen, ...)``, all qlen·H rows of a request over one
  pass of its KV;
- ``feed``: what an engine without a verify kernel does: one row per draft token (qlen = 1,
  the request's block table repeated per token, each token its own causal length);
- ``flashmla`` (where ``flash_mla`` imports, on a GPU): FlashMLA's dense decode
  (``flash_mla_with_kvcache``, ``causal=True`` with ``s_q = qlen``), its tile scheduler planned
  in the graph by each step's first layer from that step's lengths and shared by the other
  layers, as an engine runs it. FlashMLA has no padded drafts (real lengths): it attends over
  the whole draft and is checked against the model without padding.

``--variant JSON`` adds an engine ``variant``: the ``verify`` engine planned and captured while
the decode-verify table has those keys laid over every rule of the Gluon family (an A/B of a
table change end to end, in one process: ``--variant '{"BALANCE": 2}'``).

It reports the step latency and verified tokens/s of each, checks each against the same model
computed in plain PyTorch (float32 attention reference), and writes JSON.

    PYTHONPATH=. python benchmarks/serving_step_e2e.py --json $OUT/serving_step.json
    PYTHONPATH=. python benchmarks/serving_step_e2e.py --interpret   # tiny CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import tempfile
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import cli  # noqa: E402  (first: --interpret must precede triton's import)
from benchmarks import decode, harness, results  # noqa: E402

import mla_ops  # noqa: E402

# DeepSeek-V3 (per GPU under TP8: 16 heads; DP attention: all 128).
FULL = dict(hidden=7168, q_lora=1536, kv_lora=512, rope=64, nope=128, v_head=128, heads=16,
            layers=4, page=64, sm_scale=0.1352)
TINY = dict(hidden=64, q_lora=32, kv_lora=64, rope=32, nope=16, v_head=16, heads=2,
            layers=2, page=16, sm_scale=0.25)


class Model:
    """The attention stack with random weights (scaled so activations stay O(1))."""

    def __init__(self, cfg: dict, device: str, dtype: torch.dtype, seed: int = 0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        H, L = cfg["heads"], cfg["layers"]

        def w(*shape):
            fan_in = shape[-2] if len(shape) > 1 else shape[0]
            return (torch.randn(*shape, generator=g) / math.sqrt(fan_in)).to(device, dtype)

        self.layers = [dict(
            q_a=w(cfg["hidden"], cfg["q_lora"]),
            q_b=w(cfg["q_lora"], H * (cfg["nope"] + cfg["rope"])),
            kv_a=w(cfg["hidden"], cfg["kv_lora"] + cfg["rope"]),
            w_uk=w(H, cfg["nope"], cfg["kv_lora"]),
            w_uv=w(H, cfg["kv_lora"], cfg["v_head"]),
            o_proj=w(H * cfg["v_head"], cfg["hidden"]),
        ) for _ in range(L)]

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of the last dim of ``x`` ``[T, ..., rope]`` at positions ``pos``."""
        half = x.shape[-1] // 2
        freq = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
        ang = pos.float()[:, None] * freq[None, :]
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
        cos, sin = ang.cos().view(shape), ang.sin().view(shape)
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).to(x.dtype)

    def step(self, x, pos, slots, cache, attend):
        """One forward of the stack over new tokens ``x`` ``[T, hidden]`` at positions ``pos``,
        writing their latent KV at cache ``slots`` first; ``attend(layer, q)`` -> o latent."""
        cfg, H = self.cfg, self.cfg["heads"]
        pages, page = cache.shape[0], cache.shape[1]
        flat = cache.view(pages * page, cache.shape[2], cache.shape[3])
        for li, p in enumerate(self.layers):
            kv = x @ p["kv_a"]  # [T, kv_lora + rope]
            latent = torch.nn.functional.rms_norm(kv[:, :cfg["kv_lora"]], (cfg["kv_lora"],))
            k_pe = self.rope(kv[:, cfg["kv_lora"]:], pos)
            flat[slots, li] = torch.cat([latent, k_pe], -1).to(cache.dtype)
            qa = torch.nn.functional.rms_norm(x @ p["q_a"], (cfg["q_lora"],))
            q = (qa @ p["q_b"]).view(-1, H, cfg["nope"] + cfg["rope"])
            q_nope = torch.einsum("thn,hnc->thc", q[..., :cfg["nope"]], p["w_uk"])  # absorbed
            q_pe = self.rope(q[..., cfg["nope"]:], pos)
            o = attend(li, torch.cat([q_nope, q_pe], -1))  # [T, H, kv_lora]
            o = torch.einsum("thc,hcv->thv", o, p["w_uv"]).reshape(-1, H * cfg["v_head"])
            x = x + o @ p["o_proj"]
        return x


def make_requests(cfg, batch, qlen, max_len, steps, num_pages, device, gen):
    """Starting lengths that leave room for ``steps`` verify steps, and block tables."""
    page = cfg["page"]
    pages_per = math.ceil(max_len / page)
    lens = torch.randint(qlen, max(qlen, max_len - steps * qlen) + 1, (batch,), generator=gen)
    table = torch.randperm(num_pages, generator=gen)[: batch * pages_per].view(batch, pages_per)
    return lens.int().to(device), table.int().to(device)


def next_step(lens, qlen, gen):
    """The next verify step: each request accepted 1..qlen tokens of its last draft; its new
    draft of qlen tokens is written after them; some drafts are padded (real < L)."""
    grown = lens + torch.randint(1, qlen + 1, lens.shape, generator=gen).to(lens.device).int()
    real = grown - torch.randint(0, qlen, lens.shape, generator=gen).to(lens.device).int()
    return grown, real


def feed_metadata(lens, real, table, qlen):
    """The qlen = 1 feed of the same batch: one row per draft token, its own causal length."""
    t = torch.arange(qlen, device=lens.device)
    row_len = (lens[:, None] - qlen + 1 + t[None, :]).clamp(min=0)
    row_len = torch.minimum(row_len, real[:, None]).reshape(-1).int()
    return row_len, table.repeat_interleave(qlen, dim=0)


class Engine:
    """One engine (``verify``, ``feed`` or ``flashmla``) for one batch bucket: static buffers,
    its plan, and (on CUDA) the step captured in a graph. ``flashmla``: the imported module."""

    def __init__(self, kind, model, cache, batch, qlen, max_len, device, interpret, flashmla=None):
        cfg = model.cfg
        self.kind, self.model, self.cache, self.qlen = kind, model, cache, qlen
        self.fm, self.meta = flashmla, None
        rows = batch * qlen
        H, Lk, Lv = cfg["heads"], cfg["kv_lora"] + cfg["rope"], cfg["kv_lora"]
        pages_per = math.ceil(max_len / cfg["page"])
        pb, pq = (rows, 1) if kind == "feed" else (batch, qlen)
        self.plan = None if kind == "flashmla" else mla_ops.plan_verify(
            pb, pq, H, max_len, dtype=model.dtype, device=device, page_size=cfg["page"], head_dim=Lk,
            v_head_dim=Lv)
        self.x = torch.zeros(rows, cfg["hidden"], device=device, dtype=model.dtype)
        self.pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.zeros(rows, dtype=torch.long, device=device)
        self.lens = torch.zeros(pb, dtype=torch.int32, device=device)
        self.real = torch.zeros(pb, dtype=torch.int32, device=device)
        self.table = torch.zeros(pb, pages_per, dtype=torch.int32, device=device)
        self.o = torch.empty(rows, H, Lv, device=device, dtype=model.dtype)
        self.lse = torch.empty(rows, H, device=device, dtype=torch.float32)
        if self.plan is not None:
            q0 = torch.empty(rows, H, Lk, device=device, dtype=model.dtype)
            self.plan.alloc_workspace()
            self.plan.warmup(q0, cache[:, :, :1], self.o, self.lse, self.table,
                             sm_scale=cfg["sm_scale"], has_real=kind == "verify")
        self.out = None
        self.graph = None
        if device == "cuda" and not interpret:
            self._run()  # allocations of the eager step, outside the capture
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = self._run()

    def attend(self, layer, q):
        kv = self.cache[:, :, layer:layer + 1]  # this layer's view of the cross-layer cache
        if self.kind == "flashmla":
            cfg = self.model.cfg
            if self.meta is None:  # this step's first layer plans the tile scheduler
                self.meta = self.fm.get_mla_metadata()[0]
            b = self.lens.shape[0]
            o, _ = self.fm.flash_mla_with_kvcache(
                q.view(b, self.qlen, q.shape[1], q.shape[2]), kv, self.table, self.lens, cfg["kv_lora"],
                self.meta, None, softmax_scale=cfg["sm_scale"], causal=True)
            return o.view(q.shape[0], q.shape[1], -1)
        real = self.real if self.kind == "verify" else None
        self.plan.run(q, kv, self.o, self.lse, self.table, self.lens, real_seq_lens=real,
                      sm_scale=self.model.cfg["sm_scale"])
        return self.o

    def _run(self):
        self.meta = None  # (flashmla) planned again from this step's lengths
        return self.model.step(self.x, self.pos, self.slots, self.cache, self.attend)

    def load(self, x, pos, slots, lens, real, table):
        self.x.copy_(x)
        self.pos.copy_(pos)
        self.slots.copy_(slots)
        if self.kind != "feed":
            self.lens.copy_(lens)
            self.real.copy_(real)
            self.table.copy_(table)
        else:
            row_len, row_table = feed_metadata(lens, real, table, self.qlen)
            self.lens.copy_(row_len)
            self.table.copy_(row_table)

    def __call__(self):
        if self.graph is None:
            return self._run()
        self.graph.replay()
        return self.out


@contextlib.contextmanager
def gluon_rules_with(overrides: dict):
    """The decode-verify table of this GPU with ``overrides`` laid over each rule of the Gluon
    family, for the launches selected inside (a captured graph keeps them); the package's table
    again after."""
    from mla_ops import platform, tuning

    kernel = tuning.KERNELS["decode_verify"]
    arch = platform.current().arch
    tbl = copy.deepcopy(tuning.table("decode_verify", arch))
    for rule in tbl["rules"]:
        if rule["config"].get("family") == "gluon":
            rule["config"].update(overrides)
    saved = kernel.table_dir
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, f"{arch}.json"), "w") as f:
            json.dump(tbl, f)
        kernel.table_dir = type(saved)(tmp)
        tuning.table.cache_clear()
        try:
            yield
        finally:
            kernel.table_dir = saved
            tuning.table.cache_clear()


def reference_attend(cache, lens, real, table, qlen, cfg):
    def attend(layer, q):
        o, _ = mla_ops.decode_verify_ref(q, cache[:, :, layer:layer + 1], cfg["kv_lora"], table,
                                         lens, real, qlen, cfg["sm_scale"], cfg["page"])
        return o.to(q.dtype)
    return attend


def step_inputs(cfg, batch, qlen, lens, table, device, gen, dtype):
    x = torch.randn(batch * qlen, cfg["hidden"], generator=gen).to(device, dtype)
    t = torch.arange(qlen, device=device)
    pos = (lens.long()[:, None] - qlen + t[None, :]).reshape(-1)
    page = cfg["page"]
    pos2 = pos.view(batch, qlen)
    slots = table.long().gather(1, pos2 // page) * page + pos2 % page
    return x, pos, slots.reshape(-1)


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def time_step(fn, device, reps):
    """Median µs of one step: a graph replay queued behind a GPU sleep (so the host's launch
    latency is not in it, as inside an engine's loop); on CPU one eager call."""
    if device != "cuda":
        return harness.time_wall_us(fn)
    fn()
    torch.cuda.synchronize()
    return harness.time_replays(fn, reps, prequeue_cycles=20_000_000)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    p.add_argument("--qlens", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--heads", type=int, default=None, help="query heads per GPU (default 16)")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--max-len", type=int, default=4096, help="longest KV length of a request")
    p.add_argument("--steps", type=int, default=3, help="verify steps checked per bucket")
    p.add_argument("--reps", type=int, default=50, help="timed replays per bucket")
    p.add_argument("--interpret", action="store_true", help=cli.INTERPRET_HELP)
    p.add_argument("--no-flashmla", action="store_true",
                   help="no FlashMLA engine even where flash_mla imports")
    p.add_argument("--variant", type=json.loads, default=None, metavar="JSON",
                   help="an engine 'variant': verify with these keys over the table's Gluon rules")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    device = cli.pick_device(args.interpret, "serving_step_e2e.py")
    if device is None:
        return 2
    cfg = dict(TINY if args.interpret else FULL)
    if args.heads:
        cfg["heads"] = args.heads
    if args.layers:
        cfg["layers"] = args.layers
    dtype = torch.float16 if args.interpret else torch.bfloat16
    max_len = 64 if args.interpret else args.max_len
    batches = [b for b in args.batches if not args.interpret or b <= 2]
    model = Model(cfg, device, dtype)
    fm = None if args.no_flashmla or device != "cuda" else decode.load_flashmla()
    kinds = ("verify", "feed") + (("flashmla",) if fm is not None else ())
    if fm is not None:
        print(f"FlashMLA from {os.path.dirname(fm.__file__)}: a third engine", flush=True)
    gen = torch.Generator(device="cpu").manual_seed(1)
    pages_per = math.ceil(max_len / cfg["page"])
    num_pages = max(batches) * pages_per + 8
    # One cross-layer paged latent cache: [pages, page, layers, kv_lora + rope].
    cache = torch.randn(num_pages, cfg["page"], cfg["layers"], cfg["kv_lora"] + cfg["rope"],
                        generator=gen).to(device, dtype)
    rows = []
    for qlen in args.qlens if not args.interpret else args.qlens[:1]:
        for batch in batches:
            engines = {k: Engine(k, model, cache, batch, qlen, max_len, device, args.interpret, fm)
                       for k in kinds}
            if args.variant:
                with gluon_rules_with(args.variant):
                    engines["variant"] = Engine("verify", model, cache, batch, qlen, max_len, device,
                                                args.interpret)
            errs = {k: 0.0 for k in engines}
            lens, table = make_requests(cfg, batch, qlen, max_len, args.steps, num_pages, device,
                                        gen)
            for _ in range(args.steps):
                lens, real = next_step(lens, qlen, gen)
                x, pos, slots = step_inputs(cfg, batch, qlen, lens, table, device, gen, dtype)
                ref_cache = cache.clone()
                ref = model.step(x, pos, slots, ref_cache,
                                 reference_attend(ref_cache, lens, real, table, qlen, cfg))
                if fm is not None:  # FlashMLA attends over the whole draft (no real lengths)
                    ref_cache = cache.clone()
                    ref_full = model.step(x, pos, slots, ref_cache,
                                          reference_attend(ref_cache, lens, lens, table, qlen, cfg))
                for kind, eng in engines.items():
                    eng.load(x, pos, slots, lens, real, table)
                    out = eng()
                    errs[kind] = max(errs[kind], rel_err(out, ref_full if kind == "flashmla" else ref))
            us = {k: time_step(e, device, args.reps) for k, e in engines.items()}
            row = dict(qlen=qlen, batch=batch, heads=cfg["heads"], layers=cfg["layers"],
                       max_len=max_len, splits=engines["verify"].plan.num_kv_splits,
                       verify_us=us["verify"], feed_us=us["feed"],
                       verify_tok_s=batch * qlen / us["verify"] * 1e6,
                       feed_tok_s=batch * qlen / us["feed"] * 1e6,
                       speedup=us["feed"] / us["verify"], err_verify=errs["verify"],
                       err_feed=errs["feed"])
            fm_txt = ""
            if "flashmla" in us:
                row.update(flashmla_us=us["flashmla"], err_flashmla=errs["flashmla"],
                           vs_flashmla=us["verify"] / us["flashmla"])
                fm_txt = f"  flashmla {us['flashmla']:9.1f} us (verify / flashmla {row['vs_flashmla']:.3f})"
            if "variant" in us:
                row.update(variant=args.variant, variant_us=us["variant"], err_variant=errs["variant"],
                           variant_vs_verify=us["variant"] / us["verify"])
                fm_txt += f"  variant {us['variant']:9.1f} us (/ verify {row['variant_vs_verify']:.3f}"
                if "flashmla" in us:
                    row["variant_vs_flashmla"] = us["variant"] / us["flashmla"]
                    fm_txt += f", / flashmla {row['variant_vs_flashmla']:.3f}"
                fm_txt += ")"
            rows.append(row)
            print(f"qlen {qlen} B {batch:4d}: verify {us['verify']:9.1f} us  feed "
                  f"{us['feed']:9.1f} us  x{row['speedup']:.2f}{fm_txt}  err "
                  + " / ".join(f"{errs[k]:.1e}" for k in engines), flush=True)
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    ok = all(r[f"err_{k}"] < tol for r in rows for k in kinds + (("variant",) if args.variant else ()))
    print(f"{'all steps match the plain-PyTorch model' if ok else 'MISMATCH'} (rel. err < {tol})")
    if args.json:
        results.write_json(args.json, rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
