#!/usr/bin/env python3
"""transformers judges autoshard's executor on a real checkpoint's weights.

Per case, a tiny random model of a family `autoshard plan --model config.json` builds
(docs/graph.md's table) is made by transformers and saved by `save_pretrained` (safetensors,
float32). Its config.json is planned on a 2x2 mesh in inference (cases.plan_config), and
`autoshard verify --plan P --weights DIR --dtype f64 --outputs OUT` runs the plan on 4 Gloo
ranks with the checkpoint's weights (converted to float64) against the unsharded run, writing
the token ids it fed (input.*), the unsharded output (unsharded.*: the logits, BERT's pooler)
and the sharded one gathered whole (sharded.*). transformers then runs the same model in
float64 (model.double(), attn_implementation "eager") on those ids, and both outputs must be
its own to 1e-9 relative (to max(1, the largest |value|)).

transformers upcasts to float32 whatever the model's dtype: its RMS norms (LLaMA's
`hidden_states.to(torch.float32)`, Gemma's `x.float()`), its eager softmax (`dtype=torch.float32`)
and its rotary tables (inv_freq made `.float()`, cos and sin computed in float32). The reference
is computed under `float64_everywhere()`, where torch.float32, torch.float and Tensor.float mean
float64 (the model, its rotary frequencies included, built under it too), so transformers'
formulas run in float64 and the 1e-9 is a comparison of formulas, not of float32 rounding. The
upcasts are what stands between the two: without the patch the families that upcast (LLaMA,
Mistral, Qwen2, Gemma, Phi-3, GPT-NeoX) differ by 1e-8 to 1e-7 (float32's rounding), far above
1e-9, while GPT-2 and BERT, which do not, match to 1e-16 either way.

Each case has a control that must NOT match: the same weights in a transformers model whose
config differs where the graph must follow it (an rms_norm_eps or layer-norm epsilon 10x, the
sliding window dropped, Gemma's 1 + weight norm read as weight via an epsilon change, ...):
the judge sees the difference. The roberta case feeds its ids with --tokens (transformers
derives its positions from the ids, so none may be the padding id); llama-bf16 saves its
checkpoint in bfloat16 (widened to float64 by verify as by torch, exactly), qwen2-index cuts it
into files under model.safetensors.index.json.
What it found: OPT's and RoBERTa's learned position tables were read from row 0, while
transformers reads them past their offset (OPT's 2, RoBERTa's pad_token_id + 1): the logits
differed by 0.5 relative. The graph now reads the rows past the offset (graph/builders.hpp
position_rows; tests/unit/exec/sources_test.cpp).
bloom and falcon (with alibi) add ALiBi's biases, which transformers computes in float32
(BLOOM: slope x position; Falcon: rounded to bfloat16, then divided by sqrt(D)): under the patch
their build_alibi_tensor still runs with the real float32, as transformers runs it, and so does
the graph (graph/model.hpp alibi_bias). falcon's control drops alibi (rotary positions instead).
bloom matches to about 4e-12, not 1e-16: BLOOM's GELU writes sqrt(2/pi) as 0.79788456
(modeling_bloom.py bloom_gelu_forward), 1e-10 relative off the graph's gelu_tanh.
llama-dynamic runs dynamic NTK rope at SEQ past max_position_embeddings (8), where transformers'
forward scales the base (in float32 on its sequence-length tensor, under the patch too; the graph
rounds it so: graph/builders.hpp rope_frequencies); its control, the default rope, is what the
graph turned at before. qwen2-yarn: YaRN's blended frequencies and its attention_factor on
the rotary (op_attrs scale); its control, the same YaRN with attention_factor 1. phi3-longrope:
LongRoPE's long factors past original_max_position_embeddings; its control, the short ones.
Both are verified again, with the same plan and checkpoint, at lengths where their rope turns
otherwise than at SEQ (OTHER_LENGTHS: verify --seq or --tokens of that length re-sizes the
graph, and the rotaries' rope rule, graph/rope.hpp, recomputes their frequencies there):
llama-dynamic at 8 (max_position_embeddings: the default base) and 24 (a base grown further),
phi3-longrope at 8 (original_max_position_embeddings: the short factors), each against
transformers at that length, its control what the graph turned by before it carried the rule
(the plan sequence's frequencies): with the rule's recomputation taken out, both runs at 8
differ from transformers by what their controls differ (5e-4 and 2e-3).
Decode steps (DECODE): a step of S tokens after a key/value cache of P (`plan --kv-cache P
--seq S`), for which verify feeds random cache keys and values (input.past_key_values.<layer>.key
and .value, [B, P, kv heads x D], written to its --outputs). transformers runs the same step on
them: a DynamicCache of the model's config (Mistral's window layers keep only their last 3 keys)
made of the cache as [B, kv heads, P, D] (transformers caches keys after the rotary, as the
graph's cache holds them), position_ids P..P+S-1 and an attention mask of all P+S keys.
  * llama-decode (GQA: 2 key/value heads of 4; its attentions, and so its caches, pinned to the
    heads split S0RS1) judges the rotary offset; its control gives the step positions 0..S-1.
  * mistral-window-4-decode judges the causal mask and the window offset by P (query i sees
    keys P+i-3..P+i of the P+S = 8); its control has no window.
  * llama-dynamic-decode judges the rope rule at P+S = 10, past max_position_embeddings (8)
    where S = 4 is not; its control is the default rope, the rule at S.
  * phi3-longrope-decode: LongRoPE's long factors at P+S = 9, past original_max_position_embeddings
    (8) where S = 3 is not; its control, the short factors (the rule at S).
  * gpt_neox-decode: GPT-NeoX's partial rotary (a quarter of each head) and its own builder's
    cache; its control gives the step positions 0..S-1.
  * falcon-alibi-decode, a decode step proper (S = 1; multi-query Falcon with ALiBi, biased by
    the key's index over the cache and the step), judges that its query sees the whole cache;
    its control masks every key but the first, as a causal mask not offset by P has it. (An
    offset of ALiBi's key index is no control: BLOOM's bias is slope x index, a constant per
    row shift that the softmax does not see; Falcon's bfloat16 rounding of it would show, but
    transformers offers no way to shift it.)
  * gpt2-decode (S = 3) and opt-decode (S = 1, its attentions and caches on the heads split) judge the
    learned position table read after the cache: the graph feeds position_ids 0..S-1 into the
    table's rows from P (+ OPT's offset 2) on (graph/builders.hpp position_rows), where
    transformers looks up P..P+S-1 (GPT-2's cache_position; OPT's mask cumsum cut at the past,
    + 2); each control gives the step positions 0..S-1, the rows a graph without the past reads.
What they found: the executor's rotary kernel ignored rotary_offset (exec/kernels.hpp rotary,
and its backward), turning the step at 0..S-1: llama-decode differed from transformers by 0.027
and matched its control to 3e-16, while verify, the same kernel on both sides, passed (with
that kernel every decode case with a rotary fails, by 0.016 to 0.028; falcon's passes). Broken
by hand, each is seen: the causal mask not offset (softmax_scores(..., 0)) fails llama, mistral,
llama-dynamic and falcon (0.4 to 0.7 relative), the window's start not offset fails mistral
(0.53), the rope rule read at S fails llama-dynamic (0.0025). (Gemma, Qwen2 at S = 1 with the
heads split, Qwen2's YaRN and BLOOM match transformers after a cache too, to 3e-16 and BLOOM's
4e-12; not kept, as they judge nothing the cases above do not.) The position table sliced from
its offset, not past the cache (position_rows without the past), fails gpt2-decode by 0.45 and
opt-decode by 0.3, what their controls differ by; verify, the same graph on both sides, passes.
Usage: real_weights_test.py --tool build/release/tools/autoshard [--only NAME ...] [--keep DIR]
"""
import contextlib, json, os, subprocess, sys

os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import cases  # noqa: E402  (the command line and the loop; this script's directory is on sys.path)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()  # save_pretrained's "Writing model shards" bar
torch.set_num_threads(1)
SEQ = 16
RTOL = 1e-9
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=128,
             max_position_embeddings=64)
GQA = dict(SMALL, num_key_value_heads=2)
PHI = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)

CASES = {
    # name: (config class, its arguments, the control's changes (must not match))
    "gpt2": (transformers.GPT2Config, dict(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64),
             dict(layer_norm_epsilon=1e-4)),
    "llama": (transformers.LlamaConfig, GQA, dict(rms_norm_eps=1e-5)),
    "mistral-window-4": (transformers.MistralConfig, dict(GQA, sliding_window=4), dict(sliding_window=None)),
    "qwen2": (transformers.Qwen2Config, GQA, dict(rms_norm_eps=1e-5)),
    # head_dim 16, not Gemma's default 256; hidden 64: its embedding scale sqrt(64) = 8 in any dtype
    "gemma": (transformers.GemmaConfig, dict(GQA, head_dim=16), dict(rms_norm_eps=1e-5)),
    "phi3": (transformers.Phi3Config, dict(GQA, **PHI), dict(rms_norm_eps=1e-4)),
    "opt": (transformers.OPTConfig, dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=128, vocab_size=128,
                                         max_position_embeddings=64, word_embed_proj_dim=64), dict(activation_function="gelu")),
    "gpt_neox": (transformers.GPTNeoXConfig, SMALL, dict(rotary_pct=0.5)),
    "bert": (transformers.BertConfig, SMALL, dict(layer_norm_eps=1e-4)),
    "roberta": (transformers.RobertaConfig, dict(SMALL, max_position_embeddings=66), dict(layer_norm_eps=1e-4)),
    "bloom": (transformers.BloomConfig, dict(n_layer=2, hidden_size=64, n_head=4, vocab_size=128), dict(layer_norm_epsilon=1e-4)),
    "falcon-alibi": (transformers.FalconConfig, dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=128,
                                                     alibi=True, max_position_embeddings=64), dict(alibi=False)),
}
# Scaled rotaries (docs/graph.md): dynamic NTK at a sequence (SEQ = 16) past max_position_embeddings
# (8), where transformers' forward scales the base; the control is the default rope, what the
# graph turned at before (max_position_embeddings is the graph's input, not a control: SEQ past it).
CASES["llama-dynamic"] = (transformers.LlamaConfig, dict(GQA, max_position_embeddings=8, rope_scaling=dict(rope_type="dynamic", factor=2.0)),
                          dict(rope_scaling=None))
# YaRN as Qwen2.5 extends its context (factor 4 over original_max_position_embeddings 16: its
# frequencies blended by the ramp); the control drops its attention_factor (1.139, on cos and sin,
# so q and k) to 1: the judge sees the scale the rotary op carries.
YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16)
CASES["qwen2-yarn"] = (transformers.Qwen2Config, dict(GQA, rope_theta=1e6, rope_scaling=YARN),
                       dict(rope_scaling=dict(YARN, attention_factor=1.0)))
# LongRoPE as Phi-3-mini-128k's, at SEQ past original_max_position_embeddings (8): the long
# factors, and its attention_factor sqrt(1 + ln(64 / 8) / ln 8); the control turns by the short ones.
LONGROPE = dict(rope_type="longrope", short_factor=[1.0, 1.02, 1.05, 1.1, 1.3, 1.6, 2.0, 2.5],
                long_factor=[1.0, 1.5, 2.5, 4.0, 8.0, 16.0, 24.0, 32.0])
CASES["phi3-longrope"] = (transformers.Phi3Config, dict(GQA, **PHI, original_max_position_embeddings=8, rope_scaling=LONGROPE),
                          dict(rope_scaling=dict(LONGROPE, long_factor=LONGROPE["short_factor"])))
# The same plan (made at SEQ = 16) verified at other lengths, (length, how it is asked for:
# "seq" for --seq, "tokens" for --tokens of that length, the control's changes): verify re-sizes
# the graph, and its rotaries' rope rule turns them as transformers does at that length.
# llama-dynamic at 8 (= max_position_embeddings: the default base again) and 24 (a base grown
# further than at 16); phi3-longrope at 8 (= original_max_position_embeddings: the short factors
# again). Each control is what the graph turned by before it carried the rule, the plan
# sequence's frequencies: dynamic's base grown at 16 (transformers' float32 rounding of
# 1e4 x (2 x 16 / 8 - 1)^(16 / 14) aside), the long factors within the threshold.
DYNAMIC_BASE_AT_16 = 1e4 * 3.0 ** (16 / 14)
OTHER_LENGTHS = {
    "llama-dynamic": [(8, "seq", dict(rope_scaling=None, rope_theta=DYNAMIC_BASE_AT_16)),
                      (24, "seq", dict(rope_scaling=None, rope_theta=DYNAMIC_BASE_AT_16))],
    "phi3-longrope": [(8, "tokens", dict(rope_scaling=dict(LONGROPE, short_factor=LONGROPE["long_factor"])))],
}
# Decode steps after a key/value cache (the docstring's DECODE): name: (the case whose model and
# config control it is, P cached tokens, S the step's, the layers' attention pinned to the heads
# split HEADS_SPLIT (a name format; None: the solver's choice), the control's call: None for the
# case's config control, else a function of (B, P, S) giving the step's inputs it changes).
DECODE = {
    "llama-decode": ("llama", 5, 3, "model.layers.{}.self_attn.attention",
                     lambda B, P, S: dict(position_ids=torch.arange(S).expand(B, S))),
    "mistral-window-4-decode": ("mistral-window-4", 5, 3, None, None),
    "llama-dynamic-decode": ("llama-dynamic", 6, 4, None, None),
    "phi3-longrope-decode": ("phi3-longrope", 6, 3, None, None),
    "gpt_neox-decode": ("gpt_neox", 5, 3, None, lambda B, P, S: dict(position_ids=torch.arange(S).expand(B, S))),
    "falcon-alibi-decode": ("falcon-alibi", 5, 1, None,
                            lambda B, P, S: dict(attention_mask=(torch.arange(P + S) == 0).long().expand(B, P + S))),
    "gpt2-decode": ("gpt2", 5, 3, None, lambda B, P, S: dict(position_ids=torch.arange(S).expand(B, S))),
    "opt-decode": ("opt", 6, 1, "model.decoder.layers.{}.self_attn.attention",
                   lambda B, P, S: dict(position_ids=torch.arange(S).expand(B, S))),
}
for _name, (_base, *_) in DECODE.items():
    CASES[_name] = CASES[_base]
HEADS_SPLIT = "S0RS1"  # on the 2x2 mesh: the batch over axis 0, the heads over axis 1
TOKENS = {"roberta"}  # ids given with --tokens
# How a case's checkpoint is saved, beside float32 in one model.safetensors: in bfloat16 (verify
# widens it to float64 exactly, as torch does), and cut into files under an index.
CASES["llama-bf16"] = CASES["llama"]
CASES["qwen2-index"] = CASES["qwen2"]
SAVED = {"llama-bf16": dict(dtype=torch.bfloat16), "qwen2-index": dict(max_shard_size="100KB")}


REAL_FLOAT32 = torch.float32, torch.float, torch.Tensor.float
ALIBI_MODULES = (transformers.models.bloom.modeling_bloom, transformers.models.falcon.modeling_falcon)


def in_real_float32(fn):
    """`fn` run with torch.float32 the real one again (inside float64_everywhere)."""
    def wrapped(*args, **kwargs):
        patched = torch.float32, torch.float, torch.Tensor.float
        torch.float32, torch.float, torch.Tensor.float = REAL_FLOAT32
        try:
            return fn(*args, **kwargs)
        finally:
            torch.float32, torch.float, torch.Tensor.float = patched
    return wrapped


@contextlib.contextmanager
def float64_everywhere():
    """torch.float32, torch.float and Tensor.float as float64, for transformers' upcasts; but
    ALiBi's biases made in float32 (and Falcon's in bfloat16) as transformers makes them."""
    saved = [m.build_alibi_tensor for m in ALIBI_MODULES]
    for m, f in zip(ALIBI_MODULES, saved):
        m.build_alibi_tensor = in_real_float32(f)
    torch.float32 = torch.float = torch.float64
    torch.Tensor.float = lambda self, *a, **k: self.double(*a, **k)
    try:
        yield
    finally:
        torch.float32, torch.float, torch.Tensor.float = REAL_FLOAT32
        for m, f in zip(ALIBI_MODULES, saved):
            m.build_alibi_tensor = f


def build(config_class, kwargs):
    config = config_class(**kwargs)
    config._attn_implementation = "eager"
    if config_class in (transformers.BertConfig, transformers.RobertaConfig):
        return config, transformers.AutoModel.from_config(config, attn_implementation="eager")
    return config, transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def reference(config_class, kwargs, state, inputs, past=None):
    """The model of `kwargs` with weights `state`, in float64 throughout, on `inputs`: its output.
    `past`: a key/value cache, per layer (keys, values) [B, kv heads, P, D], which the model is
    given as a DynamicCache of its config (a sliding window's layers keep their window)."""
    with float64_everywhere():
        config, model = build(config_class, kwargs)
        model.load_state_dict(state)
        model = model.double().eval()
        if past is not None:
            inputs = dict(inputs, cache=transformers.DynamicCache(ddp_cache_data=past, config=config), use_cache=True)
        with torch.no_grad():
            out = model(**inputs)
    return out.pooler_output if hasattr(out, "pooler_output") else out.logits


def cache_of(got, config, past):
    """verify's key/value cache inputs (input.past_key_values.<layer>.key and .value, [B, P,
    kv heads x D]) as transformers' cache layers ([B, kv heads, P, D]), checked to be P long."""
    D = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers = []
    for i in range(config.num_hidden_layers):
        kv = [got.pop(f"input.past_key_values.{i}.{w}", None) for w in ("key", "value")]
        if any(t is None or t.dim() != 3 or t.shape[1] != past or t.shape[2] % D for t in kv):
            raise AssertionError(f"layer {i}'s cache inputs are {[None if t is None else list(t.shape) for t in kv]}, not two "
                                 f"[batch, {past}, kv heads x {D}]")
        layers.append(tuple(t.reshape(t.shape[0], past, -1, D).transpose(1, 2).contiguous() for t in kv))
    if any(k.startswith("input.past_key_values.") for k in got):
        raise AssertionError(f"cache inputs past layer {config.num_hidden_layers}: {sorted(got)}")
    return layers


def relative(a, b):
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


def check(name, tool, work):
    if name in DECODE:
        return check_decode(name, tool, work)
    config_class, kwargs, control = CASES[name]
    torch.manual_seed(0)
    config, model = build(config_class, kwargs)
    saved = SAVED.get(name, {})
    if "dtype" in saved:
        model = model.to(saved["dtype"])
        config.dtype = saved["dtype"]
    model.save_pretrained(str(work / name), **{k: v for k, v in saved.items() if k != "dtype"})  # plan_config's config.json beside it
    if "max_shard_size" in saved and not (work / name / "model.safetensors.index.json").exists():
        raise AssertionError("save_pretrained wrote no index")
    plan, _ = cases.plan_config(tool, config, work, name, SEQ, mesh="2x2")
    state = model.state_dict()
    ids = None
    if name in TOKENS:  # ids that are not RoBERTa's padding id (transformers counts positions past it)
        ids = torch.randint(config.pad_token_id + 1, config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    case = (config_class, kwargs, state, plan, work / name)
    what = judge(tool, work, name, case, SEQ, ids, [], control)
    # The same plan at other lengths (verify re-sizes its graph), where a rope rule turns
    # otherwise than at the plan's sequence: transformers at that length is the reference, and
    # the control is what the plan's sequence turns by.
    for seq, how, ctl in OTHER_LENGTHS.get(name, []):
        extra, ids = ["--seq", str(seq)], None
        if how == "tokens":
            ids = torch.randint(0, config.vocab_size, (2, seq), generator=torch.Generator().manual_seed(2))
            extra = []
        what += f"; at {how} {seq}: " + judge(tool, work, f"{name}-{seq}", case, seq, ids, extra, ctl)
    return what


def check_decode(name, tool, work):
    """DECODE's case `name`: its model planned as a step of S tokens after a cache of P, judged."""
    base, past, seq, attention, control_call = DECODE[name]
    config_class, kwargs, control = CASES[base]
    torch.manual_seed(0)
    config, model = build(config_class, kwargs)
    model.save_pretrained(str(work / name))
    pins = []
    if attention:
        pins = cases.heads_split_pins([attention.format(i) for i in range(config.num_hidden_layers)], HEADS_SPLIT)
    plan, _ = cases.plan_config(tool, config, work, name, seq, ["--kv-cache", str(past), *pins], mesh="2x2")
    if attention:
        cases.check_heads_split(plan, "attention", config.num_hidden_layers, HEADS_SPLIT)
        caches = {t["name"]: t["strategy"] for t in json.loads(plan.read_text())["tensors"] if t["name"].startswith("past_key_values.")}
        if len(caches) != 2 * config.num_hidden_layers or set(caches.values()) != {"->" + HEADS_SPLIT}:
            raise AssertionError(f"the cache inputs are {caches}, not on the heads split ({HEADS_SPLIT})")
    case = (config_class, kwargs, model.state_dict(), plan, work / name)
    return (f"after a cache of {past}" + (f", attention {HEADS_SPLIT}" if attention else "") + ": " +
            judge(tool, work, name, case, seq, None, [], {} if control_call else control, (past, control_call)))


def judge(tool, work, tag, case, seq, ids, extra, control, decode=None):
    """`verify --plan P --weights DIR` of `case` (config class, its arguments, the weights' state,
    P, DIR) on 4 ranks (the ids `ids` given with --tokens, else verify's own; `extra`: more
    flags, --seq) against transformers' float64 run at `seq` positions, to RTOL, and the
    `control`'s changes seen to differ: what it proved. Files are named by `tag`. `decode`:
    (P, the control's call or None), a step after a key/value cache of P tokens (the plan's
    --kv-cache): transformers gets verify's cache, positions P..P+seq-1 and a mask of every
    key; the control's call, a function of (B, P, S), changes those inputs of the control's run."""
    config_class, kwargs, state, plan, weights = case
    out = work / f"{tag}-outputs.safetensors"
    cmd = [tool, "verify", "--plan", str(plan), "--weights", str(weights), "--dtype", "f64", "--outputs", str(out), "--json", *extra]
    if ids is not None:
        (work / f"{tag}-tokens.json").write_text(json.dumps(ids.tolist()))
        cmd += ["--tokens", str(work / f"{tag}-tokens.json")]
    v = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if v.returncode != 0 or not json.loads(v.stdout)["passed"]:
        raise AssertionError(f"verify exited {v.returncode}: {v.stderr[-2000:]}")
    got = load_file(str(out))
    past = None
    if decode is not None:
        past = cache_of(got, build(config_class, kwargs)[0], decode[0])
    elif any(k.startswith("input.past_key_values.") for k in got):
        raise AssertionError(f"a step without a cache fed {sorted(got)}")
    outputs = [k[len("unsharded."):] for k in got if k.startswith("unsharded.")]
    if len(outputs) != 1:
        raise AssertionError(f"expected one output, the file has {sorted(got)}")
    inputs = {"input_ids": got["input.input_ids"]}
    if ids is not None and not torch.equal(inputs["input_ids"], ids):
        raise AssertionError("the ids run are not the --tokens given")
    if inputs["input_ids"].shape[1] != seq:
        raise AssertionError(f"verify ran {list(inputs['input_ids'].shape)} ids, not a sequence of {seq}")
    if "input.token_type_ids" in got:
        inputs["token_type_ids"] = got["input.token_type_ids"]
    if "input.position_ids" in got and not torch.equal(got["input.position_ids"][0], torch.arange(seq)):
        raise AssertionError(f"position_ids {got['input.position_ids'].tolist()} are not 0..{seq - 1}, what transformers feeds")
    control_inputs = inputs
    if decode is not None:  # the step's tokens after the P cached: their positions, every key in the mask
        P, call = decode
        B = inputs["input_ids"].shape[0]
        inputs = dict(inputs, position_ids=torch.arange(P, P + seq).expand(B, seq), attention_mask=torch.ones(B, P + seq, dtype=torch.long))
        control_inputs = dict(inputs, **call(B, P, seq)) if call else inputs
    want = reference(config_class, kwargs, state, inputs, past)
    unsharded, sharded = got["unsharded." + outputs[0]], got["sharded." + outputs[0]]
    if unsharded.dtype != torch.float64 or unsharded.shape != want.shape:
        raise AssertionError(f"{outputs[0]} is {unsharded.dtype} {list(unsharded.shape)}, transformers' {want.dtype} {list(want.shape)}")
    d_ref, d_sh = relative(unsharded, want), relative(sharded, want)
    if d_ref > RTOL or d_sh > RTOL:
        raise AssertionError(f"{outputs[0]} differs from transformers' by {d_ref:.3g} (unsharded) and {d_sh:.3g} (sharded), "
                             f"relative; tolerance {RTOL}")
    d_ctl = relative(unsharded, reference(config_class, dict(kwargs, **control), state, control_inputs, past))
    said = control if decode is None or not decode[1] else {k: v[0].tolist() for k, v in control_inputs.items() if k in call(1, P, seq)}
    if d_ctl <= 1e3 * RTOL:
        raise AssertionError(f"the control {said} matches too ({d_ctl:.3g}): the comparison cannot see it")
    return (f"{outputs[0]} {list(want.shape)} within {max(d_ref, d_sh):.2g} of transformers' float64 (2x2, 4 ranks); "
            f"the control {said} differs by {d_ctl:.2g}")


def main():
    return cases.run(CASES, check, __doc__)


if __name__ == "__main__":
    sys.exit(main())
