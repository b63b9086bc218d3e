//! Fused SwiGLU input projection on MLX affine-quantized weights:
//! `out = silu(x·Wgᵀ) * (x·Wuᵀ)`, with `W[n,k] = scale * q + bias` per group.
//!
//! Rounding follows MLX's unfused graph (two quantized matmuls, then
//! `silu(g) = g * sigmoid(g)` and the product, each op rounding to T);
//! the dot products themselves accumulate in f32 with FMA. The quantized
//! dot and dequantize bodies live in `kernels::cpu::rowwise`.

use crate::kernels::cpu::{
    for_chunks, run_entry, try_for_chunks, typed, typed_mut, with_float, FloatKind, XPrecision,
};
use crate::kernels::registry::Kernel;

use crate::kernels::cpu::dispatch::{self, RowMajorChunks};
use crate::kernels::cpu::error::{check_len, KernelError};
use crate::kernels::cpu::int8::{
    dot_rows as int8_dot_rows, dot_tile as int8_dot_tile, Int8Tier, Q8Activations,
};
use crate::kernels::cpu::isa;
use crate::kernels::cpu::layout::OutStrides;
pub use crate::kernels::cpu::layout::QuantMatrix;
use crate::kernels::cpu::layout::{Layout, QRow, QView};
use crate::kernels::cpu::prepare::PreparedX;
use crate::kernels::cpu::rowwise::{bias_term, dequant, qdot2_scaled, scatter_rows};
use crate::kernels::cpu::simd::{self, Element};
use crate::kernels::cpu::team;

/// Below this many multiply-adds threading costs more than it saves.
const PAR_MIN_MACS: usize = 1 << 20;
/// Output rows per unit of work.
const TILE_N: usize = 16;

/// `num_experts` quantized `[N, K]` matrices stacked as `[E, N, ...]`.
#[derive(Clone, Copy, Debug)]
pub struct QuantExperts<'a, T> {
    pub w: &'a [u32],
    pub scales: &'a [T],
    pub biases: &'a [T],
    pub bits: u32,
    pub group_size: usize,
    pub num_experts: usize,
}

// For the tests and the test hooks, which hold stacks as one matrix.
#[cfg(any(test, feature = "testing"))]
impl<'a, T> QuantExperts<'a, T> {
    /// `m` (`[num_experts·N, K]`) read as `num_experts` stacked `[N, K]` matrices.
    pub fn stacked(m: QuantMatrix<'a, T>, num_experts: usize) -> Self {
        QuantExperts {
            w: m.w,
            scales: m.scales,
            biases: m.biases,
            bits: m.bits,
            group_size: m.group_size,
            num_experts,
        }
    }
}

/// Dense form: `x` is `[m, k]`, `out` is `[m, n]`, both row-major (exact activations).
#[cfg(test)] // the exact form, as the tests call it
pub fn gate_qmv_silu_mul<T: Element, P: Element>(
    x: &[T],
    gate: QuantMatrix<P>,
    up: QuantMatrix<P>,
    out: &mut [T],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    gate_qmv_silu_mul_with(x, gate, up, out, m, n, k, XPrecision::Exact)
}

/// [`gate_qmv_silu_mul`] with x in the given precision.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gate_qmv_silu_mul_with<T: Element, P: Element>(
    x: &[T],
    gate: QuantMatrix<P>,
    up: QuantMatrix<P>,
    out: &mut [T],
    m: usize,
    n: usize,
    k: usize,
    xp: XPrecision,
) -> Result<(), KernelError> {
    let lay = shared_layout(gate.bits, gate.group_size, up.bits, up.group_size, n, k)?;
    let gv = QView::new("gate", gate.w, gate.scales, gate.biases, lay, 1)?;
    let uv = QView::new("up", up.w, up.scales, up.biases, lay, 1)?;
    check_len("x", x.len(), m.checked_mul(k))?;
    check_len("out", out.len(), m.checked_mul(n))?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let px = Prepared::new(x.chunks_exact(k), &lay, xp);
    if let Some(p) = px.for_blocked() {
        if on_team(m, n, k) {
            let rows: Vec<usize> = (0..m).collect();
            return team_blocked(&[(rows.as_slice(), p, gv, uv)], out, n);
        }
        dense_blocked(p, &gv, &uv, out);
        return Ok(());
    }
    if m == 1 {
        project_rows(&px, &gv, &uv, out)?;
    } else {
        let mut tmp = vec![T::from_f32(0.0); n * m];
        project_rows(&px, &gv, &uv, &mut tmp)?;
        scatter_rows(&tmp, out, m, n, |r| r);
    }
    Ok(())
}

/// Expert-indexed form: output row `i` is computed from x row
/// `x_row_for[i]` with expert `experts[i]`. `x` is `[R, k]`, `out` is
/// `[experts.len(), n]`. Rows sharing an expert are batched so that
/// expert's weights are read once. Exact activations.
#[cfg(test)] // the exact form, as the tests call it
#[allow(clippy::too_many_arguments)]
pub fn gather_gate_qmv_silu_mul<T: Element, P: Element>(
    x: &[T],
    x_row_for: &[u32],
    experts: &[u32],
    gate: QuantExperts<P>,
    up: QuantExperts<P>,
    out: &mut [T],
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    gather_gate_qmv_silu_mul_with(
        x,
        x_row_for,
        experts,
        gate,
        up,
        out,
        n,
        k,
        XPrecision::Exact,
    )
}

/// [`gather_gate_qmv_silu_mul`] with x in the given precision.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_gate_qmv_silu_mul_with<T: Element, P: Element>(
    x: &[T],
    x_row_for: &[u32],
    experts: &[u32],
    gate: QuantExperts<P>,
    up: QuantExperts<P>,
    out: &mut [T],
    n: usize,
    k: usize,
    xp: XPrecision,
) -> Result<(), KernelError> {
    let lay = shared_layout(gate.bits, gate.group_size, up.bits, up.group_size, n, k)?;
    if gate.num_experts != up.num_experts {
        return Err(KernelError::Shape(format!(
            "gate has {} experts, up has {}",
            gate.num_experts, up.num_experts
        )));
    }
    let num_experts = gate.num_experts;
    let gv = QView::new("gate", gate.w, gate.scales, gate.biases, lay, num_experts)?;
    let uv = QView::new("up", up.w, up.scales, up.biases, lay, num_experts)?;
    if !x.len().is_multiple_of(k) {
        return Err(KernelError::Shape(format!(
            "x has {} elements, not a multiple of k = {k}",
            x.len()
        )));
    }
    let x_rows = x.len() / k;
    let rows = experts.len();
    check_len("x_row_for", x_row_for.len(), Some(rows))?;
    check_len("out", out.len(), rows.checked_mul(n))?;
    for (i, (&e, &r)) in experts.iter().zip(x_row_for).enumerate() {
        if e as usize >= num_experts {
            return Err(KernelError::IndexOutOfRange(format!(
                "row {i}: expert {e} >= num_experts {num_experts}"
            )));
        }
        if r as usize >= x_rows {
            return Err(KernelError::IndexOutOfRange(format!(
                "row {i}: x row {r} >= {x_rows}"
            )));
        }
    }
    if n == 0 {
        return Ok(());
    }
    let mut order: Vec<usize> = (0..rows).collect();
    order.sort_by_key(|&i| experts[i]);
    let groups: Vec<&[usize]> = order.chunk_by(|&a, &b| experts[a] == experts[b]).collect();
    // Each expert's x rows, prepared once for whichever path runs.
    let prepared: Vec<Prepared> = groups
        .iter()
        .map(|g| {
            let x_sel = g.iter().map(|&i| &x[x_row_for[i] as usize * k..][..k]);
            Prepared::new(x_sel, &lay, xp)
        })
        .collect();
    let expert = |g: &[usize]| {
        let e = experts[g[0]] as usize;
        (gv.expert(e), uv.expert(e))
    };
    if on_team(rows, n, k) {
        let jobs: Option<Vec<TeamJob<P>>> = groups
            .iter()
            .zip(&prepared)
            .map(|(g, px)| {
                let (ge, ue) = expert(g);
                px.for_blocked().map(|p| (*g, p, ge, ue))
            })
            .collect();
        if let Some(jobs) = jobs {
            return team_blocked(&jobs, out, n);
        }
    }
    for (group, px) in groups.iter().zip(&prepared) {
        let (ge, ue) = expert(group);
        let mut tmp = vec![T::from_f32(0.0); n * group.len()];
        if let Some(p) = px.for_blocked() {
            // Row-major `[group, n]`.
            dense_blocked(p, &ge, &ue, &mut tmp);
            for (&row, act) in group.iter().zip(tmp.chunks_exact(n)) {
                out[row * n..][..n].copy_from_slice(act);
            }
        } else {
            project_rows(px, &ge, &ue, &mut tmp)?;
            scatter_rows(&tmp, out, group.len(), n, |r| group[r]);
        }
    }
    Ok(())
}

/// The quantisation geometry of gate and up, which must agree.
fn shared_layout(
    gate_bits: u32,
    gate_group: usize,
    up_bits: u32,
    up_group: usize,
    n: usize,
    k: usize,
) -> Result<Layout, KernelError> {
    if (gate_bits, gate_group) != (up_bits, up_group) {
        return Err(KernelError::Unsupported(format!(
            "gate ({gate_bits} bits, group {gate_group}) and up ({up_bits} bits, \
             group {up_group}) must share quantisation parameters"
        )));
    }
    Layout::new(gate_bits, gate_group, n, k)
}

/// x rows prepared once per call: f32 (or int16) in block order, or int8.
#[allow(clippy::large_enum_variant)] // one per call, never moved in a loop
enum Prepared {
    Exact(PreparedX),
    Int8(Q8Activations, Int8Tier),
}

impl Prepared {
    fn new<'x, T: Element>(
        rows: impl ExactSizeIterator<Item = &'x [T]>,
        lay: &Layout,
        xp: XPrecision,
    ) -> Self {
        match xp.int8() {
            None => Prepared::Exact(PreparedX::new(rows, lay, xp.int16())),
            Some(tier) => Prepared::Int8(Q8Activations::prepare(rows, lay), tier),
        }
    }

    /// x for the blocked kernel ([`dense_blocked`]), if this CPU runs one
    /// and x is not int8.
    fn for_blocked(&self) -> Option<&PreparedX> {
        match self {
            Prepared::Exact(p) if dispatch::available() => Some(p),
            _ => None,
        }
    }
}

/// Fills `dst` (`[n][m]`, transposed) with the activated outputs.
fn project_rows<T: Element, P: Element>(
    px: &Prepared,
    gate: &QView<P>,
    up: &QView<P>,
    dst: &mut [T],
) -> Result<(), KernelError> {
    match px {
        Prepared::Exact(px) => {
            project_rows_exact(px, gate, up, dst);
            Ok(())
        }
        Prepared::Int8(xs, tier) => project_rows_int8(xs, *tier, gate, up, dst),
    }
}

/// [`project_rows`] with int8 activations: per tile of output rows, the
/// gate and up dot products into f32 scratch, then SwiGLU.
fn project_rows_int8<T: Element, P: Element>(
    xs: &Q8Activations,
    tier: Int8Tier,
    gate: &QView<P>,
    up: &QView<P>,
    dst: &mut [T],
) -> Result<(), KernelError> {
    let m = xs.rows();
    let tile = |first: usize, chunk: &mut [T], bufs: &mut (Vec<f32>, Vec<f32>)| {
        let (g, u) = (&mut bufs.0[..chunk.len()], &mut bufs.1[..chunk.len()]);
        if m == 1 {
            int8_dot_rows(xs.row(0), gate, first, g, tier)?;
            int8_dot_rows(xs.row(0), up, first, u, tier)?;
        } else {
            int8_dot_tile(xs, gate, first, g, tier)?;
            int8_dot_tile(xs, up, first, u, tier)?;
        }
        for ((o, g), u) in chunk.iter_mut().zip(g.iter()).zip(u.iter()) {
            *o = swiglu(*g, *u);
        }
        Ok::<(), KernelError>(())
    };
    let new_bufs = || (vec![0.0f32; TILE_N * m], vec![0.0f32; TILE_N * m]);
    let split = worth_splitting(m, gate.lay.n, gate.lay.k);
    try_for_chunks(dst, TILE_N * m, split, new_bufs, |c, chunk, bufs| {
        tile(c * TILE_N, chunk, bufs)
    })
}

/// [`project_rows`] with exact activations (x in 8-lane block order: the
/// portable bodies; AVX-512 and AVX2 take [`dense_blocked`]).
fn project_rows_exact<T: Element, P: Element>(
    px: &PreparedX,
    gate: &QView<P>,
    up: &QView<P>,
    dst: &mut [T],
) {
    assert_eq!(px.lanes, 8, "x in 8-lane block order");
    let lay = gate.lay;
    let (m, k) = (px.rows, lay.k);
    let avx = isa::has_avx2_f16c();
    let tile = |first: usize, chunk: &mut [T], bufs: &mut (Vec<f32>, Vec<f32>)| {
        for (i, outs) in chunk.chunks_mut(m).enumerate() {
            let (g_row, u_row) = (gate.row(first + i), up.row(first + i));
            if m == 1 {
                let (g, u) = qdot2(&g_row, &u_row, &px.perm, &px.group_sums, &lay, avx);
                outs[0] = swiglu(g, u);
            } else {
                // Several x rows: unpack this weight row once, reuse it per x row.
                dequant(&g_row, &lay, &mut bufs.0, avx);
                dequant(&u_row, &lay, &mut bufs.1, avx);
                for (o, xr) in outs.iter_mut().zip(px.perm.chunks_exact(k)) {
                    let (g, u) = simd::dot2(xr, &bufs.0, &bufs.1);
                    *o = swiglu(g, u);
                }
            }
        }
    };
    let new_bufs = || {
        let len = if m > 1 { k } else { 0 };
        (vec![0.0f32; len], vec![0.0f32; len])
    };
    let split = worth_splitting(m, lay.n, k);
    for_chunks(dst, TILE_N * m, split, new_bufs, |c, chunk, bufs| {
        tile(c * TILE_N, chunk, bufs)
    });
}

/// The blocked kernel for every x row of `px` (the dense form, and each
/// expert's rows of the indexed one), `out` `[m, n]` row-major in place
/// (chunks as [`RowMajorChunks`] cuts them).
fn dense_blocked<T: Element, P: Element>(
    px: &PreparedX,
    gate: &QView<P>,
    up: &QView<P>,
    out: &mut [T],
) {
    let (m, n) = (px.rows, gate.lay.n);
    let parallel = worth_splitting(m, n, gate.lay.k);
    let chunks = RowMajorChunks::new(px, n, parallel);
    let body = |c: usize, chunk: &mut [T], bufs: &mut (Vec<f32>, Vec<f32>)| {
        bufs.0.resize(chunk.len(), 0.0);
        bufs.1.resize(chunk.len(), 0.0);
        let (xrows, cols, strides) = chunks.part(c, chunk.len());
        dispatch::dot_rows(px, xrows.clone(), gate, cols.clone(), &mut bufs.0, strides);
        dispatch::dot_rows(px, xrows, up, cols, &mut bufs.1, strides);
        activate(&bufs.0, &bufs.1, chunk);
    };
    for_chunks(out, chunks.len, parallel, Default::default, body);
}

/// Whether `m · n · k` multiply-adds are worth splitting (never inside a
/// CPU team member, which stays on its thread).
fn worth_splitting(m: usize, n: usize, k: usize) -> bool {
    m.saturating_mul(n).saturating_mul(k) > PAR_MIN_MACS && !team::in_team()
}

/// Whether a call this size runs on the CPU team ([`team_blocked`]): decode
/// sizes (few rows) worth splitting, outside a team member.
fn on_team(rows: usize, n: usize, k: usize) -> bool {
    rows <= TEAM_MAX_ROWS && worth_splitting(rows, n, k)
}

/// x rows up to which decode-sized calls take the team.
const TEAM_MAX_ROWS: usize = 32;

/// Each `(rows, x, gate, up)` job writes output rows `rows` (x row `i`
/// of the job to `out[rows[i]]`), in units of [`TEAM_COLS`] output
/// columns taken by the members ([`team::for_units`]), so one team job
/// covers all experts (a task per few columns would cost as much to
/// schedule as to compute at decode sizes). Units, not fixed
/// shares, because a helper that has parked (after a pause of more than a
/// few ms) can take milliseconds to wake on a VM: the caller then takes its
/// units and does not wait for it.
fn team_blocked<T: Element, P: Element>(
    jobs: &[TeamJob<'_, P>],
    out: &mut [T],
    n: usize,
) -> Result<(), KernelError> {
    let dst = team::SharedSlice::new(out);
    let per_job = n.div_ceil(TEAM_COLS);
    let scratch = || (Vec::new(), Vec::new(), Vec::new());
    team::for_units(jobs.len() * per_job, scratch, |unit, (g, u, act)| {
        let (rows, px, gate, up) = &jobs[unit / per_job];
        let start = unit % per_job * TEAM_COLS;
        let cols = start..(start + TEAM_COLS).min(n);
        let (m, w) = (rows.len(), cols.len());
        let st = OutStrides {
            x_stride: w,
            w_stride: 1,
        };
        g.resize(m * w, 0.0);
        u.resize(m * w, 0.0);
        act.resize(m * w, T::from_f32(0.0));
        dispatch::dot_rows(px, 0..m, gate, cols.clone(), g, st);
        dispatch::dot_rows(px, 0..m, up, cols.clone(), u, st);
        activate(g, u, act);
        for (&row, a) in rows.iter().zip(act.chunks_exact(w)) {
            // SAFETY: each unit's columns of its job's rows are written
            // by the one member that took it.
            unsafe { dst.part(row * n + cols.start, w) }.copy_from_slice(a);
        }
        Ok(())
    })
}

/// One [`team_blocked`] job: output rows, their prepared x, gate and up.
type TeamJob<'a, P> = (&'a [usize], &'a PreparedX, QView<'a, P>, QView<'a, P>);

/// Output columns per claimed unit of [`team_blocked`] (~0.1–0.3 M
/// multiply-adds per x row at the bench's shapes).
const TEAM_COLS: usize = 64;

/// `out = swiglu(g, u)` elementwise: sixteen lanes at a time for f32 out
/// (`vector_math`), else per value with T's roundings.
fn activate<T: Element>(g: &[f32], u: &[f32], out: &mut [T]) {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32.
        let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast(), out.len()) };
        return crate::kernels::cpu::vector_math::swiglu_f32(g, u, out);
    }
    for ((o, g), u) in out.iter_mut().zip(g).zip(u) {
        *o = swiglu(*g, *u);
    }
}

/// MLX's unfused rounding: g, u, sigmoid(g), g*sigmoid(g) and the product
/// each land in T.
fn swiglu<T: Element>(g: f32, u: f32) -> T {
    let g = T::from_f32(g).to_f32();
    let u = T::from_f32(u).to_f32();
    let sig = T::from_f32(1.0 / (1.0 + (-g).exp())).to_f32();
    let silu = T::from_f32(g * sig).to_f32();
    T::from_f32(silu * u)
}

/// Gate and up dot products of one weight row each with the prepared x row.
fn qdot2<P: Element>(
    g: &QRow<P>,
    u: &QRow<P>,
    xp: &[f32],
    sums: &[f32],
    lay: &Layout,
    avx: bool,
) -> (f32, f32) {
    let (dg, du) = qdot2_scaled(g, u, xp, lay, avx);
    (
        dg + bias_term(g.biases, sums, avx),
        du + bias_term(u.biases, sums, avx),
    )
}

/// x's and the scales' element kinds: one dtype, or f32 x with f16/bf16
/// scales and biases (promoted per group inside the dot products).
fn kinds(dtype: i32, params_dtype: i32) -> Result<(FloatKind, FloatKind), KernelError> {
    let (xk, pk) = (
        FloatKind::from_code(dtype)?,
        FloatKind::from_code(params_dtype)?,
    );
    if xk != pk && xk != FloatKind::F32 {
        return Err(KernelError::Unsupported(format!(
            "x {xk:?} with scales {pk:?}: mixed dtypes need f32 x"
        )));
    }
    Ok((xk, pk))
}

/// Entry point from C++ (dense `GateQmvSiluMulPrimitive`); all arrays dense;
/// `dtype` is x's (and out's), `params_dtype` that of scales and biases.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gate_qmv_silu_mul_cpu(
    dtype: i32,
    params_dtype: i32,
    x: &[u8],
    gate_w: &[u32],
    gate_scales: &[u8],
    gate_biases: &[u8],
    up_w: &[u32],
    up_scales: &[u8],
    up_biases: &[u8],
    bits: u32,
    group_size: usize,
    out: &mut [u8],
    m: usize,
    n: usize,
    k: usize,
    activations: i32,
) -> bool {
    run_entry(Kernel::GateQmvSiluMul, || {
        let xp = XPrecision::from_code(activations)?;
        let (xk, pk) = kinds(dtype, params_dtype)?;
        with_float!(xk, T => with_float!(pk, P => {
            let gate = QuantMatrix::<P> {
                w: gate_w,
                scales: typed(gate_scales)?,
                biases: typed(gate_biases)?,
                bits,
                group_size,
            };
            let up = QuantMatrix::<P> {
                w: up_w,
                scales: typed(up_scales)?,
                biases: typed(up_biases)?,
                bits,
                group_size,
            };
            gate_qmv_silu_mul_with::<T, P>(typed(x)?, gate, up, typed_mut(out)?, m, n, k, xp)
        }))
    })
}

/// Entry point from C++ (expert-indexed `GateQmvSiluMulPrimitive`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_gate_qmv_silu_mul_cpu(
    dtype: i32,
    params_dtype: i32,
    x: &[u8],
    x_row_for: &[u32],
    experts: &[u32],
    gate_w: &[u32],
    gate_scales: &[u8],
    gate_biases: &[u8],
    up_w: &[u32],
    up_scales: &[u8],
    up_biases: &[u8],
    bits: u32,
    group_size: usize,
    num_experts: usize,
    out: &mut [u8],
    n: usize,
    k: usize,
    activations: i32,
) -> bool {
    run_entry(Kernel::GateQmvSiluMul, || {
        let xp = XPrecision::from_code(activations)?;
        let (xk, pk) = kinds(dtype, params_dtype)?;
        with_float!(xk, T => with_float!(pk, P => {
            let gate = QuantExperts::<P> {
                w: gate_w,
                scales: typed(gate_scales)?,
                biases: typed(gate_biases)?,
                bits,
                group_size,
                num_experts,
            };
            let up = QuantExperts::<P> {
                w: up_w,
                scales: typed(up_scales)?,
                biases: typed(up_biases)?,
                bits,
                group_size,
                num_experts,
            };
            gather_gate_qmv_silu_mul_with::<T, P>(
                typed(x)?,
                x_row_for,
                experts,
                gate,
                up,
                typed_mut(out)?,
                n,
                k,
                xp,
            )
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::test_util::{tol_eps, Rng};
    use half::{bf16, f16};

    /// Owned quantized weights for `mats` stacked `[n, k]` matrices.
    struct Owned<T> {
        w: Vec<u32>,
        scales: Vec<T>,
        biases: Vec<T>,
        bits: u32,
        group_size: usize,
    }

    impl<T: Element> Owned<T> {
        fn random(
            rng: &mut Rng,
            mats: usize,
            n: usize,
            k: usize,
            bits: u32,
            group_size: usize,
        ) -> Self {
            let words = mats * n * k * bits as usize / 32;
            let groups = mats * n * k / group_size;
            let max_q = ((1u32 << bits) - 1) as f32;
            Owned {
                w: (0..words).map(|_| rng.next_u32()).collect(),
                scales: rng.elems(groups, 0.3 / max_q),
                biases: rng.elems(groups, 0.15),
                bits,
                group_size,
            }
        }
        fn matrix(&self) -> QuantMatrix<'_, T> {
            QuantMatrix {
                w: &self.w,
                scales: &self.scales,
                biases: &self.biases,
                bits: self.bits,
                group_size: self.group_size,
            }
        }
        fn experts(&self, num_experts: usize) -> QuantExperts<'_, T> {
            QuantExperts::stacked(self.matrix(), num_experts)
        }
        /// Dequantized `W[e, n, k]` straight from the documented formula.
        fn weight(&self, e: usize, row: usize, col: usize, n: usize, k: usize) -> f64 {
            let bits = self.bits as usize;
            let r = e * n + row;
            let word = self.w[r * k * bits / 32 + col * bits / 32];
            let q = (word >> (bits * (col % (32 / bits)))) & ((1 << bits) - 1);
            let gi = r * (k / self.group_size) + col / self.group_size;
            self.scales[gi].to_f32() as f64 * q as f64 + self.biases[gi].to_f32() as f64
        }
    }

    /// f64 dot products, then MLX's op-by-op rounding to T.
    fn reference<T: Element>(
        x: &[T],
        gate: &Owned<T>,
        up: &Owned<T>,
        e: usize,
        row: usize,
        n: usize,
        k: usize,
    ) -> f32 {
        let (mut g, mut u) = (0.0f64, 0.0f64);
        for (c, xv) in x[..k].iter().enumerate() {
            let xv = xv.to_f32() as f64;
            g += xv * gate.weight(e, row, c, n, k);
            u += xv * up.weight(e, row, c, n, k);
        }
        let g = T::from_f32(g as f32).to_f32() as f64;
        let u = T::from_f32(u as f32).to_f32() as f64;
        let sig = T::from_f32((1.0 / (1.0 + (-g).exp())) as f32).to_f32() as f64;
        let silu = T::from_f32((g * sig) as f32).to_f32() as f64;
        T::from_f32((silu * u) as f32).to_f32()
    }

    fn assert_close(got: &[f32], want: &[f32], eps: f32, what: &str) {
        // Cancellation in g or u makes relative error meaningless near zero;
        // judge absolute error against the typical output size.
        let typical = want.iter().map(|v| v.abs()).sum::<f32>() / want.len() as f32;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let tol = 4.0 * eps * w.abs() + 2e-3 * typical.max(eps);
            assert!(
                (g - w).abs() <= tol,
                "{what}: index {i}: got {g}, want {w} (typical {typical})"
            );
        }
    }

    fn dense_case<T: Element>(
        rng: &mut Rng,
        m: usize,
        n: usize,
        k: usize,
        bits: u32,
        group: usize,
    ) {
        let gate = Owned::<T>::random(rng, 1, n, k, bits, group);
        let up = Owned::<T>::random(rng, 1, n, k, bits, group);
        let x: Vec<T> = rng.elems(m * k, 1.0);
        let mut out = vec![T::from_f32(f32::NAN); m * n];
        gate_qmv_silu_mul(&x, gate.matrix(), up.matrix(), &mut out, m, n, k).unwrap();
        let got: Vec<f32> = out.iter().map(|v| v.to_f32()).collect();
        let want: Vec<f32> = (0..m * n)
            .map(|i| reference(&x[(i / n) * k..][..k], &gate, &up, 0, i % n, n, k))
            .collect();
        assert_close(
            &got,
            &want,
            tol_eps::<T>(),
            &format!("m={m} n={n} k={k} bits={bits} g={group}"),
        );
    }

    /// f32 x with half scales equals f32 x with those scales widened
    /// (exactly), bit for bit, in both forms.
    fn mixed_case<P: Element>(rng: &mut Rng, m: usize, n: usize, k: usize, bits: u32) {
        let widen = |o: &Owned<P>| Owned::<f32> {
            w: o.w.clone(),
            scales: o.scales.iter().map(|v| v.to_f32()).collect(),
            biases: o.biases.iter().map(|v| v.to_f32()).collect(),
            bits,
            group_size: o.group_size,
        };
        let x: Vec<f32> = rng.elems(m * k, 1.0);
        let (gate, up) = (
            Owned::<P>::random(rng, 1, n, k, bits, 32),
            Owned::<P>::random(rng, 1, n, k, bits, 32),
        );
        let (gate32, up32) = (widen(&gate), widen(&up));
        let mut got = vec![f32::NAN; m * n];
        let mut want = vec![f32::NAN; m * n];
        gate_qmv_silu_mul(&x, gate.matrix(), up.matrix(), &mut got, m, n, k).unwrap();
        gate_qmv_silu_mul(&x, gate32.matrix(), up32.matrix(), &mut want, m, n, k).unwrap();
        assert_eq!(got, want);

        let mats = 3;
        let (gate, up) = (
            Owned::<P>::random(rng, mats, n, k, bits, 32),
            Owned::<P>::random(rng, mats, n, k, bits, 32),
        );
        let (gate32, up32) = (widen(&gate), widen(&up));
        let experts: Vec<u32> = (0..m as u32).map(|i| (i * 2 + 1) % mats as u32).collect();
        let rows: Vec<u32> = (0..m as u32).collect();
        let (g, u) = (gate.experts(mats), up.experts(mats));
        gather_gate_qmv_silu_mul(&x, &rows, &experts, g, u, &mut got, n, k).unwrap();
        let (g, u) = (gate32.experts(mats), up32.experts(mats));
        gather_gate_qmv_silu_mul(&x, &rows, &experts, g, u, &mut want, n, k).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn f32_x_with_half_scales() {
        let mut rng = Rng::new(0x32);
        for (m, bits) in [(1, 4), (4, 8), (1, 8), (3, 4)] {
            mixed_case::<f16>(&mut rng, m, 37, 96, bits);
            mixed_case::<bf16>(&mut rng, m, 37, 256, bits);
        }
    }

    fn dense_all<T: Element>() {
        let mut rng = Rng::new(0x9a7e_0001);
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                for m in [1, 5] {
                    dense_case::<T>(&mut rng, m, 37, 256, bits, group);
                }
            }
            // k = 96 leaves a short final block for 4-bit, group 32.
            dense_case::<T>(&mut rng, 1, 19, 96, bits, 32);
            dense_case::<T>(&mut rng, 3, 19, 96, bits, 32);
        }
        // Large enough to split over the CPU team, both branches.
        dense_case::<T>(&mut rng, 1, 1100, 1024, 4, 64);
        dense_case::<T>(&mut rng, 5, 300, 1024, 8, 128);
    }

    #[test]
    fn dense_f32() {
        dense_all::<f32>();
    }

    #[test]
    fn dense_f16() {
        dense_all::<f16>();
    }

    #[test]
    fn dense_bf16() {
        dense_all::<bf16>();
    }

    #[test]
    fn scalar_and_simd_paths_agree() {
        let mut rng = Rng::new(77);
        for (bits, group, k) in [(4, 32, 96), (4, 64, 256), (8, 128, 256)] {
            let lay = shared_layout(bits, group, bits, group, 1, k).unwrap();
            let g = Owned::<f32>::random(&mut rng, 1, 1, k, bits, group);
            let u = Owned::<f32>::random(&mut rng, 1, 1, k, bits, group);
            let x: Vec<f32> = rng.elems(k, 1.0);
            let px = PreparedX::with_lanes(std::iter::once(&x[..]), &lay, 8, false);
            let gv = QView::new("g", &g.w, &g.scales, &g.biases, lay, 1).unwrap();
            let uv = QView::new("u", &u.w, &u.scales, &u.biases, lay, 1).unwrap();
            let (gr, ur) = (gv.row(0), uv.row(0));
            let fast = qdot2(
                &gr,
                &ur,
                &px.perm,
                &px.group_sums,
                &lay,
                isa::has_avx2_f16c(),
            );
            let slow = qdot2(&gr, &ur, &px.perm, &px.group_sums, &lay, false);
            assert!(
                (fast.0 - slow.0).abs() < 1e-4 && (fast.1 - slow.1).abs() < 1e-4,
                "{fast:?} vs {slow:?}"
            );
            let (mut a, mut b) = (vec![0.0; k], vec![0.0; k]);
            dequant(&gr, &lay, &mut a, isa::has_avx2_f16c());
            dequant(&gr, &lay, &mut b, false);
            assert!(a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-6));
        }
    }

    fn gather_case<T: Element>(rng: &mut Rng, bits: u32, group: usize) {
        let (e_count, n, k, x_rows) = (4, 29, 128, 3);
        let gate = Owned::<T>::random(rng, e_count, n, k, bits, group);
        let up = Owned::<T>::random(rng, e_count, n, k, bits, group);
        let x: Vec<T> = rng.elems(x_rows * k, 1.0);
        let x_row_for = [0u32, 0, 1, 2, 2, 1, 0];
        let experts = [3u32, 1, 1, 0, 3, 2, 1];
        let mut out = vec![T::from_f32(f32::NAN); experts.len() * n];
        gather_gate_qmv_silu_mul(
            &x,
            &x_row_for,
            &experts,
            gate.experts(e_count),
            up.experts(e_count),
            &mut out,
            n,
            k,
        )
        .unwrap();
        let got: Vec<f32> = out.iter().map(|v| v.to_f32()).collect();
        let want: Vec<f32> = (0..got.len())
            .map(|i| {
                let (r, c) = (i / n, i % n);
                let xr = &x[x_row_for[r] as usize * k..][..k];
                reference(xr, &gate, &up, experts[r] as usize, c, n, k)
            })
            .collect();
        assert_close(
            &got,
            &want,
            tol_eps::<T>(),
            &format!("gather bits={bits} g={group}"),
        );
    }

    #[test]
    fn gather_matches_reference() {
        let mut rng = Rng::new(0x6a7e);
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                gather_case::<f32>(&mut rng, bits, group);
                gather_case::<bf16>(&mut rng, bits, group);
                gather_case::<f16>(&mut rng, bits, group);
            }
        }
    }

    #[test]
    fn gather_rejects_bad_indices() {
        let mut rng = Rng::new(5);
        let (e_count, n, k) = (2, 8, 64);
        let gate = Owned::<f32>::random(&mut rng, e_count, n, k, 4, 32);
        let up = Owned::<f32>::random(&mut rng, e_count, n, k, 4, 32);
        let x: Vec<f32> = rng.elems(2 * k, 1.0);
        let mut out = vec![0.0f32; 2 * n];
        let run = |xr: &[u32], ex: &[u32], out: &mut [f32]| {
            gather_gate_qmv_silu_mul(
                &x,
                xr,
                ex,
                gate.experts(e_count),
                up.experts(e_count),
                out,
                n,
                k,
            )
        };
        assert!(run(&[0, 1], &[1, 0], &mut out).is_ok());
        assert!(matches!(
            run(&[0, 1], &[1, 2], &mut out),
            Err(KernelError::IndexOutOfRange(_))
        ));
        assert!(matches!(
            run(&[0, 2], &[1, 0], &mut out),
            Err(KernelError::IndexOutOfRange(_))
        ));
        assert!(run(&[0], &[1, 0], &mut out).is_err());
        assert!(run(&[0, 1], &[1, 0], &mut out[1..]).is_err());
        let short = QuantExperts {
            w: &gate.w[1..],
            ..gate.experts(e_count)
        };
        assert!(gather_gate_qmv_silu_mul(
            &x,
            &[0],
            &[0],
            short,
            up.experts(e_count),
            &mut out[..n],
            n,
            k
        )
        .is_err());
        let too_many = gate.experts(e_count + 1);
        assert!(gather_gate_qmv_silu_mul(
            &x,
            &[0],
            &[0],
            too_many,
            up.experts(e_count),
            &mut out[..n],
            n,
            k
        )
        .is_err());
    }

    #[test]
    fn dense_rejects_bad_arguments() {
        let mut rng = Rng::new(9);
        let (n, k) = (4, 128);
        let q = Owned::<f32>::random(&mut rng, 1, n, k, 4, 64);
        let x: Vec<f32> = rng.elems(k, 1.0);
        let mut out = vec![0.0f32; n];
        assert!(gate_qmv_silu_mul(&x, q.matrix(), q.matrix(), &mut out, 1, n, k).is_ok());
        assert!(gate_qmv_silu_mul(&x[1..], q.matrix(), q.matrix(), &mut out, 1, n, k).is_err());
        assert!(gate_qmv_silu_mul(&x, q.matrix(), q.matrix(), &mut out[1..], 1, n, k).is_err());
        let bad_bits = QuantMatrix {
            bits: 3,
            ..q.matrix()
        };
        assert!(matches!(
            gate_qmv_silu_mul(&x, bad_bits, bad_bits, &mut out, 1, n, k),
            Err(KernelError::Unsupported(_))
        ));
        let bad_group = QuantMatrix {
            group_size: 48,
            ..q.matrix()
        };
        assert!(gate_qmv_silu_mul(&x, bad_group, bad_group, &mut out, 1, n, k).is_err());
        let mixed = QuantMatrix {
            group_size: 32,
            scales: &q.scales,
            ..q.matrix()
        };
        assert!(gate_qmv_silu_mul(&x, q.matrix(), mixed, &mut out, 1, n, k).is_err());
        let short_scales = QuantMatrix {
            scales: &q.scales[1..],
            ..q.matrix()
        };
        assert!(gate_qmv_silu_mul(&x, short_scales, q.matrix(), &mut out, 1, n, k).is_err());
        // k not a multiple of the group size.
        assert!(gate_qmv_silu_mul(&x[..96], q.matrix(), q.matrix(), &mut out, 1, n, 96).is_err());
    }
}
