#!/usr/bin/env python3
"""Megatron-LM judges `autoshard export --to megatron`: its arguments, built into megatron.core's
GPTModel as Megatron-LM builds it, compute the model the plan describes.

Per case, a small model (a built-in, or a Hugging Face config.json) is written as a checkpoint
by `autoshard synth`, planned by `autoshard plan --algo megatron` (training, f32, tensor
parallel on the mesh's last axis) and exported with `autoshard export --to megatron`. The
exported arguments are then read as Megatron-LM reads them, on the tensor-parallel ranks (Gloo,
CPU, forked from this process):
  * parsed with Megatron-LM's own definitions of those flags (megatron/training/arguments.py:
    type, default, dest); a flag the harness does not know fails the case, so that a new flag
    is never silently ignored;
  * completed as validate_args completes them (--ffn-hidden-size, --kv-channels defaults, the
    bias switches, the parameters' dtype) and turned into megatron.core's TransformerConfig as
    core_transformer_config_from_args does (every argument whose name is a field, then its
    explicit ones: layernorm_epsilon (--norm-epsilon), activation_func and gated_linear_unit for --swiglu,
    bias_activation_fusion, num_query_groups only with --group-query-attention);
  * built as gpt_builders.py's gpt_builder builds the model: GPTModel with the local layer spec
    (get_gpt_layer_local_spec(normalization=...)), the vocabulary padded as Megatron-LM pads it
    (a multiple of 128 x tp), share_embeddings_and_output_weights = not
    --untie-embeddings-and-output-weights, the position embedding, rotary percent and base;
  * loaded with the checkpoint's weights in Megatron's names and layouts (query/key/value
    interleaved per query group into linear_qkv, gate|up per rank into linear_fc1, each
    tensor-parallel tensor split as its module splits it), every parameter of the model
    filled exactly once;
  * run forward on the same tokens (positions 0..S-1 and the causal mask, as Megatron-LM's
    get_batch makes them): the vocab-parallel logits gathered over the ranks must equal
    transformers' forward of the same checkpoint within 1e-5 x max |logits| (f32).
A case with `refused` (Mistral's sliding window shorter than the sequence, which the arguments
do not say: megatron.core's local attention makes a window's mask on CUDA only) must exit 1
naming it instead.
Controls show the harness sees what the flags say: per case, an exported flag dropped
(--rotary-base, --kv-channels, --untie-embeddings-and-output-weights, --add-qkv-bias,
--ffn-hidden-size, --norm-epsilon) or one added (--no-bias-gelu-fusion: the exact GELU for GPT-2's tanh form)
must make Megatron build another model (other shapes) or compute logits at least 5e-5 x
max |logits| away (5 x the tolerance; the cases match within 1e-6).

What differs from a GPU run, each computing the same function: the local layer spec instead of
Megatron-LM's default --transformer-impl transformer_engine (TransformerEngine needs CUDA);
use_cpu_initialization; gradient_accumulation_fusion and apply_rope_fusion off (CUDA
extensions: the first only in the backward, the second the same rotation unfused);
--no-persist-layer-norm (Apex's persistent LayerNorm kernel; the local spec's torch norm
refuses the switch); Megatron's inference RNG tracker
(initialize_rng_tracker(inference_rng_tracker=True), Megatron's own switch: dropout's RNG forks
are no-ops, and the model runs in eval mode); the causal mask passed explicitly (megatron.core's
default one is made with device="cuda"); and one monkeypatch: torch.cuda.current_device returns
the CPU device (megatron.core places the rotary frequencies, and a few buffers, with
torch.cuda.current_device()). What the arguments say of the step (micro and global batch,
recomputation, the distributed optimizer, overlaps) is parsed, not run; --sequence-parallel
cannot run here (megatron.core's torch norms refuse it without Apex or TransformerEngine), and
the cases' plans do not ask for it.
Usage: megatron_test.py --tool build/release/tools/autoshard [--only NAME ...]
"""
import argparse, dataclasses, json, os, pathlib, subprocess, sys

os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
import warnings  # noqa: E402

warnings.filterwarnings("ignore")  # megatron.core warns on import that TransformerEngine and Apex are absent
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from megatron.core import parallel_state  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: E402
from megatron.core.tensor_parallel.random import initialize_rng_tracker  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import cases  # noqa: E402
import client  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
RTOL = 1e-5
SEQ, BATCH = 16, 4

# A LLaMA of Hugging Face's config.json: LLaMA-3's rope_theta, grouped-query attention, heads of
# 16 on a hidden of 64 / 8 (head_dim, as Gemma-7B's 256 on 3072 / 16), untied.
LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 16,
                "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 64, "rope_theta": 500000.0,
                "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float32"}

# The flags the case's line names (what the arguments say of the model beyond its sizes).
MODEL_FLAGS = ("--ffn-hidden-size", "--rotary-base", "--kv-channels", "--num-query-groups", "--swiglu", "--normalization", "--norm-epsilon",
               "--no-bias-gelu-fusion", "--add-qkv-bias",
               "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--max-position-embeddings")

# Qwen2's: query/key/value biases only (--add-qkv-bias), tied embeddings, rope_theta 1e6, rms_norm_eps 1e-6 (--norm-epsilon).
QWEN2_CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                "vocab_size": 256, "max_position_embeddings": 64, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
                "tie_word_embeddings": True, "torch_dtype": "float32"}

# Phi-3's: one qkv_proj (q|k|v) and one gate_up_proj (gate|up), an MLP of 3 x hidden (not
# Megatron-LM's --swiglu default int(8 x hidden / 3 / 64) x 64 = 128).
PHI3_CONFIG = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
               "intermediate_size": 192, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
               "vocab_size": 256, "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
               "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
               "torch_dtype": "float32"}

# Mistral's sliding window: a window of 4 at the sequence of 16 is refused (megatron.core's
# window_size is not written: its local attention makes the window's mask on CUDA only); one of
# 16, the whole sequence, masks nothing more and exports as LLaMA's causal attention.
MISTRAL_CONFIG = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
                  "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                  "vocab_size": 256, "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-05,
                  "sliding_window": 16, "tie_word_embeddings": False, "torch_dtype": "float32"}

CASES = {
    # The built-in LLaMA: RMSNorm, SwiGLU, rotary at 10000, untied, no biases.
    "llama-7b": dict(model=["--model", "llama-7b", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "128",
                            "--vocab", "256"], tp=2, controls=[("drop", "--untie-embeddings-and-output-weights")]),
    # LLAMA_CONFIG on 4 ranks: --rotary-base 500000, --group-query-attention, --kv-channels 16.
    "llama-config": dict(config=LLAMA_CONFIG, tp=4, controls=[("drop", "--rotary-base"), ("drop", "--kv-channels")]),
    # With Qwen2's published rms_norm_eps, 1e-6: --norm-epsilon 1e-06 (Megatron-LM's default is 1e-5).
    "qwen2-config": dict(config=QWEN2_CONFIG, tp=2, controls=[("drop", "--add-qkv-bias"), ("drop", "--norm-epsilon")]),
    "phi3-config": dict(config=PHI3_CONFIG, tp=2, controls=[("drop", "--ffn-hidden-size")]),
    "mistral-window-16": dict(config=MISTRAL_CONFIG, tp=2, controls=[("drop", "--untie-embeddings-and-output-weights")]),
    "mistral-window-4-refused": dict(config=dict(MISTRAL_CONFIG, sliding_window=4), tp=2, controls=[],
                                     refused="'model.layers.0.self_attn.attention' (attention) sees a sliding window of 4 keys, "
                                             "shorter than the sequence of 16"),
    # The built-in GPT-2: LayerNorm, GELU's tanh form (Megatron's bias_gelu_fusion), biases,
    # learned positions (a table of 1024), tied embeddings.
    "gpt2": dict(model=["--model", "gpt2", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256"], tp=2,
                 controls=[("add", "--no-bias-gelu-fusion")]),
}


def megatron_parser():
    """The flags the export writes, as Megatron-LM's arguments.py defines them (type, default,
    dest); another flag is unknown to the harness and fails the case."""
    p = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    a = p.add_argument
    # _add_network_size_args
    a("--num-layers", type=int, default=None)
    a("--hidden-size", type=int, default=None)
    a("--ffn-hidden-size", type=int, default=None)
    a("--num-attention-heads", type=int, default=None)
    a("--kv-channels", type=int, default=None)
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int, default=1)
    a("--max-position-embeddings", type=int, default=None)
    a("--position-embedding-type", type=str, default="learned_absolute",
      choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    a("--rotary-base", type=int, default=10000)
    a("--rotary-percent", type=float, default=1.0)
    a("--rotary-interleaved", action="store_true")
    a("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    a("--norm-epsilon", type=float, default=1e-5)
    a("--swiglu", action="store_true")
    a("--untie-embeddings-and-output-weights", action="store_true")
    # _add_regularization_args
    a("--attention-dropout", type=float, default=0.1)
    a("--hidden-dropout", type=float, default=0.1)
    # _add_training_args
    a("--micro-batch-size", type=int, default=None)
    a("--global-batch-size", type=int, default=None)
    a("--recompute-granularity", type=str, default=None, choices=["full", "selective"])
    a("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    a("--recompute-num-layers", type=int, default=None)
    a("--use-flash-attn", action="store_true")  # the legacy models' switch: no TransformerConfig field
    a("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    a("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion")
    a("--add-qkv-bias", action="store_true", dest="add_qkv_bias")
    a("--optimizer", type=str, default="adam", choices=["adam", "sgd", "muon", "dist_muon"])
    a("--sequence-parallel", action="store_true")
    # _add_mixed_precision_args
    a("--fp16", action="store_true")
    a("--bf16", action="store_true")
    # _add_distributed_args
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--decoder-first-pipeline-num-layers", type=int, default=None)
    a("--decoder-last-pipeline-num-layers", type=int, default=None)
    a("--use-distributed-optimizer", action="store_true")
    a("--overlap-grad-reduce", action="store_true")
    a("--overlap-param-gather", action="store_true")
    # _add_data_args
    a("--seq-length", type=int, default=None)
    return p


# Megatron-LM's defaults of the arguments the export never writes whose names are
# TransformerConfig fields or that core_transformer_config_from_args reads (arguments.py).
UNWRITTEN = dict(no_persist_layer_norm=False, apply_layernorm_1p=False, overlap_p2p_comm=False, num_experts=None,
                 fp8_param_gather=False, bias_swiglu_fusion=True, squared_relu=False,
                 quick_geglu=False, init_method_xavier_uniform=False, masked_softmax_fusion=True,
                 bias_dropout_fusion=True, apply_rope_fusion=True, gradient_accumulation_fusion=True,
                 apply_query_key_layer_scaling=False, attention_softmax_in_fp32=False, fp32_residual_connection=False,
                 apply_residual_connection_post_layernorm=False, qk_layernorm=False, init_method_std=0.02,
                 use_cpu_initialization=None, context_parallel_size=1, make_vocab_size_divisible_by=128,
                 use_rope_scaling=False, softmax_type="vanilla", window_size=None)
# The harness's own settings on CPU (the module docstring says why each computes the same function).
ON_CPU = dict(use_cpu_initialization=True, gradient_accumulation_fusion=False, apply_rope_fusion=False,
              no_persist_layer_norm=True)


def megatron_args(lines):
    """The exported argument lines as Megatron-LM's args: parsed, completed as validate_args
    completes them. Raises on a flag the harness does not know."""
    words = " ".join(line.rstrip("\\").strip() for line in lines.splitlines()).split()
    args, unknown = megatron_parser().parse_known_args(words)
    if unknown:
        raise AssertionError(f"the export writes flags the harness does not know: {unknown}")
    for k, v in UNWRITTEN.items():
        setattr(args, k, v)
    for k, v in ON_CPU.items():
        setattr(args, k, v)
    # validate_args, the parts these arguments reach.
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = int((4 * args.hidden_size * 2 / 3) / 64) * 64 if args.swiglu else 4 * args.hidden_size
    if args.kv_channels is None:
        assert args.hidden_size % args.num_attention_heads == 0
        args.kv_channels = args.hidden_size // args.num_attention_heads
    args.params_dtype = torch.half if args.fp16 else torch.bfloat16 if args.bf16 else torch.float
    if args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False
    if not args.add_bias_linear:
        args.bias_gelu_fusion = False
    if args.add_bias_linear:
        args.add_qkv_bias = True
    if args.position_embedding_type != "rope":
        args.apply_rope_fusion = False
    return args


def core_transformer_config_from_args(args):
    """megatron/training/arguments.py's core_transformer_config_from_args, for these arguments."""
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(TransformerConfig) if hasattr(args, f.name)}
    kw["persist_layer_norm"] = not args.no_persist_layer_norm
    kw["layernorm_zero_centered_gamma"] = args.apply_layernorm_1p
    kw["layernorm_epsilon"] = args.norm_epsilon
    kw["deallocate_pipeline_outputs"] = True
    kw["pipeline_dtype"] = args.params_dtype
    kw["batch_p2p_comm"] = not args.overlap_p2p_comm
    kw["num_moe_experts"] = args.num_experts
    kw["rotary_interleaved"] = args.rotary_interleaved
    kw["num_layers_in_first_pipeline_stage"] = args.decoder_first_pipeline_num_layers
    kw["num_layers_in_last_pipeline_stage"] = args.decoder_last_pipeline_num_layers
    kw["fp8_param"] = args.fp8_param_gather
    if args.swiglu:
        kw["activation_func"] = F.silu
        kw["gated_linear_unit"] = True
        kw["bias_activation_fusion"] = args.bias_swiglu_fusion
    else:
        kw["bias_activation_fusion"] = args.bias_gelu_fusion
    kw["num_query_groups"] = args.num_query_groups if args.group_query_attention else None
    return TransformerConfig(**kw)


def padded_vocab(vocab, args):
    """megatron/training/tokenizer's _vocab_size_with_padding."""
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return (vocab + multiple - 1) // multiple * multiple


def megatron_weights(hf, cfg, args, vocab):
    """The checkpoint `hf` (Hugging Face names) in Megatron's names, whole: (tensor, how it
    splits over the tensor-parallel ranks: None whole, ("rows"|"cols"), or "fc1" for SwiGLU's
    gate|up, split per rank)."""
    out = {}
    V = padded_vocab(vocab, args)

    def pad(t):
        return torch.cat([t, t.new_zeros(V - t.shape[0], *t.shape[1:])]) if t.shape[0] < V else t

    llama = "model.embed_tokens.weight" in hf
    H, L = cfg["hidden"], cfg["layers"]
    heads, groups, D = cfg["heads"], cfg["groups"], cfg["head"]
    per = heads // groups

    def qkv(q, k, v):  # [heads*D | groups*D | groups*D] rows -> per group: its query heads, its key, its value
        q = q.reshape(groups, per * D, *q.shape[1:])
        k = k.reshape(groups, D, *k.shape[1:])
        v = v.reshape(groups, D, *v.shape[1:])
        return torch.cat([q, k, v], dim=1).reshape(groups * (per + 2) * D, *q.shape[2:])

    if llama:
        out["embedding.word_embeddings.weight"] = (pad(hf.pop("model.embed_tokens.weight")), "rows")
        for i in range(L):
            s, m = f"model.layers.{i}.", f"decoder.layers.{i}."
            out[m + "input_layernorm.weight"] = (hf.pop(s + "input_layernorm.weight"), None)
            if s + "self_attn.qkv_proj.weight" in hf:  # Phi-3's fused q|k|v and gate|up
                q_k_v = hf.pop(s + "self_attn.qkv_proj.weight").split([heads * D, groups * D, groups * D])
                gate_up = hf.pop(s + "mlp.gate_up_proj.weight").chunk(2)
                hf.update({s + f"self_attn.{x}_proj.weight": t for x, t in zip("qkv", q_k_v)})
                hf.update({s + "mlp.gate_proj.weight": gate_up[0], s + "mlp.up_proj.weight": gate_up[1]})
            out[m + "self_attention.linear_qkv.weight"] = (qkv(*(hf.pop(s + f"self_attn.{x}_proj.weight") for x in "qkv")), "rows")
            if s + "self_attn.q_proj.bias" in hf:  # Qwen2's
                out[m + "self_attention.linear_qkv.bias"] = (qkv(*(hf.pop(s + f"self_attn.{x}_proj.bias") for x in "qkv")), "rows")
            out[m + "self_attention.linear_proj.weight"] = (hf.pop(s + "self_attn.o_proj.weight"), "cols")
            out[m + "pre_mlp_layernorm.weight"] = (hf.pop(s + "post_attention_layernorm.weight"), None)
            out[m + "mlp.linear_fc1.weight"] = ((hf.pop(s + "mlp.gate_proj.weight"), hf.pop(s + "mlp.up_proj.weight")), "fc1")
            out[m + "mlp.linear_fc2.weight"] = (hf.pop(s + "mlp.down_proj.weight"), "cols")
        out["decoder.final_layernorm.weight"] = (hf.pop("model.norm.weight"), None)
        if "lm_head.weight" in hf:
            out["output_layer.weight"] = (pad(hf.pop("lm_head.weight")), "rows")
    else:  # GPT-2, as synth writes it (no "transformer." prefix); Conv1D weights are [in, out]
        out["embedding.word_embeddings.weight"] = (pad(hf.pop("wte.weight")), "rows")
        out["embedding.position_embeddings.weight"] = (hf.pop("wpe.weight"), None)
        for i in range(L):
            s, m = f"h.{i}.", f"decoder.layers.{i}."
            for x in ("weight", "bias"):
                out[m + f"input_layernorm.{x}"] = (hf.pop(s + f"ln_1.{x}"), None)
                out[m + f"pre_mlp_layernorm.{x}"] = (hf.pop(s + f"ln_2.{x}"), None)
            w, b = hf.pop(s + "attn.c_attn.weight").t(), hf.pop(s + "attn.c_attn.bias")
            out[m + "self_attention.linear_qkv.weight"] = (qkv(*w.split(H)), "rows")
            out[m + "self_attention.linear_qkv.bias"] = (qkv(*b.split(H)), "rows")
            out[m + "self_attention.linear_proj.weight"] = (hf.pop(s + "attn.c_proj.weight").t(), "cols")
            out[m + "self_attention.linear_proj.bias"] = (hf.pop(s + "attn.c_proj.bias"), None)
            out[m + "mlp.linear_fc1.weight"] = (hf.pop(s + "mlp.c_fc.weight").t(), "rows")
            out[m + "mlp.linear_fc1.bias"] = (hf.pop(s + "mlp.c_fc.bias"), "rows")
            out[m + "mlp.linear_fc2.weight"] = (hf.pop(s + "mlp.c_proj.weight").t(), "cols")
            out[m + "mlp.linear_fc2.bias"] = (hf.pop(s + "mlp.c_proj.bias"), None)
        for x in ("weight", "bias"):
            out[f"decoder.final_layernorm.{x}"] = (hf.pop(f"ln_f.{x}"), None)
    if hf:
        raise AssertionError(f"checkpoint tensors the harness does not map: {sorted(hf)[:6]}")
    return out


def local_shard(t, how, rank, tp):
    if how is None:
        return t
    if how == "fc1":  # Megatron's SwiGLU chunks each rank's output in two: its gate rows, then its up rows
        gate, up = t
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    return t.chunk(tp, dim=0 if how == "rows" else 1)[rank]


def megatron_logits(rank, world, lines, ckpt, cfg, ids):
    """Rank `rank`'s part of the case: the gathered logits of GPTModel built from `lines`."""
    args = megatron_args(lines)
    tp = args.tensor_model_parallel_size
    if tp != world or args.pipeline_model_parallel_size != 1:
        raise AssertionError(f"tp {tp} x pp {args.pipeline_model_parallel_size}: the case runs {world} tensor-parallel ranks")
    config = core_transformer_config_from_args(args)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization=args.normalization),
                     vocab_size=padded_vocab(cfg["vocab"], args), max_sequence_length=args.max_position_embeddings,
                     pre_process=True, post_process=True, parallel_output=True,
                     share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                     position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                     rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling).eval()
    weights = megatron_weights(load_file(str(ckpt / "model.safetensors")), cfg, args, cfg["vocab"])
    params = dict(model.named_parameters())
    bad = [f"{n}: Megatron's parameter, not in the checkpoint" for n in params if n not in weights]
    for n, (t, how) in weights.items():
        if n not in params:
            bad.append(f"{n}: in the checkpoint, not a parameter of Megatron's model")
            continue
        local = local_shard(t, how, rank, tp)
        if tuple(local.shape) != tuple(params[n].shape):
            bad.append(f"{n}: Megatron's rank {rank} holds {tuple(params[n].shape)}, the checkpoint's shard is {tuple(local.shape)}")
            continue
        with torch.no_grad():
            params[n].copy_(local)
    if bad:
        raise AssertionError("Megatron builds another model: " + "; ".join(bad[:6]))
    S = ids.shape[1]
    positions = torch.arange(S).unsqueeze(0).expand_as(ids)
    mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), diagonal=1)  # True: masked (get_ltor_masks_and_position_ids)
    with torch.no_grad():
        local = model(ids, positions, attention_mask=mask)  # [b, s, vocab / tp]
    parts = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(parts, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)[..., :cfg["vocab"]]


def mutated(lines, control):
    """The arguments with control's flag dropped ("drop", FLAG) or added ("add", FLAG)."""
    how, flag = control
    if how == "add":
        return lines.rstrip("\n") + " \\\n" + flag + "\n"
    return "\n".join(line for line in lines.splitlines() if line.split()[:1] != [flag])


def rank_main(rank, world, lines, ckpt, cfg, ids, want, controls):
    torch.cuda.current_device = lambda: torch.device("cpu")  # the one monkeypatch (module docstring)
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    got = megatron_logits(rank, world, lines, ckpt, cfg, ids)
    failures = []
    err = client.rel_error(got, want)
    if err > RTOL:
        failures.append(f"rank {rank}: Megatron's logits differ from transformers' by {err:.3g} x max |logits| (> {RTOL})")
    elif rank == 0:
        print(f"     rank 0: Megatron's logits within {err:.2g} x max |logits| of transformers'", flush=True)
    for control in controls:
        how, flag = control
        if (flag in lines.split()) != (how == "drop"):
            failures.append(f"control {how} {flag}: the export {'does not write' if how == 'drop' else 'writes'} it")
            continue
        try:
            other = megatron_logits(rank, world, mutated(lines, control), ckpt, cfg, ids)
            off = client.rel_error(other, want)
            if off < 5 * RTOL:
                failures.append(f"control {how} {flag}: Megatron's logits within {off:.2g} x max |logits| of transformers' "
                                "still: the case does not test it")
            elif rank == 0:
                print(f"     rank 0: {how} {flag}: Megatron's logits {off:.2g} x max |logits| away", flush=True)
        except Exception:  # noqa: BLE001  (another model, of other shapes: the flag matters)
            pass
    return failures


def run_tool(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"autoshard {args[0]} exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def check(name, tool, work):
    case = CASES[name]
    d = work / name
    d.mkdir()
    ckpt = d / "ckpt"
    if "config" in case:
        template = d / "template"
        template.mkdir()
        (template / "config.json").write_text(json.dumps(case["config"]))
        model = ["--model", str(template / "config.json")]
    else:
        model = case["model"]
    run_tool(tool, "synth", *model, "--out", str(ckpt))
    sizes = ["--seq", str(SEQ), "--batch", str(BATCH)]
    plan = d / "plan.json"
    run_tool(tool, "plan", "--model", str(ckpt), *sizes, "--mesh", f"tp={case['tp']}", "--algo", "megatron", "--mode", "train",
             "--dtype", "f32", "--quiet", "--no-svg", "--out", str(plan))
    if "refused" in case:
        r = subprocess.run([tool, "export", "--plan", str(plan), "--to", "megatron"], capture_output=True, text=True, timeout=300)
        if r.returncode != 1 or case["refused"] not in r.stderr:
            raise AssertionError(f"export exited {r.returncode}, not refusing with {case['refused']!r}: {r.stderr[-2000:]}{r.stdout[-2000:]}")
        return f"export --to megatron refuses it: {case['refused']}"
    lines = run_tool(tool, "export", "--plan", str(plan), "--to", "megatron")
    hf_config = json.loads((ckpt / "config.json").read_text())
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    c = reference.config
    heads = c.num_attention_heads
    cfg = dict(hidden=c.hidden_size, layers=c.num_hidden_layers, heads=heads, vocab=c.vocab_size,
               groups=getattr(c, "num_key_value_heads", None) or heads,
               head=getattr(c, "head_dim", None) or c.hidden_size // heads)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, c.vocab_size, (BATCH, SEQ), generator=g)
    with torch.no_grad():
        want = reference(ids).logits
    results = client.Run(case["tp"])(rank_main, lines, ckpt, cfg, ids, want, case["controls"])
    failures = [f for r in results for f in r]
    if failures:
        raise AssertionError("\n".join(failures) + "\nthe exported arguments:\n" + lines)
    words = lines.replace("\\", " ").split()
    flags = " ".join(f"{w} {words[i + 1]}" if w in ("--ffn-hidden-size", "--rotary-base", "--kv-channels", "--num-query-groups", "--normalization",
                                                     "--norm-epsilon", "--max-position-embeddings") else w
                     for i, w in enumerate(words) if w in MODEL_FLAGS)
    controls = ", ".join(f"{how} {flag}" for how, flag in case["controls"]) or "none"
    return (f"Megatron's GPTModel on {case['tp']} ranks computes transformers' logits ({hf_config['model_type']}: {flags}); "
            f"each control computes others ({controls})")


def main():
    return cases.run(CASES, check)


if __name__ == "__main__":
    sys.exit(main())
