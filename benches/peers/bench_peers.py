#!/usr/bin/env python3
"""Peer benchmark: SGLang bench_one_batch-style workloads through mlx-lm or llama.cpp.

Runs the same GGUF (default: SmolLM2-135M-Instruct Q4_1) through one peer engine
and prints ONE JSON object on stdout; everything else goes to stderr (C-level
stdout of the engines included: fd 1 is redirected to fd 2 while running).

  mlx_lm     run with "$(scripts/oracle-venv.sh)/bin/python"
             mlx_lm.models.llama.Model built from the GGUF's quantized tensors
             exactly as tests/reference/default_model_goldens.py does
             (build_mlx_model, imported from there), on mx.cpu (--device gpu:
             mx.gpu, as scripts/gpu/run.sh peer runs it).
  llama_cpp  run with "$(scripts/llama-cpp-venv.sh)/bin/python"
             llama-cpp-python (0.3.36): Llama.eval for prefill, the low-level
             llama_batch API (one llama_decode per step, B seq_ids) for decode.

Workloads (token ids are random, fixed seed, in [3, 49000), identical for both
engines since both use numpy's default_rng):

  prefill N   one prompt of N tokens from an empty cache, timed to completion
              (logits of the last position materialized).  Median of --repeats
              after --warmup untimed runs.
  decode B    B requests, each with its own 32-token prompt already prefilled
              (untimed), then --decode-steps greedy steps feeding [B, 1] tokens;
              each step is timed up to the argmax of its logits being on the
              host.  median_step_s is the median over all steps of all
              --repeats (each repeat starts from a fresh cache + prefill).

Usage:
  python bench_peers.py --engine {mlx_lm|llama_cpp} [--gguf PATH]
      [--prefill 32,256,1024] [--decode-batch 1,4,16] [--decode-steps 16]
      [--threads 2] [--repeats 3] [--warmup 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_GGUF = (
    Path(os.environ.get("MLX_BACKEND_CACHE", Path.home() / ".cache" / "mlx-backend"))
    / "models"
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
TOKEN_LO, TOKEN_HI = 3, 49000
DECODE_PROMPT_LEN = 32


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def int_list(s: str):
    return [int(x) for x in s.split(",") if x.strip()]


def prompt_ids(seed: int, shape):
    import numpy as np

    return np.random.default_rng(seed).integers(TOKEN_LO, TOKEN_HI, size=shape, dtype=np.int64)


def max_rss_bytes() -> int:
    # Linux: ru_maxrss is in KiB.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def prefill_row(n: int, times):
    med = statistics.median(times)
    return {
        "tokens": n,
        "seconds": med,
        "tok_per_s": n / med,
        "samples_s": times,
    }


def decode_row(b: int, step_times, steps: int, repeats: int, final_ids):
    med = statistics.median(step_times)
    return {
        "batch": b,
        "median_step_s": med,
        "tok_per_s": b / med,
        "mean_step_s": statistics.fmean(step_times),
        "min_step_s": min(step_times),
        "steps": steps,
        "repeats": repeats,
        "prompt_len": DECODE_PROMPT_LEN,
        # greedy ids of the last step (last repeat), one per sequence: a cheap
        # cross-engine / cross-batch sanity check (row 0 should not depend on B)
        "final_token_ids": [int(t) for t in final_ids],
    }


# --------------------------------------------------------------------------- mlx-lm


def backend_package() -> str:
    """The MLX backend wheel and its version (mlx-cpu, or mlx-cuda-13 unpacked without metadata)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("mlx-cpu", "mlx-cuda-13"):
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            pass
    return "MLX backend libraries without package metadata"


def run_mlx(a) -> dict:
    # mlx-cpu links reference (netlib) BLAS; set the usual knobs anyway so a
    # threaded BLAS, if ever present, honours --threads.
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(k, str(a.threads))
    import mlx.core as mx
    from importlib.metadata import version
    from mlx_lm.models.cache import make_prompt_cache

    sys.path.insert(0, str(REPO / "tests" / "reference"))
    from default_model_goldens import build_mlx_model  # noqa: E402  (exact oracle construction)

    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    t0 = time.perf_counter()
    if a.hf_folder:
        # A synthetic checkpoint (mlx_backend::model::synthetic): mlx-lm's own loader.
        from mlx_lm.utils import load_model

        model, _ = load_model(a.hf_folder)
        args = model.args
    else:
        model, args, _ = build_mlx_model(a.gguf)
    load_s = time.perf_counter() - t0
    log(f"mlx: model built in {load_s:.2f}s on {mx.default_device()}")

    def head(h):
        # lm_head (tied embeddings for SmolLM2) on the given hidden states only.
        if getattr(args, "tie_word_embeddings", False):
            return model.model.embed_tokens.as_linear(h)
        return model.lm_head(h)

    # Prefill: hidden states for all N positions, logits for the last one only
    # (what mlx-lm's generate_step computes: it evals the cache for N-1 tokens
    # and runs the lm_head on the last token; llama.cpp likewise outputs only
    # the last row).
    prefill = []
    for n in a.prefill:
        x = mx.array(prompt_ids(a.seed, (1, n)), dtype=mx.uint32)
        times = []
        for r in range(a.warmup + a.repeats):
            cache = make_prompt_cache(model)
            mx.eval(x)
            t = time.perf_counter()
            logits = head(model.model(x, cache)[:, -1:, :])
            mx.eval(logits)
            dt = time.perf_counter() - t
            if r >= a.warmup:
                times.append(dt)
            del cache, logits
        prefill.append(prefill_row(n, times))
        log(f"mlx: prefill {n}: median {prefill[-1]['seconds']*1e3:.1f} ms")

    # Decode: batched KV cache from a [B, 32] prompt batch (equal lengths, so a
    # plain per-layer KVCache with batch dim B is exact), then [B, 1] steps.
    decode = []
    for b in a.decode_batch:
        prompts = mx.array(prompt_ids(a.seed + 1, (b, DECODE_PROMPT_LEN)), dtype=mx.uint32)
        step_times = []
        for r in range(a.warmup + a.repeats):
            cache = make_prompt_cache(model)
            tok = mx.argmax(head(model.model(prompts, cache)[:, -1:, :]), axis=-1)  # [B, 1]
            mx.eval(tok)
            for _ in range(a.decode_steps):
                t = time.perf_counter()
                logits = model(tok, cache=cache)  # [B, 1, vocab]
                tok = mx.argmax(logits, axis=-1)  # greedy, [B, 1]
                mx.eval(tok)
                _ = tok.tolist()  # next ids on the host, as a server would
                dt = time.perf_counter() - t
                if r >= a.warmup:
                    step_times.append(dt)
            del cache
        decode.append(decode_row(b, step_times, a.decode_steps, a.repeats, [r_[0] for r_ in tok.tolist()]))
        log(f"mlx: decode B={b}: median step {decode[-1]['median_step_s']*1e3:.2f} ms")

    return {
        "engine": "mlx_lm",
        "version": f"mlx {version('mlx')}, {backend_package()}, mlx-lm {version('mlx-lm')}",
        "device": str(mx.default_device()),
        "threads": a.threads,
        "threads_note": "MLX CPU backend: --threads only sets OMP/OPENBLAS/MKL_NUM_THREADS (mlx-cpu bundles single-threaded reference BLAS)",
        "model": f"mlx_lm.utils.load_model({a.hf_folder})" if a.hf_folder else "mlx_lm.models.llama.Model via tests/reference/default_model_goldens.py:build_mlx_model",
        "decode_mode": "batched: one [B,1] forward per step over a make_prompt_cache KV cache prefilled with a [B,32] batch",
        "load_seconds": load_s,
        "prefill": prefill,
        "decode": decode,
        "peak_memory_bytes": int(mx.get_peak_memory()),
        "peak_memory_source": "mx.get_peak_memory()",
        "max_rss_bytes": max_rss_bytes(),
    }


# --------------------------------------------------------------------------- llama.cpp


def run_llama(a) -> dict:
    import numpy as np
    import llama_cpp
    from llama_cpp import _internals as internals

    n_ctx = max(1024, max(a.prefill, default=0)) + 64
    n_batch = max(512, max(a.prefill, default=0))
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=str(a.gguf),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        seed=0,
        logits_all=False,
        verbose=False,
    )
    load_s = time.perf_counter() - t0
    n_vocab = int(llm.n_vocab())
    n_ubatch = int(llm.context_params.n_ubatch)
    log(f"llama.cpp: loaded in {load_s:.2f}s; n_ctx={n_ctx} n_batch={n_batch} n_ubatch={n_ubatch}")
    log("llama.cpp system info: " + llama_cpp.llama_print_system_info().decode(errors="replace").strip())

    # Prefill: Llama.eval (one llama_decode since n_batch >= N; logits for the
    # last position only), cache cleared before every run.
    prefill = []
    for n in a.prefill:
        ids = [int(t) for t in prompt_ids(a.seed, (n,))]
        times = []
        for r in range(a.warmup + a.repeats):
            llm.reset()
            llm._ctx.kv_cache_clear()
            t = time.perf_counter()
            llm.eval(ids)
            _ = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).argmax()
            dt = time.perf_counter() - t
            if r >= a.warmup:
                times.append(dt)
        prefill.append(prefill_row(n, times))
        log(f"llama.cpp: prefill {n}: median {prefill[-1]['seconds']*1e3:.1f} ms")
    llm.reset()
    llm._ctx.kv_cache_clear()

    # Decode: a second context on the same model with n_seq_max = B (one KV
    # stream per sequence, kv_unified off, as llama-server uses for parallel
    # slots), one llama_batch per step carrying B tokens with seq_ids 0..B-1.
    decode = []
    per_seq_ctx = max(256, -(-(DECODE_PROMPT_LEN + a.decode_steps + 8) // 256) * 256)
    for b in a.decode_batch:
        prompts = prompt_ids(a.seed + 1, (b, DECODE_PROMPT_LEN))
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_seq_max = b
        params.n_ctx = b * per_seq_ctx
        params.n_batch = max(b * DECODE_PROMPT_LEN, 512)
        params.n_ubatch = min(params.n_batch, n_ubatch)
        params.kv_unified = False
        ctx = internals.LlamaContext(model=llm._model, params=params, verbose=False)
        batch = internals.LlamaBatch(n_tokens=params.n_batch, embd=0, n_seq_max=1, verbose=False)
        bb = batch.batch
        step_times = []
        for r in range(a.warmup + a.repeats):
            ctx.kv_cache_clear()
            batch.reset()
            for i in range(b):
                batch.add_sequence([int(t) for t in prompts[i]], seq_id=i, logits_all=False)
            ctx.decode(batch)  # prompt logits: output rows 0..B-1 (last token of each seq)
            tok = np.ctypeslib.as_array(ctx.get_logits(), shape=(b, n_vocab)).argmax(axis=1)
            for s in range(a.decode_steps):
                t = time.perf_counter()
                bb.n_tokens = b
                for i in range(b):
                    bb.token[i] = int(tok[i])
                    bb.pos[i] = DECODE_PROMPT_LEN + s
                    bb.seq_id[i][0] = i
                    bb.n_seq_id[i] = 1
                    bb.logits[i] = True
                ctx.decode(batch)
                tok = np.ctypeslib.as_array(ctx.get_logits(), shape=(b, n_vocab)).argmax(axis=1)
                dt = time.perf_counter() - t
                if r >= a.warmup:
                    step_times.append(dt)
        batch.close()
        ctx.close()
        decode.append(decode_row(b, step_times, a.decode_steps, a.repeats, tok.tolist()))
        log(f"llama.cpp: decode B={b}: median step {decode[-1]['median_step_s']*1e3:.2f} ms")

    rss = max_rss_bytes()
    return {
        "engine": "llama_cpp",
        "version": f"llama-cpp-python {llama_cpp.__version__}",
        "device": "cpu",
        "threads": a.threads,
        "n_ctx": n_ctx,
        "n_batch": n_batch,
        "n_ubatch": n_ubatch,
        "decode_mode": (
            "llama_batch: B sequences (seq_id 0..B-1) in one llama_decode per step; "
            f"separate context with n_seq_max=B, kv_unified=false, n_ctx=B*{per_seq_ctx}"
        ),
        "load_seconds": load_s,
        "prefill": prefill,
        "decode": decode,
        "peak_memory_bytes": rss,
        "peak_memory_source": "resource.getrusage(RUSAGE_SELF).ru_maxrss*1024 (includes mmapped weights)",
        "max_rss_bytes": rss,
    }


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, choices=["mlx_lm", "llama_cpp"])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--hf-folder", type=Path, default=None, help="mlx_lm only: an mlx-community style folder instead of the GGUF")
    ap.add_argument("--prefill", type=int_list, default=int_list("32,256,1024"))
    ap.add_argument("--decode-batch", type=int_list, default=int_list("1,4,16"))
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="mlx-lm's device (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per workload (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    a.gguf = a.gguf.expanduser()
    if a.hf_folder and a.engine != "mlx_lm":
        sys.exit("--hf-folder is for --engine mlx_lm")
    if not a.hf_folder and not a.gguf.exists():
        sys.exit(f"{a.gguf} missing: run scripts/fetch-default-model.sh")
    if a.repeats < 1 or a.decode_steps < 1:
        sys.exit("--repeats and --decode-steps must be >= 1")

    # Keep stdout clean for the JSON: route fd 1 (Python and C writers) to stderr.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    try:
        out = {"llama_cpp": run_llama, "mlx_lm": run_mlx}[a.engine](a)
    finally:
        sys.stdout.flush()
        os.dup2(json_fd, 1)
        os.close(json_fd)
    out["model_path"] = str(a.hf_folder or a.gguf)
    out["workload"] = {
        "token_ids": f"numpy default_rng(seed) integers in [{TOKEN_LO}, {TOKEN_HI}); prefill seed={a.seed}, decode prompts seed={a.seed + 1}",
        "decode_prompt_len": DECODE_PROMPT_LEN,
        "decode_steps": a.decode_steps,
        "repeats": a.repeats,
        "warmup": a.warmup,
        "sampling": "greedy argmax",
    }
    out["wall_seconds"] = time.perf_counter() - t0
    # Shared/oversubscribed hosts distort CPU timings badly (llama.cpp's spinning
    # thread barriers especially); record the load so callers can flag noise.
    out["host"] = {
        "cpu_count": os.cpu_count(),
        "loadavg_1m_start": load_start[0],
        "loadavg_1m_end": os.getloadavg()[0],
    }
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
