//! Hooks for this crate's own integration tests (`tests/`), with feature
//! `testing` only: forcing and forgetting kernel failures, and the kernels'
//! vjps (the fused Primitive's against the fallback graph's). They exist so
//! those tests can reach states and paths that serving never takes; they
//! are not part of the stable API and may change at any time.

use super::registry::{self, Kernel};
use crate::array::Array;
use crate::error::OpError;

/// The kernel's next invocation of its CPU body fails as if the body had
/// returned an error (`fail: false` withdraws a pending one).
pub fn force_failure(kernel: Kernel, fail: bool) {
    registry::force_failure(kernel, fail);
}

/// Forgets a recorded failure of the kernel on every backend, so later op
/// builds use its body again.
pub fn clear_failure(kernel: Kernel) {
    registry::clear_failure(kernel);
}

/// The vjp of [`rms_norm`](super::rms_norm()) (fused Primitive or fallback
/// graph, by `fused`) with respect to every primal: `primals` is `[x, w]`,
/// or `[x, residual, w]` for [`rms_norm_residual`](super::rms_norm_residual())
/// (then `cotangents` holds one per output).
pub fn rms_norm_vjp(
    primals: &[&Array],
    cotangents: &[&Array],
    eps: f32,
    fused: bool,
) -> Result<Vec<Array>, OpError> {
    super::rms_norm::vjp(primals, cotangents, eps, fused)
}

/// The vjp of [`moe_combine`](super::moe_combine()) (fused Primitive or
/// fallback graph, by `fused`) with respect to `[y, scores]`.
pub fn moe_combine_vjp(
    y: &Array,
    scores: &Array,
    cotangent: &Array,
    fused: bool,
) -> Result<Vec<Array>, OpError> {
    super::moe_combine::vjp(y, scores, cotangent, fused)
}

/// The CPU bodies without MLX, for `benches/cpu_kernels.rs`: quantized
/// weights with f16 scales and biases as loaded, f32 x, the CPU team's
/// threads (`MLX_BACKEND_THREADS`).
pub mod cpu {
    use crate::kernels::cpu::{dispatch, layout, prepare, XPrecision};
    use crate::kernels::decoder_layer::attend;
    use crate::kernels::gate_qmv_silu_mul::cpu::QuantExperts;
    use half::{bf16, f16};

    /// How the quantized bodies compute with x (`ActivationPrecision`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Precision {
        /// f32 x.
        Exact,
        /// int16 x per word (or per group on 4+ rows).
        Int16,
        /// int8 x per block of 32 on this CPU's best tier.
        Int8,
    }

    impl Precision {
        fn resolve(self) -> XPrecision {
            let code = match self {
                Precision::Exact => crate::kernels::ActivationPrecision::Exact,
                Precision::Int16 => crate::kernels::ActivationPrecision::Int16,
                Precision::Int8 => crate::kernels::ActivationPrecision::Int8,
            };
            XPrecision::from_code(code.code()).expect("a known precision")
        }
    }

    /// A random `[n, k]` MLX affine-quantized matrix: packed words, f16
    /// scales and biases.
    pub struct QuantWeights {
        w: Vec<u32>,
        scales: Vec<f16>,
        biases: Vec<f16>,
        bits: u32,
        group_size: usize,
        n: usize,
        k: usize,
    }

    impl QuantWeights {
        /// Seeded random weights of `bits` (4 or 8) per value in groups of
        /// `group_size` columns.
        pub fn random(seed: u64, n: usize, k: usize, bits: u32, group_size: usize) -> Self {
            // xorshift64: deterministic data without a dependency.
            let mut state = seed.max(1);
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let groups = n * k / group_size;
            let max_q = ((1u32 << bits) - 1) as f32;
            let w = (0..n * k * bits as usize / 32)
                .map(|_| next() as u32)
                .collect();
            let mut small = |amp: f32| {
                let unit = (next() >> 40) as f32 / (1u64 << 24) as f32;
                f16::from_f32((unit * 2.0 - 1.0) * amp)
            };
            let scales = (0..groups).map(|_| small(0.3 / max_q)).collect();
            let biases = (0..groups).map(|_| small(0.15)).collect();
            QuantWeights {
                w,
                scales,
                biases,
                bits,
                group_size,
                n,
                k,
            }
        }

        /// Output columns (rows of the matrix).
        pub fn n(&self) -> usize {
            self.n
        }

        /// Input columns.
        pub fn k(&self) -> usize {
            self.k
        }

        /// Bytes the bodies read per pass over the matrix.
        pub fn bytes(&self) -> usize {
            self.w.len() * 4 + (self.scales.len() + self.biases.len()) * 2
        }

        fn matrix(&self) -> layout::QuantMatrix<'_, f16> {
            layout::QuantMatrix {
                w: &self.w,
                scales: &self.scales,
                biases: &self.biases,
                bits: self.bits,
                group_size: self.group_size,
            }
        }

        fn experts(&self, num_experts: usize) -> QuantExperts<'_, f16> {
            QuantExperts::stacked(self.matrix(), num_experts)
        }

        fn view(&self) -> layout::QView<'_, f16> {
            let lay = layout::Layout::new(self.bits, self.group_size, self.n, self.k)
                .expect("a valid layout");
            layout::QView::new("w", &self.w, &self.scales, &self.biases, lay, 1)
                .expect("a valid matrix")
        }
    }

    /// `quantized_matmul`'s CPU body: `out [m, n] = x [m, k] · Wᵀ`.
    pub fn quantized_matmul(x: &[f32], w: &QuantWeights, out: &mut [f32], m: usize, p: Precision) {
        crate::kernels::quantized_matmul::cpu::quantized_matmul_with(
            x,
            w.matrix(),
            out,
            m,
            w.n,
            w.k,
            p.resolve(),
        )
        .expect("valid arguments");
    }

    /// [`quantized_matmul`] on bf16 x and out (exact precision: the bf16
    /// dot-product instructions where the CPU has them).
    pub fn quantized_matmul_bf16(x: &[bf16], w: &QuantWeights, out: &mut [bf16], m: usize) {
        crate::kernels::quantized_matmul::cpu::quantized_matmul_with(
            x,
            w.matrix(),
            out,
            m,
            w.n,
            w.k,
            XPrecision::Exact,
        )
        .expect("valid arguments");
    }

    /// The expert-indexed gate body: `out [experts.len(), n]`, row `i` =
    /// silu(x[x_row_for[i]] · gate[experts[i]]ᵀ) * (x[x_row_for[i]] ·
    /// up[experts[i]]ᵀ), where `gate` and `up` hold `num_experts` stacked
    /// `[n, k]` matrices (made as one `[num_experts·n, k]` matrix).
    pub fn gather_gate_qmv_silu_mul(
        x: &[f32],
        x_row_for: &[u32],
        experts: &[u32],
        gate: &QuantWeights,
        up: &QuantWeights,
        num_experts: usize,
        out: &mut [f32],
    ) {
        let n = gate.n / num_experts.max(1);
        crate::kernels::gate_qmv_silu_mul::cpu::gather_gate_qmv_silu_mul_with(
            x,
            x_row_for,
            experts,
            gate.experts(num_experts),
            up.experts(num_experts),
            out,
            n,
            gate.k,
            XPrecision::Exact,
        )
        .expect("valid arguments");
    }

    /// `gate_qmv_silu_mul`'s CPU body: `out = silu(x · gateᵀ) * (x · upᵀ)`.
    pub fn gate_qmv_silu_mul(
        x: &[f32],
        gate: &QuantWeights,
        up: &QuantWeights,
        out: &mut [f32],
        m: usize,
    ) {
        crate::kernels::gate_qmv_silu_mul::cpu::gate_qmv_silu_mul_with(
            x,
            gate.matrix(),
            up.matrix(),
            out,
            m,
            gate.n,
            gate.k,
            XPrecision::Exact,
        )
        .expect("valid arguments");
    }

    /// x rows prepared once for the blocked dot products (the body
    /// [`PreparedRows::dot_rows`] then takes follows from the preparation).
    pub struct PreparedRows(prepare::PreparedX);

    impl PreparedRows {
        /// `x [m, w.k]` for `w`: int16 or exact, with AMX tiles and the
        /// per-group int16 body (`row_lanes`) allowed or not.
        pub fn new(x: &[f32], w: &QuantWeights, int16: bool, amx: bool, row_lanes: bool) -> Self {
            let lay = w.view().lay;
            PreparedRows(prepare::PreparedX::with_kernels(
                x.chunks_exact(w.k),
                &lay,
                int16,
                amx,
                row_lanes,
            ))
        }

        /// `x [m, w.k]` for `w` in blocks of `lanes` words (16: the AVX-512
        /// bodies, 8: the AVX2 ones), exact or int16 per word, as a CPU of
        /// that width prepares it. `None` when this CPU cannot run that
        /// width's bodies.
        pub fn for_width(x: &[f32], w: &QuantWeights, lanes: usize, int16: bool) -> Option<Self> {
            let runs = match lanes {
                16 => crate::kernels::cpu::isa::avx512_available(),
                8 => crate::kernels::cpu::isa::avx2_available(),
                _ => false,
            };
            let lay = w.view().lay;
            runs.then(|| {
                PreparedRows(prepare::PreparedX::for_width(
                    x.chunks_exact(w.k),
                    &lay,
                    lanes,
                    int16,
                ))
            })
        }

        /// True when a blocked body runs on this CPU.
        pub fn available() -> bool {
            dispatch::available()
        }

        /// `out [m, n]` = every prepared row against every row of `w`, one thread.
        pub fn dot_rows(&self, w: &QuantWeights, out: &mut [f32]) {
            let strides = layout::OutStrides {
                x_stride: w.n,
                w_stride: 1,
            };
            dispatch::dot_rows(&self.0, 0..self.0.rows, &w.view(), 0..w.n, out, strides);
        }
    }

    /// Attention of `q`'s heads (`[heads, d]`, sharing one KV head) over
    /// `keys` and `values` (`[s, d]`), as the decoder layer's CPU body runs it.
    pub fn attend_heads(q: &[f32], keys: &[f32], values: &[f32], d: usize, out: &mut [f32]) {
        let mut scores = Vec::new();
        attend::attend_heads(q, keys, values, d, 0.125, &mut scores, out);
    }
}
