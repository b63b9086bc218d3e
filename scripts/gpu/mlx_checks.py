"""MLX's own CUDA ops against the same ops on its CPU, on the shapes this
crate's tests and models use: which built-ins a GPU test may trust as a
reference, and which fallbacks of ours inherit an upstream error.

Run on the GPU machine by `scripts/gpu/run.sh mlx-checks` (MLX's Python
package from the packed layout); prints one table row per case and a
summary line, and exits 1 when a case differs by more than its tolerance.
"""

import itertools
import sys

import mlx.core as mx

TOL = {mx.float32: 1e-4, mx.float16: 2e-2, mx.bfloat16: 5e-2}


def rel(got, want):
    got = got.astype(mx.float32)
    want = want.astype(mx.float32)
    num = mx.sqrt(mx.sum((got - want) ** 2)).item()
    den = mx.sqrt(mx.sum(want**2)).item()
    return num / max(den, 1e-30)


def on_both(f):
    gpu = f(mx.gpu)
    cpu = f(mx.cpu)
    mx.eval(gpu, cpu)
    return gpu, cpu


def quantized_matmul_cases():
    for bits, gs, m, (n, k), dt in itertools.product(
        (4, 8),
        (32, 64, 128),
        (1, 2, 4, 5, 7, 33),
        ((8, 64), (72, 384), (128, 128), (128, 192), (64, 128), (192, 128)),
        (mx.float32, mx.float16, mx.bfloat16),
    ):
        if k % gs:
            continue
        key = mx.random.key(bits * 1000 + gs * 10 + m + n + k)
        k1, k2 = mx.random.split(key)
        w = mx.random.normal((n, k), key=k1, stream=mx.cpu) * 0.08
        x = mx.random.normal((m, k), key=k2, stream=mx.cpu).astype(dt)
        wq, s, b = mx.quantize(w, group_size=gs, bits=bits, stream=mx.cpu)
        s, b = s.astype(dt), b.astype(dt)

        def f(dev):
            return mx.quantized_matmul(
                x, wq, s, b, transpose=True, group_size=gs, bits=bits, stream=dev
            )

        yield f"quantized_matmul b{bits} g{gs} M{m} N{n} K{k} {dt}", f, TOL[dt]


def gather_qmm_cases():
    for bits, gs, (rows, top_k), (e, n, k), dt in itertools.product(
        (4, 8),
        (32, 64),
        ((1, 2), (7, 2), (33, 4)),
        ((8, 32, 64), (8, 64, 32), (60, 1408 // 8, 256)),
        (mx.float32, mx.bfloat16),
    ):
        if k % gs:
            continue
        key = mx.random.key(bits * 100 + gs + rows + e + n + k)
        k1, k2, k3 = mx.random.split(key, 3)
        w = mx.random.normal((e, n, k), key=k1, stream=mx.cpu) * 0.08
        x = mx.random.normal((rows, 1, 1, k), key=k2, stream=mx.cpu).astype(dt)
        idx = mx.random.randint(0, e, (rows, top_k), key=k3, stream=mx.cpu).astype(mx.uint32)
        wq, s, b = mx.quantize(w, group_size=gs, bits=bits, stream=mx.cpu)
        s, b = s.astype(dt), b.astype(dt)

        def f(dev):
            return mx.gather_qmm(
                x, wq, s, b, rhs_indices=idx, transpose=True, group_size=gs, bits=bits,
                stream=dev,
            )

        yield f"gather_qmm b{bits} g{gs} rows{rows} top{top_k} E{e} N{n} K{k} {dt}", f, TOL[dt]


def main():
    bad = 0
    total = 0
    print("| case | GPU vs CPU (norm rel) | result |")
    print("| --- | --- | --- |")
    for name, f, tol in itertools.chain(quantized_matmul_cases(), gather_qmm_cases()):
        total += 1
        try:
            gpu, cpu = on_both(f)
            err = rel(gpu, cpu)
            ok = err <= tol
            shown = f"{err:.2e}"
        except Exception as e:  # an op MLX rejects on the GPU
            ok, shown = False, f"error: {str(e).splitlines()[0][:80]}"
        if not ok:
            bad += 1
            print(f"| {name} | {shown} | DIFFERS |")
    print(f"\n{total - bad} of {total} cases agree; {bad} differ (only those listed)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
