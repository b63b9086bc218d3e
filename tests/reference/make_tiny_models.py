"""Tiny random models of every supported family, with mlx-lm goldens.

Run with the oracle venv (mlx 0.32.4, mlx-lm 0.32.2), from anywhere:

    ~/.cache/mlx-backend/oracle-venv/bin/python tests/reference/make_tiny_models.py

It rewrites tests/reference/tiny/ from scratch, deterministically: one folder
per model (config.json, model.safetensors and model.safetensors.index.json as
mlx-lm's `save_model` / `save_config` write them; the HF-style folder has only
config.json + model.safetensors), each with its goldens:

* golden.json: the prompts, the 8 greedy tokens mlx-lm decodes for each
  (prompt forward, then one token at a time through `make_prompt_cache`),
  the model's dtype / quantization, and logit statistics;
* golden.safetensors (float32): `prompt_logits.{p}` [L, V], the logits of
  every prompt position, and `decode_logits.{p}` [7, V], the logits of the
  decode steps that produced greedy tokens 2..8.

Goldens come from loading each saved folder back with
`mlx_lm.utils.load_model`, so they describe exactly what is on disk.

mlx-lm 0.32.2's qwen2_moe ignores `decoder_sparse_step` / `mlp_only_layers`
(every layer is sparse), while HF transformers' Qwen2-MoE (and this crate)
honour them; the generator patches mlx-lm's qwen2_moe to put its own dense
`MLP(hidden_size, intermediate_size)` on the layers HF makes dense.
"""

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen2_moe
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes, load_model, quantize_model, save_config, save_model

OUT = Path(__file__).resolve().parent / "tiny"
PROMPTS = [
    [1, 17, 42, 99, 3, 250, 7],
    [5, 200, 31, 64, 128, 9, 77, 18, 240, 2, 111, 56, 13],
]
N_NEW = 8


# --- qwen2_moe with HF's dense-layer rule -------------------------------------


@dataclass
class _Qwen2MoeArgs(qwen2_moe.ModelArgs):
    decoder_sparse_step: int = 1
    mlp_only_layers: List[int] = field(default_factory=list)


_qwen2_moe_model_init = qwen2_moe.Qwen2MoeModel.__init__


def _qwen2_moe_model_init_hf(self, args):
    _qwen2_moe_model_init(self, args)
    for i, layer in enumerate(self.layers):
        sparse = (
            i not in args.mlp_only_layers
            and args.num_experts > 0
            and (i + 1) % args.decoder_sparse_step == 0
        )
        if not sparse:
            layer.mlp = qwen2_moe.MLP(args.hidden_size, args.intermediate_size)


qwen2_moe.ModelArgs = _Qwen2MoeArgs
qwen2_moe.Qwen2MoeModel.__init__ = _qwen2_moe_model_init_hf


# --- the families ---------------------------------------------------------------

COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=64,
    vocab_size=256,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
)

FAMILIES = {
    # Untied lm_head, 4 heads of 16, GQA 4:2.
    "llama": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    ),
    # Tied embeddings, 2 heads of 32, GQA 2:1.
    "llama_tied": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    # Llama-3 RoPE scaling, chosen so every branch (low / medium / high
    # frequency) of the rule applies to some of the 8 frequencies.
    "llama_rope": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=256,
        ),
        tie_word_embeddings=True,
    ),
    # q/k/v biases, tied.
    "qwen2": dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    # q_norm / k_norm; head_dim 32 with 4 heads (q width 128 != hidden 64), GQA 4:1.
    "qwen3": dict(
        model_type="qwen3",
        architectures=["Qwen3ForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    # 8 experts, top-2, shared expert with sigmoid gate; decoder_sparse_step 2
    # makes layer 0 dense, layer 1 sparse.
    "qwen2_moe": dict(
        model_type="qwen2_moe",
        architectures=["Qwen2MoeForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        norm_topk_prob=False,
    ),
    # 8 experts, top-2, norm_topk_prob, tied; mlp_only_layers [1] makes
    # layer 1 dense.
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=True,
    ),
    # The two other RoPE scalings come last so the families above keep their
    # seeds. Linear: positions halved, every frequency changes.
    "llama_rope_linear": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rope_scaling={"type": "linear", "factor": 2.0},
        tie_word_embeddings=True,
    ),
    # YaRN (mlx-lm's YarnRoPE): with head_dim 16, theta 10000 and an original
    # context of 64, beta_fast 32 / beta_slow 1 give the correction range
    # [0, 3], so frequency 0 keeps its period, 1 and 2 mix the two by the
    # ramp (1/3, 2/3) and 3..7 are interpolated by the factor 4; mscale is
    # 0.1 ln 4 + 1 ~ 1.139 on q and k. max_position_embeddings is
    # factor x original, as HF's YaRN configs have it (mlx-lm ignores it).
    "llama_rope_yarn": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        max_position_embeddings=256,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        tie_word_embeddings=True,
    ),
    # Dynamic NTK (mlx-lm's DynamicNTKScalingRoPE): the base grows once a
    # sequence passes max_position_embeddings, so a context of 8 makes the
    # 13-token prompt and every later decode step use a scaled base.
    "llama_rope_dynamic": dict(
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        max_position_embeddings=8,
        rope_scaling={"type": "dynamic", "factor": 2.0},
        tie_word_embeddings=True,
    ),
}

# (folder, family, dtype of the weights, (group_size, bits) or None).
VARIANTS = [
    ("llama-f32", "llama", "float32", None),
    ("llama-q4", "llama", "float32", (32, 4)),
    ("llama-q4-bf16", "llama", "bfloat16", (64, 4)),
    ("llama_tied-f32", "llama_tied", "float32", None),
    ("llama_tied-q4", "llama_tied", "float32", (32, 4)),
    ("llama_rope-f32", "llama_rope", "float32", None),
    ("llama_rope_linear-f32", "llama_rope_linear", "float32", None),
    ("llama_rope_yarn-f32", "llama_rope_yarn", "float32", None),
    ("llama_rope_dynamic-f32", "llama_rope_dynamic", "float32", None),
    ("qwen2-f32", "qwen2", "float32", None),
    ("qwen2-bf16", "qwen2", "bfloat16", None),
    ("qwen2-q4", "qwen2", "float32", (32, 4)),
    ("qwen3-f32", "qwen3", "float32", None),
    ("qwen3-bf16", "qwen3", "bfloat16", None),
    ("qwen3-q4", "qwen3", "float32", (32, 4)),
    ("qwen2_moe-f32", "qwen2_moe", "float32", None),
    ("qwen2_moe-q4", "qwen2_moe", "float32", (32, 4)),
    ("qwen2_moe-q4-bf16", "qwen2_moe", "bfloat16", (32, 4)),
    ("qwen3_moe-f32", "qwen3_moe", "float32", None),
    # mlx-lm's qwen3_moe quant_predicate keeps the router at 8 bits / group 64.
    ("qwen3_moe-q4", "qwen3_moe", "float32", (32, 4)),
    ("qwen3_moe-q4-bf16", "qwen3_moe", "bfloat16", (32, 4)),
]
# MLX's CPU GatherMM runs only in float32, so dense bf16 MoE models cannot run
# on CPU (in mlx-lm or this crate); their bf16 coverage is the quantized
# variants above (gather_qmm) and the HF-style folder below, stored in bf16 as
# HF ships checkpoints and loaded as float32 (golden.json's "load_dtype").
HF_UNSTACKED = ("qwen3_moe-hf-bf16", "qwen3_moe")


def family_config(family):
    return {**COMMON, **FAMILIES[family]}


def init_weights(model, seed):
    """Seeded normal weights scaled so activations and logits have spread."""
    mx.random.seed(seed)
    params = []
    for name, p in sorted(tree_flatten(model.parameters())):
        noise = mx.random.normal(p.shape, dtype=mx.float32)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            value = 0.2 * noise
        elif "embed_tokens" in name:
            value = 0.2 * noise
        elif name.startswith("lm_head"):
            value = 0.3 * noise
        elif name.endswith("mlp.gate.weight"):
            # A decisive router: no near-ties between the top-k experts.
            value = 0.5 * noise
        elif "o_proj" in name or "down_proj" in name:
            # Blocks outweigh the token's own embedding in the residual, so
            # tied models do not just echo the last token.
            value = 0.2 * noise
        else:
            value = 0.1 * noise
        params.append((name, value))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())


def build(family, seed):
    config = family_config(family)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    init_weights(model, seed)
    return model, config


def write_variant(folder, family, dtype, quant, seed):
    model, config = build(family, seed)
    if dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
        config["torch_dtype"] = "bfloat16"
    else:
        config["torch_dtype"] = "float32"
    if quant is not None:
        group_size, bits = quant
        model, config = quantize_model(model, config, group_size, bits)
    path = OUT / folder
    save_model(path, model)
    save_config(config, path / "config.json")
    return path


def write_hf_unstacked(folder, family, seed):
    """HF transformers' layout: `mlp.experts.{e}.{proj}.weight`, bf16, no index."""
    model, config = build(family, seed)
    model.set_dtype(mx.bfloat16)
    config["torch_dtype"] = "bfloat16"
    weights = {}
    for name, w in tree_flatten(model.parameters()):
        if ".mlp.switch_mlp." in name:
            for e in range(w.shape[0]):
                weights[name.replace(".switch_mlp.", f".experts.{e}.")] = w[e]
        else:
            weights[name] = w
    path = OUT / folder
    path.mkdir(parents=True)
    mx.save_safetensors(
        str(path / "model.safetensors"),
        dict(sorted(weights.items())),
        metadata={"format": "pt"},
    )
    save_config(config, path / "config.json")
    return path


def goldens(path, load_dtype=None):
    model, config = load_model(path)
    if load_dtype is not None:
        model.set_dtype(getattr(mx, load_dtype))
    tensors = {}
    greedy = []
    stats = []
    for p, prompt in enumerate(PROMPTS):
        cache = make_prompt_cache(model)
        logits = model(mx.array([prompt]), cache=cache)[0].astype(mx.float32)
        tensors[f"prompt_logits.{p}"] = logits
        token = int(mx.argmax(logits[-1]).item())
        tokens = [token]
        steps = []
        for _ in range(N_NEW - 1):
            step = model(mx.array([[token]]), cache=cache)[0, -1].astype(mx.float32)
            steps.append(step)
            token = int(mx.argmax(step).item())
            tokens.append(token)
        tensors[f"decode_logits.{p}"] = mx.stack(steps)
        greedy.append(tokens)
        mx.eval(tensors)
        last = np.array(logits[-1])
        top2 = np.sort(last)[-2:]
        stats.append(
            {
                "max_abs": round(float(np.abs(np.array(logits)).max()), 4),
                "std": round(float(np.array(logits).std()), 4),
                "top2_gap_last": round(float(top2[1] - top2[0]), 4),
            }
        )
    mx.save_safetensors(str(path / "golden.safetensors"), tensors)
    weight_dtypes = sorted(
        {str(v.dtype) for _, v in tree_flatten(model.parameters()) if v.dtype != mx.uint32}
    )
    golden = {
        "generator": "tests/reference/make_tiny_models.py (mlx %s, mlx-lm %s)"
        % (mx.__version__, __import__("mlx_lm").__version__),
        "model_type": config["model_type"],
        "float_dtypes": weight_dtypes,
        "load_dtype": load_dtype,
        "quantization": config.get("quantization"),
        "prompts": PROMPTS,
        "greedy": greedy,
        "logits_file": "golden.safetensors",
        "logit_stats": stats,
    }
    text = json.dumps(golden, indent=1)
    # One line per list of numbers.
    text = re.sub(r"\[[-0-9.,\s]*\]", lambda m: re.sub(r"\s+", " ", m.group(0)), text)
    with open(path / "golden.json", "w") as f:
        f.write(text + "\n")
    return golden


def scaling_effect(path):
    """Max |logit difference| between the saved model and the same weights
    with `rope_scaling` dropped, over every prompt position; asserts the
    scaling matters (and, for YaRN, that the ramp mixes and mscale != 1)."""
    model, config = load_model(path)
    plain_config = {k: v for k, v in config.items() if k != "rope_scaling"}
    model_class, args_class = _get_classes(plain_config)
    plain = model_class(args_class.from_dict(plain_config))
    plain.update(model.parameters())
    diff = 0.0
    for prompt in PROMPTS:
        a = model(mx.array([prompt]))
        b = plain(mx.array([prompt]))
        diff = max(diff, float(mx.abs(a - b).max().item()))
    assert diff > 0.05, f"{path.name}: rope_scaling barely matters ({diff})"
    rope = model.model.layers[0].self_attn.rope
    note = ""
    if hasattr(rope, "_freqs"):
        dims = rope.dims
        base = config["rope_theta"]
        plain_freqs = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        ratio = np.array(rope._freqs / plain_freqs)
        note = f", period ratios {[round(float(r), 3) for r in ratio]}"
        factor = config["rope_scaling"]["factor"]
        assert np.any((ratio > 1.001) & (ratio < factor - 0.001)), ratio
    if hasattr(rope, "mscale"):
        note += f", mscale {rope.mscale:.4f}"
        assert rope.mscale != 1.0
    return f"rope_scaling vs none: max |dlogit| {diff:.3f}{note}"


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    seeds = {family: 1000 + i for i, family in enumerate(FAMILIES)}
    folders = []
    for folder, family, dtype, quant in VARIANTS:
        folders.append(write_variant(folder, family, dtype, quant, seeds[family]))
    folder, family = HF_UNSTACKED
    hf = write_hf_unstacked(folder, family, seeds[family])
    total = 0
    for path in folders + [hf]:
        g = goldens(path, "float32" if path == hf else None)
        size = sum(f.stat().st_size for f in path.iterdir())
        total += size
        print(
            f"{path.name:20s} {size / 1024:7.1f} KiB  greedy {g['greedy']}  "
            f"stats {g['logit_stats']}"
        )
        if "rope_scaling" in json.loads((path / "config.json").read_text()):
            print(f"{'':20s} {scaling_effect(path)}")
    print(f"total {total / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
