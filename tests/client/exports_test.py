#!/usr/bin/env python3
"""Every export applied by the real client and compared with the unsharded model.

Per case: `autoshard synth` writes a tiny model, `autoshard plan` plans it, `autoshard export`
writes the DTensor plan and transformers' tp_plan, `autoshard shard --plan` cuts the
checkpoint. Then on N forked Gloo ranks (CPU):
  * dtensor: the model loaded whole, apply_dtensor_plan() (docs/cli.md's snippet), logits
    within 1e-5 of the unsharded model's (a decode plan's, of `past` prompt tokens' forward then
    one step after their key/value cache, which the attention modules keep), greedy generate() token for token (when the plan does
    not fix the input shape), every rank file byte-equal to PyTorch's local shards, and, for a
    training plan, one training step run as the export's notes say (each data-parallel rank on
    its slice of the batch, tp_gradient_sums summed, DDP's or FSDP2's averaging) with every
    gradient within 1e-4 of the unsharded model's;
  * hf: from_pretrained(distributed_config=DistributedConfig(tp_plan=...)), the same logits and
    generate(); the export must name every entry of the model class's own plan; a training plan
    also trains one step (each data-parallel rank on its rows, transformers' FSDP2 averaging
    them), every gradient within 1e-4 of the unsharded model's.
An export the case expects refused must exit 1 naming the operator; anything else (a crash in
PyTorch, a wrong logit, an unexpected refusal) fails the case.
Usage: exports_test.py --tool build/gcc/tools/autoshard [--only NAME ...] [--list]
"""
import argparse, contextlib, copy, json, os, pathlib, re, shutil, subprocess, sys, tempfile, time, traceback
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client  # noqa: E402  (sets torch's threads before anything runs)
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, DistributedConfig  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
ROOT = pathlib.Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"

# Tiny models (autoshard synth): every one has its family's parameter names and layouts.
LLAMA = ["--model", "llama-7b", "--layers", "2", "--hidden", "64", "--heads", "8", "--kv-heads", "8", "--ffn", "128",
         "--vocab", "256", "--seq", "32"]


def with_(args, flag, value):
    """`args` with `flag`'s value replaced."""
    k = args.index(flag)
    return args[:k + 1] + [value] + args[k + 2:]


MODELS = {
    # docs/cli.md's export example
    "llama-docs": ["--model", "llama-7b", "--layers", "2", "--hidden", "256", "--heads", "8", "--kv-heads", "8", "--ffn", "512",
                   "--vocab", "1024", "--seq", "64"],
    "llama": LLAMA,
    "llama-kv2": with_(LLAMA, "--kv-heads", "2"),
    "llama-kv4": with_(LLAMA, "--kv-heads", "4"),
    "llama-ffn100": with_(LLAMA, "--ffn", "100"),
    "qwen2": ["--model", str(HF / "qwen2-0.5b.json"), "--layers", "2", "--hidden", "64", "--heads", "8", "--kv-heads", "4",
              "--ffn", "128", "--vocab", "256", "--seq", "32"],
    "qwen2-14h": ["--model", str(HF / "qwen2-0.5b.json"), "--layers", "2", "--hidden", "112", "--heads", "14",
                  "--ffn", "128", "--vocab", "256", "--seq", "32"],
    "qwen2-kv2": ["--model", str(HF / "qwen2-0.5b.json"), "--layers", "2", "--hidden", "64", "--heads", "8", "--kv-heads", "2",
                  "--ffn", "128", "--vocab", "256", "--seq", "32"],
    "mistral": ["--model", str(HF / "mistral-7b-v0.1.json"), "--layers", "2", "--hidden", "64", "--heads", "8",
                "--kv-heads", "4", "--ffn", "128", "--vocab", "256", "--seq", "32"],
    "gpt2": ["--model", "gpt2", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "32"],
}


class Case:
    """plan: `autoshard plan` options; dtensor, hf: "exact" or ("refused", what the error names);
    plan_refused: `plan` itself must exit 1 naming this; policy: also `shard --policy NAME` on
    `world` ranks, its rank files compared with what transformers holds under the same split;
    verify: `autoshard verify --plan` must pass; past: a decode plan (--kv-cache past --seq 1),
    whose logits are compared after a prompt of `past` tokens (forward)."""

    def __init__(self, name, model, world, plan, dtensor="exact", hf="exact", generate=False, batch=4, seq=16,
                 plan_refused=None, policy=None, verify=False, budget=None, past=0):
        self.name, self.model, self.world, self.plan, self.past = name, model, world, plan + (["--kv-cache", str(past)] if past else []), past
        self.expect = {"dtensor": dtensor, "hf": hf}  # "exact" or ("refused", text the error names)
        self.generate, self.batch, self.seq = generate, batch, seq
        self.plan_refused, self.policy, self.verify = plan_refused, policy, verify
        self.budget = budget  # a memory budget of this many times the smallest the planner can meet


MEGATRON = ["--algo", "megatron"]
INFER = ["--mode", "infer"]
# Links with no latency: the cost model then prefers Megatron's sequence parallelism (and the
# splits of the batch in its place) at these tiny sizes, as it does for real ones.
NO_LATENCY = ["--intra-lat", "0", "--intra-hop", "0", "--inter-lat", "0", "--inter-hop", "0"]


def pin(*specs):
    return [w for s in specs for w in ("--pin", s)]


def layers(fmt, n=2):
    return [fmt.format(i) for i in range(n)]


CASES = [
    # docs/cli.md's example: the Megatron training plan on dp=2,tp=4.
    Case("docs-llama-dp2-tp4", "llama-docs", 8, ["--mesh", "dp=2,tp=4", *MEGATRON, "--batch", "8"], batch=8, seq=64),
    # The Megatron plan on a 1-D tp=4 mesh at batch 4 (its sequence-parallel regions split the batch).
    Case("llama-megatron-tp4-b4", "llama", 4, ["--mesh", "tp=4", *MEGATRON, "--batch", "4"]),
    Case("llama-megatron-tp4-infer", "llama", 4, ["--mesh", "tp=4", *MEGATRON, "--mode", "infer", "--batch", "4"], generate=True),
    # One node named as a 2-D mesh with a data-parallel axis of one rank (a one-rank axis offers
    # Replicate only): the exports put nothing on it, and PyTorch computes the model exactly.
    Case("llama-megatron-dp1-tp4-infer", "llama", 4, ["--mesh", "dp=1,tp=4", *MEGATRON, *INFER, "--batch", "4"], generate=True),
    Case("llama-alpa-dp1-tp4-infer", "llama-docs", 4, ["--mesh", "dp=1,tp=4", *INFER, "--batch", "4"], budget=1.6),
    # The planner's own plans of a 2-layer LLaMA on 4 ranks: under memory budgets that make it cut
    # weights (tensor parallelism), and without one, where it splits the batch over the ranks.
    # Training may recompute layers, which lowers the smallest budget: at 1.1x of it the plan
    # stores embed_tokens sharded over tp and gathers it at use, where the embedding computes
    # on whole rows: FSDP2 over tp would sum whole gradients (refused); at 1.4x it cuts weights
    # (at 1.3x, since the embedding is priced by the rows it gathers, o_proj keeps its weight
    # whole behind column-parallel q/k/v, which a tp_plan cannot say: refused, as it should be).
    Case("llama-alpa-train-4", "llama-docs", 4, ["--mesh", "4", "--batch", "4"], budget=1.4),
    Case("llama-alpa-train-4-tight", "llama-docs", 4, ["--mesh", "4", "--batch", "4"], budget=1.1,
         dtensor=("refused", "'model.embed_tokens.weight' (parameter): stored S(0) on mesh axis 0 and gathered whole"),
         hf=("refused", "'model.embed_tokens' (embedding): its weight is stored S(0) but used R")),
    Case("llama-alpa-infer-4", "llama-docs", 4, ["--mesh", "4", *INFER, "--batch", "4"], budget=1.6, generate=True),
    # ... for inference no gradient is summed: the table is FSDP2's over tp, gathered at use.
    Case("llama-alpa-infer-4-tight", "llama-docs", 4, ["--mesh", "4", *INFER, "--batch", "4"], budget=1.1,
         hf=("refused", "'model.embed_tokens' (embedding): its weight is stored S(0) but used R")),
    # Without a budget the planner splits only the batch: data parallelism, nothing to shard.
    Case("llama-alpa-infer-2x2", "llama", 4, ["--mesh", "dp=2,tp=2", *INFER, "--batch", "4"]),
    # Two KV heads on tp 4.
    Case("llama-kv2-megatron-tp4", "llama-kv2", 4, ["--mesh", "tp=4", *MEGATRON, "--mode", "infer", "--batch", "4"],
         generate=True),
    # A decode step after a key/value cache of 8 tokens, 4 key/value heads split over tp 4: the
    # cache is the attention modules' state (transformers' DynamicCache), the rank's heads, and
    # both exports are the prefill plan's; generate() runs on it token for token.
    Case("llama-kv4-decode-tp4", "llama-kv4", 4, ["--mesh", "tp=4", *MEGATRON, *INFER, "--batch", "4"], seq=1, past=8,
         generate=True),
    # Qwen2: q/k/v biases; 14 heads, which tp 4 does not divide.
    Case("qwen2-megatron-tp4", "qwen2", 4, ["--mesh", "tp=4", *MEGATRON, "--mode", "infer", "--batch", "4"], generate=True),
    # Qwen2's tied table split on the vocabulary for both uses, trained: the export's "tied" makes
    # the two styles' parameters one again, whose gradient sums both uses (as the unsharded model's).
    Case("qwen2-megatron-tp4-train", "qwen2", 4, ["--mesh", "tp=4", *MEGATRON, "--batch", "4"]),
    Case("mistral-megatron-tp4", "mistral", 4, ["--mesh", "tp=4", *MEGATRON, "--mode", "infer", "--batch", "4"]),
    # An FFN of 100 over 8 ranks: shards of 13 and 9.
    Case("llama-ffn100-megatron-tp8", "llama-ffn100", 8, ["--mesh", "tp=8", *MEGATRON, "--mode", "infer", "--batch", "4"]),
    # Sequence-parallel regions (reduce-scatter into them, all-gather out), the embedding split on
    # its hidden dim, a vocabulary-parallel loss (loss_parallel), data parallelism on dp.
    Case("llama-megatron-dp2-tp4-sp", "llama", 8, ["--mesh", "dp=2,tp=4", *MEGATRON, "--batch", "8", *NO_LATENCY], batch=8),
    # Batch-split regions on a 1-D tp mesh (the residual stream sliced, norms on a slice).
    Case("llama-megatron-tp4-b4-split", "llama", 4, ["--mesh", "tp=4", *MEGATRON, "--batch", "4", *NO_LATENCY]),
    # The attention's input arriving sequence-parallel (the norm before it pinned split on the
    # sequence): the attention module reads its batch and sequence length off that input
    # (LLaMA's input_shape = hidden_states.shape[:-1]), so it must see the whole shape.
    Case("llama-sp-into-attention", "llama", 4,
         ["--mesh", "tp=4", *MEGATRON, "--batch", "4", *NO_LATENCY, *pin(*layers("model.layers.{}.input_layernorm=RS0R"))]),
    # lm_head split on the vocabulary: its output gathered (colwise_gather_output), generate() exact.
    Case("llama-lm-head-split", "llama", 4, ["--mesh", "tp=4", *MEGATRON, *INFER, "--batch", "4", *pin("lm_head.weight=S0R")],
         generate=True),
    # A gather before a replicated layer: o_proj whole after split heads.
    Case("llama-gather-before-whole-o-proj", "llama", 4,
         ["--mesh", "tp=4", *INFER, "--batch", "4",
          *pin(*layers("model.layers.{}.self_attn.q_proj.weight=S0R"), *layers("model.layers.{}.self_attn.k_proj.weight=S0R"),
               *layers("model.layers.{}.self_attn.v_proj.weight=S0R"), *layers("model.layers.{}.self_attn.attention=RRS0"),
               *layers("model.layers.{}.self_attn.o_proj.weight=RR"))], generate=True,
         hf=("refused", "'model.layers.0.self_attn.o_proj' (linear): its input arrives split on its features")),
    # A weight stored whole and computed on a slice next to split siblings.
    Case("llama-whole-weight-sliced-use", "llama", 4,
         ["--mesh", "tp=4", *INFER, "--batch", "4",
          *pin(*layers("model.layers.{}.self_attn.q_proj.weight=RR"), *layers("model.layers.{}.self_attn.q_proj=RRS0"),
               *layers("model.layers.{}.self_attn.k_proj.weight=S0R"), *layers("model.layers.{}.self_attn.v_proj.weight=S0R"))],
         hf=("refused", "'model.layers.0.self_attn.attention' (attention): transformers hands it")),
    # A bias stored whole next to its split weight: no style holds that.
    Case("qwen2-whole-bias", "qwen2", 4,
         ["--mesh", "tp=4", *INFER, "--batch", "4",
          *pin("model.layers.0.self_attn.q_proj.weight=S0R", "model.layers.0.self_attn.q_proj.bias=R",
               "model.layers.0.self_attn.q_proj=RRS0")],
         dtensor=("refused", "'model.layers.0.self_attn.q_proj' (linear): its bias is stored R"),
         hf=("refused", "'model.layers.0.self_attn.q_proj' (linear): its bias is stored R")),
    # 14 heads on 4 ranks: the Megatron baseline refuses (it would cut q_proj at 3.5 heads); the
    # planner's own plan keeps the heads whole (the projections' outputs gathered before rotary).
    Case("qwen2-14-heads-megatron-tp4", "qwen2-14h", 4, ["--mesh", "tp=4", *MEGATRON, *INFER, "--batch", "4"],
         plan_refused="'model.layers.0.self_attn.attention' has 14 attention heads, which the 4 ranks"),
    # The planner keeps 14 heads whole on 4 ranks; the tied table it splits for lm_head is
    # gathered whole for the embedding at use, which no style does.
    Case("qwen2-14-heads-alpa-tp4", "qwen2-14h", 4, ["--mesh", "tp=4", *INFER, "--batch", "4"], budget=1.6,
         dtensor=("refused", "'model.embed_tokens' (embedding): its weight is stored S(0) but used R"),
         hf=("refused", "'model.embed_tokens' (embedding): its weight is stored S(0) but used R")),
    # Two key/value heads with biases (Qwen2) replicated over 4 ranks.
    # ... and on dp=2,tp=4: the heads on a sub-mesh of each tp group; transformers refuses.
    Case("llama-kv2-megatron-dp2-tp4", "llama-kv2", 8, ["--mesh", "dp=2,tp=4", *MEGATRON, *INFER, "--batch", "4"],
         hf=("refused", "'model.layers.0.self_attn.k_proj' (linear): transformers 5 puts the mesh's other axes")),
    Case("qwen2-kv2-megatron-tp4", "qwen2-kv2", 4, ["--mesh", "tp=4", *MEGATRON, *INFER, "--batch", "4"], generate=True,
         verify=True),
    # 4 key/value heads on 8 ranks: `shard --policy llama --tp 8` holds each head on 2 ranks as
    # transformers' unit_colwise does; the Megatron plan replicates them too and verifies.
    Case("llama-kv4-tp8-policy", "llama-kv4", 8, ["--mesh", "tp=8", *MEGATRON, *INFER, "--batch", "4"], policy="llama",
         verify=True),
    # Training with them: the forward is exact, but the backward of PyTorch's slice on a sub-mesh
    # of heads sums no gradient over the ranks that share a head (measured: 0.4-1.3 relative
    # errors), so the DTensor export refuses it; transformers' unit_colwise trains it exactly.
    Case("llama-kv4-tp8-train", "llama-kv4", 8, ["--mesh", "tp=8", *MEGATRON, "--batch", "8"], batch=8, verify=True,
         dtensor=("refused", "the backward of the slice PyTorch takes on a sub-mesh of heads sums no gradient")),
    # The planner's own LLaMA-7B plan on 8 H100s, small: the embedding split on its hidden dim,
    # the batch sliced from its output on (every rotary and attention on the slice: the model
    # computes its mask off the embedding's output), lm_head's output gathered.
    Case("llama-embedding-split-batch-sliced-4", "llama", 4,
         ["--mesh", "4", "--batch", "4", *pin("model.embed_tokens.weight=[S(1)]", "model.embed_tokens=[S(2)]",
                                             *layers("model.layers.{}.self_attn.attention=[S(0)]"))]),
    # ZeRO-3 on data-parallel axes: FSDP2 (fully_shard) after the tensor-parallel styles, one
    # training step's gradients checked too; transformers' tp_plan has no FSDP to say it with.
    # The zero3 baseline on one axis (each weight sharded on the dim the plan stores it split on)...
    Case("llama-zero3-4", "llama", 4, ["--mesh", "4", "--algo", "zero3", "--batch", "4"],
         hf=("refused", "the DTensor export writes that as FSDP2")),
    # ... on dp=2,tp=2, where it splits weights on a dim per axis (FSDP2 shards one dim over both)...
    Case("llama-zero3-dp2-tp2", "llama", 4, ["--mesh", "dp=2,tp=2", "--algo", "zero3", "--batch", "4"],
         hf=("refused", "as FSDP2")),
    # The planner's own LLaMA-7B plan on 2x8 H100s, small: the embedding split on its hidden dim
    # over tp, the batch sliced from its output on, and weights stored ZeRO-3 over tp (gathered
    # whole at each use): FSDP2 over tp too, summing the tp ranks' shares of one loss (its
    # gradient divided by the data-parallel ranks only), HSDP's replicate dim over dp.
    Case("llama-zero3-on-tp-batch-sliced-dp2-tp2", "llama", 4,
         ["--mesh", "dp=2,tp=2", "--batch", "4",
          *pin("model.embed_tokens.weight=[R,S(1)]", "model.embed_tokens=[S(0),S(2)]",
               *layers("model.layers.{}.self_attn.attention=[S(0),S(0)]"),
               *layers("model.layers.{}.mlp.up_proj.weight=[R,S(0)]"), *layers("model.layers.{}.mlp.up_proj=[S(0),S(0)]"),
               *layers("model.layers.{}.self_attn.o_proj.weight=[R,S(1)]"),
               *layers("model.layers.{}.self_attn.o_proj=[S(0),S(0)]"))],
         hf=("refused", "as FSDP2")),
    # The planner's own LLaMA-70B plan on 8x8 H100s, small: the attention on a slice of the batch
    # over both axes, its weights ZeRO-3 over tp; the MLP tensor-parallel on tp, its weights
    # ZeRO-3 over dp besides; lm_head column-parallel on the batch gathered over tp. One
    # fully_shard unit per submodule, each over its own axes (FSDP2 cannot shard the MLP's
    # tensor-parallel weights over tp again).
    Case("llama-fsdp-units-dp2-tp2", "llama", 4,
         ["--mesh", "dp=2,tp=2", "--batch", "4",
          *pin("model.embed_tokens.weight=[R,S(1)]", "model.embed_tokens=[S(0),S(2)]",
               *[f"{l}.{o}=[S(0),S(0)]" for l in layers("model.layers.{}")
                 for o in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.attention",
                           "self_attn.o_proj", "self_attn.residual", "post_attention_layernorm", "mlp.residual")],
               *[f"{l}.self_attn.{w}.weight=[R,S(0)]" for l in layers("model.layers.{}") for w in ("q_proj", "k_proj", "v_proj")],
               *layers("model.layers.{}.self_attn.o_proj.weight=[R,S(1)]"),
               *[f"{l}.mlp.{w}.weight=[S(1),S(0)]" for l in layers("model.layers.{}") for w in ("gate_proj", "up_proj")],
               *[f"{l}.mlp.{w}=[S(0),S(2)]" for l in layers("model.layers.{}") for w in ("gate_proj", "up_proj")],
               *layers("model.layers.{}.mlp.down_proj.weight=[S(0),S(1)]"),
               "lm_head.weight=[R,S(0)]", "lm_head=[S(0),S(2)]")],
         hf=("refused", "as FSDP2")),
    # ... HSDP: two weights ZeRO-3 on tp, replicated on dp, the others whole (ignored_params) ...
    Case("llama-hsdp-dp2-tp2", "llama", 4,
         ["--mesh", "dp=2,tp=2", "--batch", "4", *pin(*layers("model.layers.{}.mlp.up_proj.weight=[R,S(0)]"),
                                                    *layers("model.layers.{}.mlp.up_proj=[S(0),S(0)]"))],
         hf=("refused", "as FSDP2")),
    # ... and with tensor parallelism on tp: up_proj's in-features over dp (FSDP on another dim than
    # the column split), gate_proj's out-features over both (FSDP shards each tp shard again).
    Case("llama-fsdp-tp-dp2-tp2", "llama", 4,
         ["--mesh", "dp=2,tp=2", "--batch", "4",
          *pin(*layers("model.layers.{}.mlp.up_proj.weight=[S(1),S(0)]"), *layers("model.layers.{}.mlp.up_proj=[S(0),S(2)]"),
               *layers("model.layers.{}.mlp.gate_proj.weight=[S(0),S(0)]"), *layers("model.layers.{}.mlp.gate_proj=[S(0),S(2)]"),
               *layers("model.layers.{}.mlp.down_proj.weight=[R,S(1)]"))],
         hf=("refused", "as FSDP2")),
    # GPT-2 through the hf export: the planner's own plan (the batch split, every Conv1D whole)
    # loads and generates under transformers; the Megatron plan's split Conv1D weights are refused
    # (neither PyTorch's styles nor transformers' shard them).
    Case("gpt2-alpa-infer-4", "gpt2", 4, ["--mesh", "4", *INFER, "--batch", "4"], generate=True),
    # A GPT-2 decode step after 8 cached tokens, its position table split on the hidden dim: the
    # plan's embedding reads the table's rows 8.. (a slice), the model's wpe indexes the whole
    # table at positions 8..; both exports split it as the prefill plan's do (ColwiseParallel,
    # embedding_colwise). One sequence: the planner's own plan for 4 splits the batch, which a
    # model with learned positions exports only as data parallelism.
    Case("gpt2-wpe-colwise-decode-tp4", "gpt2", 4, ["--mesh", "tp=4", *INFER, "--batch", "1", *pin("transformer.wpe.weight=RS0")],
         batch=1, seq=1, past=8, generate=True),
    Case("gpt2-megatron-tp4", "gpt2", 4, ["--mesh", "tp=4", *MEGATRON, "--mode", "infer", "--batch", "4"],
         dtensor=("refused", "transformer.h.0.attn.c_attn' (linear): its weight is stored [in,out]"),
         hf=("refused", "transformer.h.0.attn.c_attn' (linear): its weight is stored [in,out]")),
]


def tool(args, cwd, want_rc=0):
    r = subprocess.run([TOOL, *args], cwd=cwd, capture_output=True, text=True)
    if want_rc is not None and r.returncode != want_rc:
        raise RuntimeError(f"autoshard {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return r


def prepare(case, scratch, synth_lock):
    """Runs the tool for a case: model, plan, exports, shards. Returns what the ranks need."""
    d = scratch / case.name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    model = scratch / ("model-" + case.model)
    with synth_lock[case.model]:
        if not model.exists():
            tool(["synth", *MODELS[case.model], "--out", str(model)], scratch)
    plan = ["plan", "--model", str(model), *case.plan, "--seq", str(case.seq), "--out", str(d / "plan.json"), "--quiet"]
    out = {"model": str(model), "dir": str(d)}
    if case.budget:  # the smallest budget the solver can meet (its own bound), then some room: weights are cut
        r = tool([*plan, "--memory-budget", "1"], d, want_rc=None)
        low = re.search(r"peak memory per device is [^(]*\((\d+) bytes\)", r.stderr)
        if not low:
            raise RuntimeError(f"no lower bound on the memory in:\n{r.stderr[-2000:]}")
        plan += ["--memory-budget", str(int(int(low.group(1)) * case.budget))]
    if case.plan_refused:
        r = tool(plan, d, want_rc=1)
        if case.plan_refused not in r.stderr:
            raise RuntimeError(f"autoshard plan refused without naming '{case.plan_refused}':\n{r.stderr[-3000:]}")
        return out
    tool(plan, d)
    if case.verify:
        r = tool(["verify", "--plan", str(d / "plan.json")], d)
        if "PASS" not in r.stdout:
            raise RuntimeError(f"autoshard verify did not pass:\n{r.stdout[-3000:]}")
    if case.policy:
        tool(["shard", str(model), "--policy", case.policy, "--tp", str(case.world), "--out", str(d / "policy")], d)
    for target, flag in (("dtensor", "dtensor"), ("hf", "hf-tp-plan")):
        r = tool(["export", "--plan", str(d / "plan.json"), "--to", flag, "--out", str(d / f"{target}.json")], d, want_rc=None)
        expect = case.expect[target]
        if expect == "exact":
            if r.returncode != 0:
                raise RuntimeError(f"export --to {flag} was refused, the case expects it exact:\n{r.stderr[-3000:]}")
            out[target] = json.loads((d / f"{target}.json").read_text())
        else:
            if r.returncode != 1:
                raise RuntimeError(f"export --to {flag} exited {r.returncode}, the case expects a refusal (exit 1)")
            if expect[1] not in r.stderr:
                raise RuntimeError(f"export --to {flag} refused without naming '{expect[1]}':\n{r.stderr[-3000:]}")
            if (d / f"{target}.json").exists():
                raise RuntimeError(f"export --to {flag} was refused but wrote {target}.json")
    if "dtensor" in out:
        tool(["shard", str(model), "--plan", str(d / "plan.json"), "--out", str(d / "shards")], d)
    return out


def logits_of(m, case, ids):
    """The logits of the case's step: the forward of `ids`, or for a decode plan (case.past) the
    step's `seq` tokens after a forward of the first `past` ones, through the key/value cache
    the model keeps."""
    if not case.past:
        return m(ids).logits
    cache = m(ids[:, :case.past], use_cache=True).cache
    return m(ids[:, case.past:], cache=cache, use_cache=True).logits


def reference(case, prep):
    """The unsharded model's logits (and greedy tokens) on the case's input, computed once."""
    model = AutoModelForCausalLM.from_pretrained(prep["model"], dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (case.batch, case.past + case.seq), generator=g)
    prompt = torch.randint(0, model.config.vocab_size, (2, 6), generator=g)
    with torch.no_grad():
        logits = logits_of(model, case, ids)
        tokens = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0) if case.generate else None
    return model, ids, logits, prompt, tokens


def run_dtensor(rank, world, case, prep, ref):
    model, ids, want, prompt, tokens = ref
    export = prep["dtensor"]
    m = copy.deepcopy(model)
    root = client.apply_dtensor_plan(m, export)
    bad = []
    with torch.no_grad():
        got = logits_of(m, case, ids)
    err = client.rel_error(got, want)
    if not err <= client.RTOL:
        bad.append(f"rank {rank}: dtensor logits differ from the unsharded model's by {err:.3g} (relative)")
    if export["loss_parallel"]:
        labels = torch.roll(ids, -1, 1)
        with torch.no_grad():
            want_loss = model(ids, labels=labels).loss
            with client.loss_parallel():
                got_loss = m(ids, labels=labels).loss
        lerr = client.rel_error(got_loss, want_loss)
        if not lerr <= client.RTOL:
            bad.append(f"rank {rank}: dtensor loss (loss_parallel) differs by {lerr:.3g}")
    if case.generate and not export["fixed_inputs"]:
        with torch.no_grad():
            out = m.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
        if not torch.equal(out, tokens):
            bad.append(f"rank {rank}: dtensor generate() {out.tolist()}, the unsharded model {tokens.tolist()}")
    fsdp = export.get("fsdp")
    bad += [f"rank {rank}: {b}" for b in
            client.check_rank_files(m, os.path.join(prep["dir"], "shards"), rank, fsdp["other_storage"] if fsdp else ())]
    if "infer" not in case.plan:  # a training plan: one training step, every gradient exact
        bad += [f"rank {rank}: {b}" for b in train_step(m, model, ids, export, root)]
    return bad


def train_step(m, model, ids, export, root):
    """One training step as the export's notes say to run it, every gradient compared with the
    unsharded model's on the whole batch: each data-parallel rank's loss on its slice of the
    batch; the parameters a module computes on a slice of the rows over tp summed over tp
    (tp_gradient_sums); FSDP2 averaging the gradients of what it shards, and the ranks (as DDP
    would) those of every other parameter over the data-parallel ranks."""
    names, tp = export["mesh_dim_names"], export["tp_axis"]
    fsdp = export["fsdp"]
    axes = export["data_parallel_axes"]
    dp = client.flat_mesh(root, axes, "ddp") if axes else None
    n, k = (dp.size(), dp.get_local_rank()) if dp else (1, 0)
    rows = ids.shape[0] // n
    if rows * n != ids.shape[0]:
        return [f"the batch of {ids.shape[0]} does not split over {n} data-parallel ranks"]
    ref = copy.deepcopy(model)
    ref(ids, labels=ids).loss.backward()
    part = ids[k * rows:(k + 1) * rows]
    with client.loss_parallel() if export["loss_parallel"] else contextlib.nullcontext():
        m(part, labels=part).loss.backward()  # a vocabulary-parallel loss: forward and backward under loss_parallel()

    def local(g):
        return g.to_local() if isinstance(g, client.DTensor) else g
    for name in export["tp_gradient_sums"]:
        client.dist.all_reduce(local(client.param_of(m, name).grad), group=root[names[tp]].get_group())
    if dp:
        managed = set() if not fsdp else {id(client.param_of(m, x)) for x in fsdp["shard_dims"]}
        for p in m.parameters():
            if id(p) not in managed:
                client.dist.all_reduce(local(p.grad), group=dp.get_group())
                local(p.grad).div_(n)
    return gradient_errors(m, ref, "train")


def gradient_errors(m, ref, what):
    """Every gradient of the sharded model `m` (a DTensor's whole) within 1e-4 of the unsharded
    model's (`ref`, after its backward on the whole batch)."""
    bad = []
    want = dict(ref.named_parameters())
    for name, p in m.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, client.DTensor) else p.grad
        err = client.rel_error(g, want[name].grad)
        if not err <= 1e-4:
            bad.append(f"{what}: {name}'s gradient differs from the unsharded model's by {err:.3g} (relative)")
    return bad


def run_hf(rank, world, case, prep, ref):
    model, ids, want, prompt, tokens = ref
    export = prep["hf"]
    bad = []
    own = dict(model.tp_plan or {})
    unnamed = sorted(set(own) - set(export["tp_plan"]))
    if unnamed:
        bad.append(f"rank {rank}: the hf export leaves the class's own plan entries {unnamed} to transformers' merge")
    plan = {**{k: "replicate" for k in unnamed}, **export["tp_plan"]}
    dp = world // export["tp_size"]
    cfg = DistributedConfig(tp_size=export["tp_size"], dp_replicate_size=dp if dp > 1 else None, tp_plan=plan)
    m = AutoModelForCausalLM.from_pretrained(prep["model"], dtype=torch.float32, distributed_config=cfg)
    with torch.no_grad():
        got = logits_of(m, case, ids)
    err = client.rel_error(got, want)
    if not err <= client.RTOL:
        bad.append(f"rank {rank}: hf logits differ from the unsharded model's by {err:.3g} (relative)")
    if case.generate:
        with torch.no_grad():
            out = m.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
        if not torch.equal(out, tokens):
            bad.append(f"rank {rank}: hf generate() {out.tolist()}, the unsharded model {tokens.tolist()}")
    if "infer" not in case.plan:  # a training plan: one step's gradients
        # With data-parallel ranks transformers wraps the model in FSDP2 (replicated over them,
        # tp the inner axis: rank r is data-parallel rank r // tp), which averages their
        # gradients: each feeds its own rows.
        ref = copy.deepcopy(model)
        ref(ids, labels=ids).loss.backward()
        rows = ids.shape[0] // dp
        part = ids[rank // export["tp_size"] * rows:][:rows]
        m(part, labels=part).loss.backward()
        bad += [f"rank {rank}: {b}" for b in gradient_errors(m, ref, "hf train")]
    return bad


# transformers' spelling of the LLaMA policy: key/value heads fewer than the ranks replicated
# (unit_colwise), the embedding and lm_head whole, as autoshard's llama policy cuts them.
LLAMA_POLICY_TP_PLAN = {
    "model.embed_tokens": "replicate", "lm_head": "replicate",
    "model.layers.*.self_attn.q_proj": "colwise", "model.layers.*.self_attn.k_proj": "unit_colwise",
    "model.layers.*.self_attn.v_proj": "unit_colwise", "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise"}


def run_policy(rank, world, case, prep, ref):
    """`shard --policy llama` rank files against the shards transformers holds under the same split."""
    model, ids, want, prompt, tokens = ref
    cfg = DistributedConfig(tp_size=world, tp_plan=LLAMA_POLICY_TP_PLAN)
    m = AutoModelForCausalLM.from_pretrained(prep["model"], dtype=torch.float32, distributed_config=cfg)
    bad = [f"rank {rank}: policy: {b}" for b in client.check_rank_files(m, os.path.join(prep["dir"], "policy"), rank)]
    with torch.no_grad():
        err = client.rel_error(m(ids).logits, want)
    if not err <= client.RTOL:
        bad.append(f"rank {rank}: transformers with the policy's split: logits differ by {err:.3g}")
    return bad


def run_all(rank, world, fns, case, prep, ref):
    bad = []
    for fn in fns:
        try:
            bad += fn(rank, world, case, prep, ref)
        except Exception:  # noqa: BLE001 (what failed is the result; the next check may still run)
            bad.append(f"rank {rank}: {fn.__name__}: " + traceback.format_exc(limit=6))
    return bad


def main():
    global TOOL
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--keep", help="keep the scratch files in this directory")
    a = ap.parse_args()
    TOOL = str(pathlib.Path(a.tool).resolve())
    cases = [c for c in CASES if not a.only or c.name in a.only]
    if a.list:
        print("\n".join(c.name for c in CASES))
        return 0
    if a.only and len(cases) != len(a.only):
        print(f"unknown case in {a.only}")
        return 2
    scratch = pathlib.Path(a.keep or tempfile.mkdtemp(prefix="autoshard-exports-"))
    scratch.mkdir(parents=True, exist_ok=True)
    import threading
    locks = {m: threading.Lock() for m in MODELS}
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:  # the tool, two at a time
        preps = {c.name: pool.submit(prepare, c, scratch, locks) for c in cases}
    # Every tool run has ended and the pool's threads are gone before a rank is forked: a fork
    # while another thread ran subprocess.run (or held a lock it takes) gave a rank SIGSEGV (-11)
    # under load, in a case that passes on its own.
    failed = 0
    for c in cases:
        t = time.monotonic()
        try:
            prep = preps[c.name].result()
            ref = reference(c, prep)
            fns = [fn for target, fn in (("dtensor", run_dtensor), ("hf", run_hf), ("policy", run_policy))
                   if target in prep or (target == "policy" and c.policy and not c.plan_refused)]
            problems = []
            if fns:  # one world of ranks runs every check of the case
                for r in client.Run(c.world)(run_all, fns, c, prep, ref):
                    problems += r
        except Exception as e:  # noqa: BLE001 (a case that cannot run fails, the others go on)
            problems = [str(e)]
        status = "ok  " if not problems else "FAIL"
        what = "plan refused" if c.plan_refused else \
            ", ".join(f"{k} {'exact' if v == 'exact' else 'refused'}" for k, v in c.expect.items())
        print(f"{status} {c.name} ({c.world} ranks; {what}; {time.monotonic() - t:.1f} s)", flush=True)
        # A rank that crashes breaks its peers' connections: its own report first.
        problems.sort(key=lambda p: "Connection closed by peer" in p or "Connection reset" in p)
        for p in problems[:12]:
            print("     " + p.replace("\n", "\n     "))
        failed += bool(problems)
    print(f"{len(cases) - failed} of {len(cases)} cases passed in {time.monotonic() - t0:.0f} s")
    if not a.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
