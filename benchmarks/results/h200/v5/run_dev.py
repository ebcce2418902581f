"""Device dev harness for the Gluon encoder kernel: `check VARIANT` (correctness), `bench`."""
import json, os, sys, time, traceback
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import torch
import mla_ops
from mla_ops.prefill import launch as L
from builders import encoder_case
OUT = os.environ.get("OUT", "/tmp")
VARIANTS = {
    "simple": {"PIPELINE": 0, "PINGPONG": 0},
    "pipe": {"PIPELINE": 1, "PINGPONG": 0},
    "pingpong": {"PIPELINE": 1, "PINGPONG": 1},
    "pp3": {"PIPELINE": 1, "PINGPONG": 1, "NUM_STAGES": 3},
    "pipe3": {"PIPELINE": 1, "PINGPONG": 0, "NUM_STAGES": 3},
    "ppsm": {"PIPELINE": 1, "PINGPONG": 1, "P_SMEM": 1},
    "pp4": {"PIPELINE": 1, "PINGPONG": 1, "NUM_STAGES": 4},
    "ppbn64": {"PIPELINE": 1, "PINGPONG": 1, "BLOCK_N": 64},
    "simplebn64": {"PIPELINE": 0, "PINGPONG": 0, "BLOCK_N": 64},
}
def gcfg(name, d):
    c = {"family": "gluon", **VARIANTS[name]}
    c.setdefault("BLOCK_N", 64 if d > 128 else 128)
    if c.get("NUM_STAGES", 2) > 2 and d > 96:
        c["NUM_STAGES"] = 2
    if c.get("NUM_STAGES", 2) > 3 and d > 64:
        c["NUM_STAGES"] = 3
    return c

def check(name):
    res = []
    cases = []
    for d in (64, 72, 80, 96, 128, 256):
        for causal in (False, True):
            cases.append(dict(lens=[1, 17, 128, 1000, 333, 2100], hq=4, hkv=2, d=d, causal=causal, gap=3, dtype=torch.bfloat16))
    cases.append(dict(lens=[1, 26, 64, 300], hq=4, hkv=2, d=72, causal=False, sinks=True, dtype=torch.bfloat16))
    cases.append(dict(lens=[1, 26, 64, 300], hq=4, hkv=2, d=80, causal=True, sinks=True, dtype=torch.bfloat16))
    cases.append(dict(lens=[5, 0, 40, 17, 700], hq=6, hkv=1, d=80, causal=False, gap=3, dtype=torch.float16))
    cases.append(dict(lens=[3520], hq=16, hkv=16, d=72, causal=False, dtype=torch.bfloat16))
    for kw in cases:
        rec = {"variant": name, **{k: (str(v) if k == "dtype" else v) for k, v in kw.items()}}
        t0 = time.time()
        try:
            torch.manual_seed(0)
            case = encoder_case("cuda", **kw)
            o = case.run(config=gcfg(name, kw["d"]))
            torch.cuda.synchronize()
            inside = case.inside()
            rec["gap_nan_ok"] = bool(o[~inside].isnan().all().item()) if (~inside).any() else True
            case.assert_matches(o)
            # capture + replay
            args = case.op_args()
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                mla_ops.context_attention_fwd(**args, config=gcfg(name, kw["d"]))
            torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
            args["o"].fill_(float("nan"))
            with torch.cuda.graph(g):
                mla_ops.context_attention_fwd(**args, config=gcfg(name, kw["d"]))
            args["o"].fill_(float("nan")); g.replay(); torch.cuda.synchronize()
            rec["graph_equal"] = bool(torch.equal(args["o"][inside], o[inside]))
            rec["ok"] = True
        except Exception as e:
            rec["ok"] = False
            rec["err"] = f"{type(e).__name__}: {str(e)[:300]}"
        rec["s"] = round(time.time() - t0, 1)
        print(json.dumps(rec), flush=True)
        res.append(rec)
    json.dump(res, open(f"/tmp/check_{name}.json", "w"), indent=0)

def bench(names):
    from triton.testing import do_bench
    from benchmarks import prefill as P
    shapes = [("P1", 1, 3520, 16, 64, False), ("P2", 1, 3520, 16, 72, False), ("P3", 1, 3520, 16, 80, False),
              ("P4", 1, 3520, 16, 96, False), ("P5", 1, 3520, 16, 128, False), ("P6", 1, 3520, 16, 256, False),
              ("P7", 4, 4096, 16, 72, False), ("P8", 4, 4096, 16, 80, False),
              ("C72", 4, 4096, 16, 72, True), ("C80", 4, 4096, 16, 80, True)]
    rows = []
    only = os.environ.get("SHAPES")
    if only:
        shapes = [x for x in shapes if x[0] in only.split(",")]
    for sh, b, s, h, d, causal in shapes:
        inputs = P.make_inputs(b, s, h, d)
        q, k, v, o, bs, bl = inputs
        row = {"shape": sh, "B": b, "S": s, "D": d, "causal": causal}
        fns = {}
        lau = L.build_launch(q, k, v, o, bs, bl, s, causal, config={"family": "triton"})
        fns["triton"] = lambda lau=lau: L.run_launch(lau)
        for n in names:
            lau_g = L.build_launch(q, k, v, o, bs, bl, s, causal, config=gcfg(n, d))
            assert lau_g.family == "gluon"
            fns[n] = lambda lau_g=lau_g: L.run_launch(lau_g)
        for be in (() if os.environ.get("NOSDPA") else ("flash", "cudnn", "efficient")):
            fns["sdpa-" + be] = P.sdpa_fn(inputs, b, s, causal, be)
        ref = None
        for name, fn in fns.items():
            try:
                o.fill_(float("nan")); fn(); torch.cuda.synchronize()
                if name == "triton":
                    ref = o.clone()
                elif not name.startswith("sdpa") and ref is not None:
                    row[name + "_diff"] = (o.float() - ref.float()).abs().max().item()
                row[name + "_ms"] = do_bench(fn, warmup=25, rep=100)
            except Exception as e:
                row[name + "_err"] = f"{type(e).__name__}: {str(e)[:200]}"
        sd = [row[k] for k in row if k.startswith("sdpa") and k.endswith("_ms")]
        if sd:
            row["sdpa_best_ms"] = min(sd)
            for n in ["triton"] + list(names):
                if n + "_ms" in row:
                    row[n + "_ratio"] = round(min(sd) / row[n + "_ms"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
        del inputs, q, k, v, o
        torch.cuda.empty_cache()
    json.dump(rows, open(f"{OUT}/bench{os.environ.get('TAG', '')}.json", "w"), indent=0)

if __name__ == "__main__":
    if sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        bench(sys.argv[2].split(","))
