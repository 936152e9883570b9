#!/usr/bin/env python3
"""The real producer of the ONNX files `autoshard plan --model X.onnx` reads: PyTorch's exporter.

Per case, a tiny model of a transformers family (seeded weights from its config) is exported
by the pinned PyTorch as a user would, `torch.onnx.export(..., dynamo=True)` (the exporter's
default since PyTorch 2.9), and planned by autoshard on a 1x4 mesh. The plan must
  * recognise every transformer layer (the exporter names nodes by counters over the model and
    records module paths only in its metadata): the step's recomputation covers all of them,
    every operator is named by a module path, and every layer's vertices carry the same names
    but for the layer index;
  * see the parameters the model has, by name and count (the tied head once), and none of its
    buffers (LLaMA's rotary inv_freq) as one;
  * see the attention as it runs: each layer's fuses to one causal attention (the exporter's
    mask, built at run time from positions, evaluated; its softmax guard the identity), leaving
    no opaque vertex: GPT-2's, whose heads are split from [B,S,H] as the attention kind takes
    them, and LLaMA's, whose q and k turn in the heads' layout (rotate_half, the cos/sin tables
    of positions and the inv_freq buffer evaluated: a rotary of rope_theta's base on q and on
    k, carrying transformers' inv_freq where rope_parameters scales them, Llama-3.1's llama3)
    and whose key/value heads are repeated for the query heads (the kind's kv_heads); every
    rotary's frequencies (base^(-2i/R) of its R turned dims, or its explicit ones) are
    transformers' own inv_freq, R/2 of them (partial rotaries: tests/client/rotary_test.py);
  * the step is data parallel over the 4 devices, as an expert runs a model this small;
  * price as autoshard's own builder of the model's config.json does: in inference, at batch 2
    under a memory budget of half the unsplit peak (so that the weights must be cut), the two
    graphs have as many operators and plan the same optimal step time, each within the budget
    (the peak of a plan among those of that time depends on the solver's ties);
  * add the model's norm epsilon on every norm (GPT-2's 1e-5, LLaMA's rms_norm_eps 1e-6), as the
    builder of its config.json does;
  * run: `autoshard verify --forward-only` executes the plan on 4 Gloo ranks (the imported
    elementwise operators with their ONNX semantics) and matches the unsharded forward.
The *-decode cases export the same models as a server runs a decode step, with transformers'
DynamicCache of a few tokens (inputs past_key_values.<i>.key/.value, outputs present.<i>.*;
batch, sequence and past dynamic), plan them at one token after another past (`--kv-cache`
sizes it) and check that each layer's attention reads its cache, the report's decode line, the
builder's --kv-cache step of the same config (operators, optimal step time, rotary offsets), and
verify --forward-only; Llama-3.1's scaled rope is planned at two tokens, its one-token plan
refused (one position cannot tell its frequencies apart).
Usage: onnx_import_test.py --tool build/gcc/tools/autoshard [--only NAME ...] [--keep DIR]
"""
import json, os, pathlib, re, subprocess, sys

os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
import torch  # noqa: E402
import transformers  # noqa: E402

import cases  # noqa: E402  (the command line and the loop; this script's directory is on sys.path)

transformers.logging.set_verbosity_error()
LAYERS, BATCH, SEQ, MESH, DEVICES = 3, 8, 128, "1x4", 4

CASES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=LAYERS, n_embd=256, n_head=4, vocab_size=512, n_positions=SEQ)),
    "llama-gqa": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=512,
        vocab_size=512, max_position_embeddings=SEQ, tie_word_embeddings=False, rope_theta=500000.0)),  # LLaMA-3's base
    # Llama-3.1's rope scaling (its factors; 64 original positions so that heads of 32 have
    # pairs kept, interpolated and divided): the rotaries carry transformers' inv_freq.
    "llama3-scaled": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=512,
        vocab_size=512, max_position_embeddings=SEQ, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
}


class Logits(torch.nn.Module):
    """The model as exported for planning: token ids in, logits out, no cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def export(name, path):
    """The exported model, and its parameters' names: one set per tensor (a tied one has two)."""
    torch.manual_seed(0)
    model = CASES[name]()
    with torch.no_grad():  # every parameter its own values: the exporter merges equal initializers (zero biases)
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.eval()
    ids = torch.randint(0, 512, (2, 16))
    torch.onnx.export(Logits(model).eval(), (ids,), str(path), input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}}, dynamo=True, verbose=False)
    names = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(n)
    return model, list(names.values())


def as_builder(name, model, onnx_path, tool, work, step=("--seq", str(SEQ))):
    """Plans the export and the builder of the model's config.json alike (`step`: the sizes of
    the step, the same flags for both), and compares them."""
    config_dir = work / f"{name}-config"
    model.config.save_pretrained(str(config_dir))
    def infer(model_arg, budget=None):
        args = [tool, "plan", "--model", str(model_arg), "--batch", "2", *step, "--mesh", MESH, "--mode", "infer",
                "--quiet", "--no-svg", "--json", "--out", str(work / f"{name}-infer-{pathlib.Path(model_arg).suffix[1:]}.json")]
        r = subprocess.run(args + (["--memory-budget", str(budget)] if budget else []), capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"{' '.join(args[1:4])}: plan exited {r.returncode}: {r.stderr[-2000:]}")
        return json.loads(r.stdout)
    budget = infer(config_dir / "config.json")["plan"]["peak_memory_bytes"] // 2
    built, imported = infer(config_dir / "config.json", budget), infer(onnx_path, budget)
    same = lambda j: (j["plan"]["step_seconds"], len([o for o in j["operators"] if o["kind"] not in ("parameter", "input")]),
                      j["parameters"], j["solver"]["status"], j["plan"]["peak_memory_bytes"] <= budget)
    b, i = same(built), same(imported)
    # The rotaries turn alike: Hugging Face's pairs at the config's base (and its scaled
    # frequencies, where it has them), on as many heads; within float32's rounding.
    rot = lambda f: sorted((n["attrs"].get("heads"), n["attrs"].get("rotary_half", False), n["attrs"].get("rotary_dims", 0),
                            n["attrs"].get("rotary_offset", 0), n["attrs"].get("rotary_base", 1e4),
                            n["attrs"].get("rotary_frequencies", []))
                           for n in json.loads(f.read_text())["graph"]["nodes"] if n["kind"] == "rotary")
    near = lambda a, b: abs(a / b - 1) < 1e-5
    rb, ri = rot(work / f"{name}-infer-json.json"), rot(work / f"{name}-infer-onnx.json")
    if len(rb) != len(ri) or not all(x[:4] == y[:4] and near(x[4], y[4]) and len(x[5]) == len(y[5]) and all(map(near, x[5], y[5]))
                                     for x, y in zip(rb, ri)):
        raise AssertionError(f"rotary vertices (heads, rotate_half, turned dims, first position, base, frequencies): the builder's {rb[:2]}, "
                             f"the export's {ri[:2]}")
    # The norms add the same epsilon: the config's key (the builder's) and the export's constants.
    eps = lambda f: sorted(n.get("attrs", {}).get("epsilon", 1e-5) for n in json.loads(f.read_text())["graph"]["nodes"]
                           if n["kind"] in ("layer_norm", "rms_norm"))
    eb, ei = eps(work / f"{name}-infer-json.json"), eps(work / f"{name}-infer-onnx.json")
    if eb != ei:
        raise AssertionError(f"the norms' epsilons: the builder's {eb}, the export's {ei}")
    if abs(b[0] / i[0] - 1) > 1e-9 or b[1:] != i[1:] or b[3] != "optimal" or not b[4]:
        raise AssertionError(f"under a budget of {budget} bytes, the builder plans (step, operators, parameters, solver, "
                             f"fits) {b}, the export {i}")
    return f", as the builder prices it ({b[0] * 1e6:.1f} us at tp {built['plan']['parallelism']['tp']} under {budget} bytes)"


# A decode step exported with its cache: the model's forward after a DynamicCache of a few
# tokens, its past_key_values.<i>.key/.value inputs [B, kv_heads, P, D] (batch, sequence and
# past dynamic), its present.<i>.* outputs the cache written back. Planned after a past of
# PLANNED_PAST tokens (--kv-cache sizes the symbolic past) at one token a sequence; Llama-3.1's
# scaled rotary at two (one token's tables show each pair's angle only modulo 2 pi: its
# explicit frequencies cannot be read there, and a plan of one token is refused).
DECODE = {"gpt2-decode": ("gpt2", 1), "llama-gqa-decode": ("llama-gqa", 1), "llama3-scaled-decode": ("llama3-scaled", 2)}
EXPORTED_PAST, PLANNED_PAST = 5, 7


class Step(torch.nn.Module):
    """The model's step after a key/value cache: token ids and each layer's cached keys and values in, logits and the
    cache written back out, as a server runs a decoder."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, past):
        cache = transformers.DynamicCache(config=self.model.config)
        for i, (k, v) in enumerate(past):
            cache.update(k, v, i)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        return out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]


def export_decode(base, path):
    torch.manual_seed(0)
    model = CASES[base]()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.eval()
    c = model.config
    heads = c.num_attention_heads
    kv, hd = getattr(c, "num_key_value_heads", None) or heads, c.hidden_size // heads
    ids = torch.randint(0, 512, (2, 3))
    past = [(torch.randn(2, kv, EXPORTED_PAST, hd), torch.randn(2, kv, EXPORTED_PAST, hd)) for _ in range(LAYERS)]
    b, s, p = torch.export.Dim("batch"), torch.export.Dim("sequence"), torch.export.Dim("past")
    names = [f"past_key_values.{i}.{w}" for i in range(LAYERS) for w in ("key", "value")]
    torch.onnx.export(Step(model).eval(), (ids, past), str(path), input_names=["input_ids", *names],
                      output_names=["logits", *[n.replace("past_key_values", "present") for n in names]],
                      dynamic_shapes=({0: b, 1: s}, [({0: b, 2: p}, {0: b, 2: p}) for _ in range(LAYERS)]), dynamo=True, verbose=False)
    return model


def check_decode(name, tool, work):
    """The decode step's export: its attentions read the cache (operands 3 and 4, kv_cache inputs named as the file
    names them), its present.* outputs are not the graph's, the report says the decode step, the plan prices as the
    builder's --kv-cache step of the model's config.json does, and runs."""
    onnx_path = work / f"{name}.onnx"
    base, tokens = DECODE[name]
    model = export_decode(base, onnx_path)
    plan = work / f"{name}-plan.json"
    def plan_step(seq):
        return subprocess.run([tool, "plan", "--model", str(onnx_path), "--batch", "2", "--seq", str(seq), "--kv-cache", str(PLANNED_PAST),
                               "--mesh", MESH, "--mode", "infer", "--quiet", "--no-svg", "--json", "--out", str(plan)],
                              capture_output=True, text=True, timeout=600)
    if tokens > 1:  # one token: refused, naming why
        r = plan_step(1)
        if r.returncode != 1 or "no attention of ONNX model" not in r.stderr or "explicit frequencies" not in r.stderr:
            raise AssertionError(f"one token of {name} planned (exit {r.returncode}), not refused: {r.stderr[-2000:]}")
    step = ("--seq", str(tokens), "--kv-cache", str(PLANNED_PAST))
    r = plan_step(tokens)
    if r.returncode != 0:
        raise AssertionError(f"plan exited {r.returncode}: {r.stderr[-2000:]}")
    report = json.loads(r.stdout)
    d = report["decode"]
    if not d or (d["batch"], d["tokens"], d["past"]) != (2, tokens, PLANNED_PAST):
        raise AssertionError(f"the report's decode step is {d}, not batch 2, {tokens} tokens after {PLANNED_PAST} cached")
    doc = json.loads(plan.read_text())
    nodes = {n["name"]: n for n in doc["graph"]["nodes"]}
    kv = getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads
    width = kv * model.config.hidden_size // model.config.num_attention_heads
    attentions = sorted((n for n in nodes.values() if n["kind"] == "attention"), key=lambda n: n["inputs"][3])
    want = [[f"past_key_values.{i}.key", f"past_key_values.{i}.value"] for i in range(LAYERS)]
    if [a["inputs"][3:] for a in attentions] != want or not all(a["attrs"].get("causal") for a in attentions):
        raise AssertionError(f"the attentions read {[a['inputs'][3:] for a in attentions]}, not each layer's cache {want}")
    caches = [nodes[n] for w in want for n in w]
    if any(not c["attrs"].get("kv_cache") or c["shape"] != [2, PLANNED_PAST, width] for c in caches):
        raise AssertionError(f"the caches are {[(c['name'], c['shape'], c['attrs']) for c in caches][:2]}, not kv_cache inputs "
                             f"[2, {PLANNED_PAST}, {width}]")
    if report["opaque"] or any(n.startswith("present.") for n in nodes):
        raise AssertionError(f"opaque {report['opaque'][:4]}, present.* vertices {[n for n in nodes if n.startswith('present.')]}")
    as_built = as_builder(name, model, onnx_path, tool, work, step)
    cases.verify_forward(tool, plan)
    return f"{len(attentions)} attentions reading their layer's cache of {PLANNED_PAST}{as_built}, " \
           f"{d['tokens_per_second']:.0f} tokens/s, verified on {DEVICES} ranks"


def check(name, tool, work):
    if name in DECODE:
        return check_decode(name, tool, work)
    onnx_path = work / f"{name}.onnx"
    model, params = export(name, onnx_path)
    plan = work / f"{name}-plan.json"
    r = subprocess.run([tool, "plan", "--model", str(onnx_path), "--batch", str(BATCH), "--seq", str(SEQ), "--mesh", MESH,
                        "--quiet", "--no-svg", "--json", "--out", str(plan)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"plan exited {r.returncode}: {r.stderr[-2000:]}")
    report = json.loads(r.stdout)
    doc = json.loads(plan.read_text())
    tensors = doc["tensors"]
    par = report["plan"]["parallelism"]
    # Every layer recognised, and named alike but for the index.
    if par["recompute"] != f"none on all {LAYERS} layers":
        raise AssertionError(f"layers: the step reads {par['recompute']!r}, not all {LAYERS} layers")
    layer = re.compile(r"\.(?:h|layers)\.(\d+)\.")
    by_layer = {}
    for t in tensors:
        m = layer.search(t["name"])
        if m and t["kind"] not in ("parameter", "input"):
            by_layer.setdefault(int(m.group(1)), set()).add(layer.sub(".#.", t["name"]))
    unnamed = [t["name"] for t in tensors if t["kind"] not in ("parameter", "input") and not t["name"].startswith("model.")]
    if unnamed:  # every operator in its module (a node the exporter leaves unscoped takes its readers')
        raise AssertionError(f"operators not named by a module path: {unnamed[:6]}")
    if sorted(by_layer) != list(range(LAYERS)):
        raise AssertionError(f"operators in layers {sorted(by_layer)}, not 0..{LAYERS - 1}")
    # The exporter computes what every layer reads once, in the first layer that needs it: the
    # mask (from positions and constants alone: named outside the layers), LLaMA's rotary
    # cos/sin unsqueezed for the heads. That layer holds those few operators more; the layers'
    # own are named alike in every layer.
    for i in range(2, LAYERS):
        if by_layer[i] != by_layer[1]:
            raise AssertionError(f"layers 1 and {i} differ: {sorted(by_layer[i] ^ by_layer[1])[:6]}")
    if not by_layer[1] <= by_layer[0] or len(by_layer[0] - by_layer[1]) > 4:
        raise AssertionError(f"layer 0 against layer 1: {sorted(by_layer[0] ^ by_layer[1])[:8]}")
    # The parameters, by name (the exporter's, under the wrapper's 'model.'): one of each tensor's.
    seen = {t["name"][len("model."):] for t in tensors if t["kind"] == "parameter" and t["name"].startswith("model.")}
    for names in params:
        if len(seen & names) != 1:
            raise AssertionError(f"parameter {sorted(names)}: planned as {sorted(seen & names)}")
    # Which initializers train: the exporter marks each PARAMETER or BUFFER in its value_info's
    # metadata. A buffer the forward reads (LLaMA's rotary inv_freq) is data, not a parameter;
    # the planned count is the model's own, the tied head once.
    planned = {t["name"][len("model."):]: t["kind"] for t in tensors if t["name"].startswith("model.")}
    buffers = {n: planned[n] for n, _ in model.named_buffers() if n in planned}
    if any(k != "input" for k in buffers.values()):
        raise AssertionError(f"buffers planned as other than inputs: {buffers}")
    extra = seen - set().union(*params)
    if extra:
        raise AssertionError(f"planned as parameters, but not the model's parameters: {sorted(extra)[:4]}")
    total = sum(p.numel() for p in model.parameters())
    if report["parameters"] != total:
        raise AssertionError(f"{report['parameters']} parameters planned, the model has {total}")
    heads = model.config.num_attention_heads
    scores = [BATCH, heads, SEQ, SEQ]
    opaque = {o["name"]: o for o in report["opaque"]}
    attentions = [t for t in tensors if t["kind"] == "attention"]
    # One causal attention per layer (the plan's graph holds its attributes), with the model's
    # key/value heads; nothing opaque, nothing of the scores' size.
    graph = {n["name"]: n for n in doc["graph"]["nodes"]}
    attrs = [graph[t["name"]].get("attrs", {}) for t in attentions]
    kv = getattr(model.config, "num_key_value_heads", None) or heads
    if len(attentions) != LAYERS or not all(a.get("causal") and a.get("heads") == heads and a.get("kv_heads", heads) == kv
                                            for a in attrs):
        raise AssertionError(f"{len(attentions)} attention vertices ({attrs}), expected {LAYERS} causal ones of {heads} "
                             f"heads over {kv} key/value heads")
    if opaque or any(t["shape"] == scores for t in tensors):
        raise AssertionError(f"opaque vertices left: {sorted((o['name'], o['op_type']) for o in opaque.values())[:6]}")
    # LLaMA's rotary: q's and k's, on [B,S,H] before their heads, in Hugging Face's layout at the
    # config's base; each an operand of its layer's attention.
    rotaries = [graph[t["name"]] for t in tensors if t["kind"] == "rotary"]
    if name == "gpt2" and rotaries:
        raise AssertionError(f"GPT-2 has learned positions, but the plan holds {len(rotaries)} rotary vertices")
    if name != "gpt2":
        theta = getattr(model.config, "rope_theta", None) or model.config.rope_parameters["rope_theta"]
        fed = {i for a in attentions for i in graph[a["name"]]["inputs"][:2]}
        # transformers' own frequencies (model.model.rotary_emb.inv_freq: scaled where the config scales them).
        inv = [float(f) for f in model.model.rotary_emb.inv_freq]
        scaled = getattr(model.config, "rope_parameters", None) and model.config.rope_parameters.get("rope_type") not in (None, "default")
        freqs_ok = lambda a: (all(abs(x / y - 1) < 1e-5 for x, y in zip(a.get("rotary_frequencies", []), inv))
                              and len(a.get("rotary_frequencies", [])) == (len(inv) if scaled else 0))
        # Every rotary turns as transformers does: pair i of its R turned dims (rotary_dims, 0 the
        # whole head) at base^(-2i/R) or its explicit frequency, transformers' inv_freq[i], R/2 of
        # them: a partial rotary's R and base judged by transformers' own frequencies.
        head = model.config.hidden_size // heads
        turns = lambda a: (a.get("rotary_frequencies") or
                           [a.get("rotary_base", 10000.0) ** (-2 * i / (a.get("rotary_dims") or head))
                            for i in range((a.get("rotary_dims") or head) // 2)])
        bad = [r for r in rotaries if not (r["attrs"].get("rotary_half") and abs(r["attrs"].get("rotary_base", 10000.0) / theta - 1) < 1e-5
                                           and freqs_ok(r["attrs"]) and r["name"] in fed and len(turns(r["attrs"])) == len(inv)
                                           and all(abs(x / y - 1) < 1e-5 for x, y in zip(turns(r["attrs"]), inv)))]
        if len(rotaries) != 2 * LAYERS or bad:
            raise AssertionError(f"{len(rotaries)} rotary vertices, expected q's and k's in each of {LAYERS} layers, "
                                 f"rotate_half at base {theta} with transformers' {len(inv)} frequencies, read by the attention: {bad[:2]}")
    # Every norm adds the model's epsilon, exactly as the config says it (GPT-2's
    # layer_norm_epsilon 1e-5 in LayerNormalization's attribute, LLaMA's rms_norm_eps 1e-6 in the
    # RMSNorm's float32 constant: each read back as the decimal written).
    eps = getattr(model.config, "rms_norm_eps", None) or model.config.layer_norm_epsilon
    norms = [n for n in doc["graph"]["nodes"] if n["kind"] in ("layer_norm", "rms_norm")]
    if len(norms) != 2 * LAYERS + 1 or any(n.get("attrs", {}).get("epsilon", 1e-5) != eps for n in norms):
        raise AssertionError(f"{len(norms)} norms, expected {2 * LAYERS + 1} adding the config's {eps}: "
                             f"{[(n['name'], n.get('attrs', {}).get('epsilon', 1e-5)) for n in norms][:4]}")
    # The builder of the model's config.json, an independent construction of the same graph.
    as_built = as_builder(name, model, onnx_path, tool, work)
    if par["dp"] != DEVICES:
        raise AssertionError(f"the step is dp {par['dp']}, tp {par['tp']}: not data parallel over the {DEVICES} devices")
    # The plan runs: every operator on the 4 ranks equal to the unsharded forward.
    v = subprocess.run([tool, "verify", "--plan", str(plan), "--forward-only", "--json"], capture_output=True, text=True, timeout=600)
    if v.returncode != 0:
        raise AssertionError(f"verify exited {v.returncode}: {v.stderr[-2000:]}")
    checked = json.loads(v.stdout)
    ran = {o["name"] for o in checked["operators"]}
    kinds = {t["name"]: t["kind"] for t in tensors}
    missing = [n for n, k in kinds.items() if k not in ("parameter", "input") and n not in ran]
    if not checked["passed"] or missing:
        raise AssertionError(f"verify: passed {checked['passed']} (worst {checked.get('worst')}), operators not checked: {missing[:6]}")
    return f"{report['parameters']} parameters, {len(buffers)} buffers as inputs{as_built}, " \
           f"{len(tensors)} vertices, {len(attentions)} attention, {len(opaque)} opaque " \
           f"({sum(o['elementwise'] for o in opaque.values())} elementwise), step {report['plan']['step_seconds'] * 1e3:.3f} ms, " \
           f"dp {par['dp']}, verified on {DEVICES} ranks"


def main():
    return cases.run({**CASES, **DECODE}, check)


if __name__ == "__main__":
    sys.exit(main())
