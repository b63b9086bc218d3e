//! Quantized dot products of [`MIN_ROWS`] or more x rows on Intel AMX (Sapphire /
//! Emerald / Granite Rapids): `tdpbf16ps` multiplies 16 weight rows by 16
//! x columns over 32 values in one instruction (8192 multiply-adds; the
//! AVX-512 kernel does 32 per instruction).
//!
//! Exactness comes from what bf16 holds exactly:
//! - W's quantized values (0..=15 or 0..=255) are small integers, exact in
//!   bf16; W's scales and biases stay f32 and are applied per group after
//!   the tile product (`Σ_g s·(x·q) + b·Σx`, as the AVX-512 kernel does).
//! - x is split into `hi = bf16(x)` and `lo = bf16(x − hi)`, carried as two
//!   x columns: each value is off by at most `2⁻¹⁸·|x|`, inside the int16
//!   rounding bound (`max|x over the word| / 65534`), so this serves
//!   `ActivationPrecision::Int16`. Products of bf16 values are exact in the
//!   tiles' f32 accumulators.
//!
//! Layout: an A tile is 16 weight rows × one 32-value chunk of K, unpacked
//! to bf16 per call (a 4-bit chunk in the order its bytes hold it: the low
//! nibbles, then the high ones); a B tile is the matching chunk of up to 8 x
//! rows, `hi` in columns 0..8 and `lo` in 8..16, in pairs of values as
//! `tdpbf16ps` reads them ([`AmxX`], built once per call). C tiles go
//! through memory to the AVX-512 epilogue, two of them alternating so the
//! next group's tile product overlaps this group's epilogue.

use std::ops::Range;
use std::sync::OnceLock;

use super::layout::OutStrides;
use super::layout::{Layout, QView};
use super::simd::Element;

/// x rows per B tile (hi and lo fill its 16 columns).
pub(crate) const X_ROWS: usize = 8;
/// Weight rows per A tile.
const W_ROWS: usize = 16;
/// Values of K per tile product.
const CHUNK: usize = 32;
/// Fewest x rows worth the tiles. The grouped form costs about the same
/// for 1 to 8 rows (its B tile has 8 rows' columns), the AVX-512 kernel
/// grows with the rows: at 4 rows the tiles took 1.2–2× its time, at 8
/// rows 0.7–0.95× (`dot_rows` in `benches/cpu_kernels.rs`).
pub(crate) const MIN_ROWS: usize = 8;

/// True when AMX-BF16 may run: the CPU has it (and AVX-512 BF16 for the
/// conversions), the OS saves tile state, this process was granted it,
/// and `MLX_BACKEND_AMX` is not `0`/`off`.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let off = super::isa::switched_off("MLX_BACKEND_AMX");
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        return !off && x86::detect_and_request();
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        return false;
    })
}

/// How W meets the tiles.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Form {
    /// W's integers in A, scales and biases applied per group after each
    /// group's tile product: the least W work, for few x rows.
    Grouped,
    /// W dequantized to f32 and split into bf16 `hi` + `lo` A tiles: two
    /// tile products per chunk and none of the per-group passes, for many
    /// x rows (the dequantization is shared by all of them).
    Dequantized,
}

/// x rows from which [`Form::Dequantized`] pays (`dot_rows` in `benches/cpu_kernels.rs`: at
/// 16 rows it ran at the AVX-512 kernel's speed against 1.8× for the
/// grouped form; at 128 and 256 rows 3.0× and 2.7× against 2.3× and 1.5×;
/// the two met at 64).
pub(crate) const DEQUANT_MIN_ROWS: usize = 64;

/// x rows as B tiles: per chunk of [`X_ROWS`] rows and 32-slot chunk of K,
/// 16 rows of value pairs × 16 columns (bf16 pairs as u32), plus per group
/// the rows' sums of x in the `hi` lanes (the biases' term, grouped form).
pub(crate) struct AmxX {
    tiles: Vec<Tile>,
    /// `[x chunk][group][16]`: Σx over the group for lanes 0..8, 0 above.
    group_sums: Vec<[f32; 16]>,
    rows: usize,
    k_chunks: usize,
    groups: usize,
    bits: u32,
    form: Form,
}

/// One 1 KiB tile image, 16 rows of 64 bytes, aligned for the tile loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Tile([[u32; 16]; 16]);

/// A C tile's image in f32, aligned for the epilogue's loads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CTile([[f32; 16]; 16]);

/// `n` zeroed tiles from the zeroing allocator (`vec![tile; n]` would copy
/// a tile per element: a tenth of x's preparation).
fn zeroed_tiles(n: usize) -> Vec<Tile> {
    if n == 0 {
        return Vec::new();
    }
    let layout = std::alloc::Layout::array::<Tile>(n).expect("tile count");
    // SAFETY: a non-zero-sized layout; all-zero bits are a valid Tile; the
    // Vec takes the allocation with that layout's size and alignment.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<Tile>();
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(ptr, n, n)
    }
}

impl AmxX {
    /// `x` row-major `[rows, lay.k]` in f32; `group_sums` `[rows, groups]`.
    ///
    /// # Panics
    /// Without [`available`], or when the lengths disagree with `lay`.
    pub(crate) fn new(x: &[f32], rows: usize, group_sums: &[f32], lay: &Layout) -> Self {
        assert!(available(), "AMX tiles need AMX-BF16");
        let (k, groups) = (lay.k, lay.groups_per_row);
        assert_eq!(x.len(), rows * k);
        assert_eq!(group_sums.len(), rows * groups);
        let form = if rows >= DEQUANT_MIN_ROWS {
            Form::Dequantized
        } else {
            Form::Grouped
        };
        let slots = slots(lay, form);
        let k_chunks = chunk_count(lay, form);
        debug_assert_eq!(slots.len(), k_chunks * CHUNK);
        let chunks = rows.div_ceil(X_ROWS);
        let mut tiles = zeroed_tiles(chunks * k_chunks);
        let mut sums = vec![[0.0f32; 16]; chunks * groups];
        for r in 0..rows {
            let (c, col) = (r / X_ROWS, r % X_ROWS);
            let row = &x[r * k..][..k];
            for (t, chunk_slots) in slots.chunks_exact(CHUNK).enumerate() {
                let tile = &mut tiles[c * k_chunks + t];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `available` checked the CPU; every slot indexes the row.
                unsafe {
                    x86::split_chunk(row, chunk_slots, tile, col)
                };
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("{tile:p} {col} {chunk_slots:?} {row:?}");
            }
            if form == Form::Grouped {
                for g in 0..groups {
                    sums[c * groups + g][col] = group_sums[r * groups + g];
                }
            }
        }
        AmxX {
            tiles,
            group_sums: sums,
            rows,
            k_chunks,
            groups,
            bits: lay.bits,
            form,
        }
    }
}

impl AmxX {
    /// True in [`Form::Dequantized`] (each call dequantizes all of W).
    pub(crate) fn dequantized(&self) -> bool {
        self.form == Form::Dequantized
    }
}

/// The 32-slot chunks of K in `form` (the length of [`slots`] / 32).
fn chunk_count(lay: &Layout, form: Form) -> usize {
    match form {
        Form::Grouped => lay.k / CHUNK,
        Form::Dequantized => lay.words_per_row.div_ceil(16) * (lay.vals_per_word / 2),
    }
}

/// For each 32-slot chunk of K as the A tiles hold it, the position in K of
/// each slot (-1: no value, zero in both A and B). B's pair `r` holds slots
/// `2r` and `2r + 1`.
///
/// - Grouped: chunk `t` is K's values `32t..32t + 32`; a 4-bit chunk in the
///   order its bytes hold it, the low nibbles (even positions), then the
///   high ones (odd positions).
/// - Dequantized: blocks of 16 words as the AVX-512 kernel reads them;
///   chunk `(block, p)` holds value `2p` of the block's 16 words, then value
///   `2p + 1` (a short last block leaves its missing words' slots empty).
fn slots(lay: &Layout, form: Form) -> Vec<i32> {
    let vpw = lay.vals_per_word;
    match form {
        Form::Grouped => (0..lay.k / CHUNK)
            .flat_map(|t| {
                (0..CHUNK).map(move |j| {
                    let at = match (vpw, j) {
                        (8, 0..16) => 2 * j,
                        (8, _) => 2 * (j - 16) + 1,
                        _ => j,
                    };
                    (t * CHUNK + at) as i32
                })
            })
            .collect(),
        Form::Dequantized => {
            let words = lay.words_per_row;
            (0..words.div_ceil(16))
                .flat_map(|b| (0..vpw / 2).map(move |p| (b, p)))
                .flat_map(|(b, p)| {
                    (0..CHUNK).map(move |j| {
                        let (word, v) = (16 * b + j % 16, 2 * p + j / 16);
                        if word < words {
                            (word * vpw + v) as i32
                        } else {
                            -1
                        }
                    })
                })
                .collect()
        }
    }
}

/// `Σ_k x[i][k] · W[r][k]` (scales and biases applied) for x rows `xrows` of
/// `ax` and weight rows `rows`: [`super::dispatch::dot_rows`]'s body for x on
/// the tiles, called by it once it has bounded the ranges and `out`
/// (non-empty).
///
/// # Panics
/// When `ax` was built for another layout.
pub(super) fn dot_rows<P: Element>(
    ax: &AmxX,
    xrows: Range<usize>,
    w: &QView<P>,
    rows: Range<usize>,
    out: &mut [f32],
    strides: OutStrides,
) {
    let lay = &w.lay;
    assert!(available());
    assert_eq!(ax.bits, lay.bits);
    assert_eq!(ax.groups, lay.groups_per_row);
    assert_eq!(ax.k_chunks, chunk_count(lay, ax.form));
    assert!(xrows.end <= ax.rows);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX was detected and granted; these asserts and the caller's
    // bound every access.
    unsafe {
        match ax.form {
            Form::Grouped => x86::drive(ax, xrows, w, rows, out, strides),
            Form::Dequantized => x86::drive_dequantized(ax, xrows, w, rows, out, strides),
        }
    };
}

/// x chunk `c`'s results from its C image (`[W row][hi 0..8 | lo 8..16]`)
/// into `out` as `dot_rows` writes it: hi + lo for the chunk's rows inside
/// `xrows` and the image's first `count` weight rows, output column `col0` on.
fn store_chunk(
    img: &CTile,
    c: usize,
    count: usize,
    xrows: &Range<usize>,
    col0: usize,
    out: &mut [f32],
    st: OutStrides,
) {
    let first = (c * X_ROWS).max(xrows.start);
    let end = ((c + 1) * X_ROWS).min(xrows.end);
    for i in first..end {
        let m = i - c * X_ROWS;
        let base = (i - xrows.start) * st.x_stride + col0 * st.w_stride;
        for (n, row) in img.0.iter().enumerate().take(count) {
            out[base + n * st.w_stride] = row[m] + row[m + X_ROWS];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::kernels::cpu::unpack::avx512::{
        lane_groups, lane_params, load_params, nibble_values, unpack,
    };
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// CPUID, the OS's tile-state support (XCR0) and the Linux permission
    /// request (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`).
    #[cfg(target_os = "linux")]
    pub(super) fn detect_and_request() -> bool {
        let cpu = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
            && is_x86_feature_detected!("xsave");
        if !cpu {
            return false;
        }
        // CPUID leaf 7 exists on every CPU with AVX-512.
        let edx = __cpuid_count(7, 0).edx;
        let (amx_bf16, amx_tile) = (edx >> 22 & 1 == 1, edx >> 24 & 1 == 1);
        // SAFETY: XSAVE was detected, so XGETBV reads XCR0.
        let xcr0 = unsafe { xcr0() };
        let os_tiles = xcr0 >> 17 & 3 == 3;
        if !(amx_bf16 && amx_tile && os_tiles) {
            return false;
        }
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain syscall with integer arguments.
        let granted = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        granted == 0
    }

    #[target_feature(enable = "xsave")]
    unsafe fn xcr0() -> u64 {
        _xgetbv(0)
    }

    /// All eight tiles 16 rows of 64 bytes. Grouped form: C in 0, 1, 4, 5
    /// (rotating over groups), A in 2, B in 3. Dequantized form: C in 0, 1,
    /// 6, 7 (four x chunks), A's hi in 2 and lo in 4, B in 3 and 5.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    /// The tiles configured for this thread until dropped (`tilerelease`).
    struct TilesInUse;

    impl TilesInUse {
        /// # Safety
        /// AMX must have been detected and granted ([`super::available`]).
        unsafe fn configure() -> Self {
            let mut c = [0u8; 64];
            c[0] = 1; // palette 1
            for t in 0..8 {
                c[16 + 2 * t] = 64; // bytes per row (u16, little-endian)
                c[48 + t] = 16; // rows
            }
            let cfg = Config(c);
            // SAFETY: the caller guarantees AMX; the configuration is well-formed.
            unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
            TilesInUse
        }
    }

    impl Drop for TilesInUse {
        fn drop(&mut self) {
            // SAFETY: the tiles were configured by `configure`.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }

    const STRIDE: usize = 64;

    /// C tile images in flight: a group's epilogue reads its image this many
    /// tile products after storing it.
    const DEPTH: usize = 3;
    const C_TILES: usize = 4;

    #[inline(always)]
    unsafe fn load_a(p: *const Tile) {
        unsafe {
            asm!("tileloadd tmm2, [{p} + {s}*1]", p = in(reg) p, s = in(reg) STRIDE, options(nostack, readonly))
        };
    }

    #[inline(always)]
    unsafe fn load_b(p: *const Tile) {
        unsafe {
            asm!("tileloadd tmm3, [{p} + {s}*1]", p = in(reg) p, s = in(reg) STRIDE, options(nostack, readonly))
        };
    }

    /// Zeroes C tile `c`, adds the products of the `count` (A, B) tile
    /// pairs at `a` and `b`, stores it to `dst`.
    #[inline(always)]
    unsafe fn group_product(
        c: usize,
        a: *const Tile,
        b: *const Tile,
        count: usize,
        dst: *mut [[f32; 16]; 16],
    ) {
        macro_rules! on_tile {
            ($t:literal) => {{
                asm!(concat!("tilezero tmm", $t), options(nostack, nomem));
                for t in 0..count {
                    load_a(a.add(t));
                    load_b(b.add(t));
                    asm!(concat!("tdpbf16ps tmm", $t, ", tmm2, tmm3"), options(nostack, nomem));
                }
                asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) dst, s = in(reg) STRIDE, options(nostack));
            }};
        }
        // SAFETY (all): the tiles are configured; the pointers are 1 KiB images.
        unsafe {
            match c % C_TILES {
                0 => on_tile!(0),
                1 => on_tile!(1),
                2 => on_tile!(4),
                _ => on_tile!(5),
            }
        }
    }

    /// One x row's 32-slot chunk (positions `slots` of `x`, -1 for none)
    /// into column `col` (hi) and `col + 8` (lo) of a B tile.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn split_chunk(x: &[f32], slots: &[i32], tile: &mut Tile, col: usize) {
        debug_assert_eq!(slots.len(), CHUNK);
        debug_assert!(slots.iter().all(|&s| s < x.len() as i32));
        let gather = |half: usize| {
            // SAFETY: 16 slot indices; each valid one indexes x.
            unsafe {
                let idx = _mm512_loadu_si512(slots.as_ptr().add(16 * half).cast());
                let valid = _mm512_cmpge_epi32_mask(idx, _mm512_setzero_si512());
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), valid, idx, x.as_ptr().cast())
            }
        };
        let (a, b) = (gather(0), gather(1));
        let hi: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(b, a));
        let (hi_a, hi_b) = (
            widen(_mm512_castsi512_si256(hi)),
            widen(_mm512_extracti64x4_epi64::<1>(hi)),
        );
        let lo: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(
            _mm512_sub_ps(b, hi_b),
            _mm512_sub_ps(a, hi_a),
        ));
        let rows = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(16),
        );
        let base = tile.0.as_mut_ptr().cast::<u32>();
        for (pairs, c) in [(hi, col), (lo, col + X_ROWS)] {
            // SAFETY: row r, column c of the 16×16 tile (dword r of `pairs`
            // is slots 2r and 2r + 1).
            unsafe { _mm512_i32scatter_epi32::<4>(base.add(c).cast(), rows, pairs) };
        }
    }

    /// 16 bf16 values back to f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn widen(h: __m256i) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }

    /// Scales or biases (f32, f16 or bf16) to f32, 16 at a time.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn params_f32<P: Element>(src: &[P], dst: &mut [f32]) {
        debug_assert_eq!(src.len(), dst.len());
        for i in (0..src.len()).step_by(16) {
            let left = src.len() - i;
            let mask: __mmask16 = if left >= 16 { 0xffff } else { (1 << left) - 1 };
            // SAFETY: the mask keeps both accesses inside the slices.
            unsafe {
                let v = load_params(src.as_ptr().add(i), mask);
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), mask, v);
            }
        }
    }

    /// bf16 of 0..=15 for index bits 0..4 (the low nibble and one more bit).
    fn nibble_table() -> [u16; 32] {
        std::array::from_fn(|i| ((i & 15) as f32).to_bits().wrapping_shr(16) as u16)
    }

    /// Weight rows `r0..r0 + count` (count ≤ 16) as A tiles, one per chunk of
    /// K, and their scales and biases in f32 (`[16][groups]`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn unpack_rows<P: Element>(
        w: &QView<P>,
        r0: usize,
        count: usize,
        a: &mut [Tile],
        scales: &mut [f32],
        biases: &mut [f32],
    ) {
        let lay = &w.lay;
        let (k_chunks, groups) = (lay.k / CHUNK, lay.groups_per_row);
        let table = nibble_table();
        let table = unsafe { _mm512_loadu_si512(table.as_ptr().cast()) };
        for n in 0..count {
            let row = w.row(r0 + n);
            unsafe {
                params_f32(row.scales, &mut scales[n * groups..][..groups]);
                params_f32(row.biases, &mut biases[n * groups..][..groups]);
            }
            let bytes = row.w.as_ptr().cast::<u8>();
            // The rows stream from memory: ask for a few rows ahead (a hint,
            // never a fault, even past the end).
            let row_bytes = lay.k * lay.bits as usize / 8;
            for line in (0..row_bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(bytes.wrapping_add(4 * row_bytes + line).cast());
            }
            let base = a.as_mut_ptr();
            let dst = |t: usize| unsafe { (*base.add(t)).0[n].as_mut_ptr().cast::<__m512i>() };
            // SAFETY (loads and stores below): the row holds k·bits/8 bytes;
            // chunk t of 32 values is bytes [t·32·bits/8, (t+1)·32·bits/8).
            unsafe {
                if lay.bits == 4 {
                    let mut t = 0;
                    while t + 2 <= k_chunks {
                        let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(bytes.add(16 * t).cast()));
                        let lo = _mm512_permutexvar_epi16(v, table);
                        let hi = _mm512_permutexvar_epi16(_mm512_srli_epi16::<4>(v), table);
                        _mm512_store_si512(dst(t), _mm512_shuffle_i64x2::<0b01_00_01_00>(lo, hi));
                        _mm512_store_si512(
                            dst(t + 1),
                            _mm512_shuffle_i64x2::<0b11_10_11_10>(lo, hi),
                        );
                        t += 2;
                    }
                    if t < k_chunks {
                        let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(bytes.add(16 * t).cast()));
                        let lo = _mm512_permutexvar_epi16(_mm512_castsi256_si512(v), table);
                        let hi = _mm512_permutexvar_epi16(
                            _mm512_castsi256_si512(_mm256_srli_epi16::<4>(v)),
                            table,
                        );
                        let row = _mm512_inserti64x4::<1>(lo, _mm512_castsi512_si256(hi));
                        _mm512_store_si512(dst(t), row);
                    }
                } else {
                    for t in 0..k_chunks {
                        let at = bytes.add(32 * t);
                        let fa =
                            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(at.cast())));
                        let fb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                            at.add(16).cast(),
                        )));
                        let row: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(fb, fa));
                        _mm512_store_si512(dst(t), row);
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn drive<P: Element>(
        ax: &AmxX,
        xrows: Range<usize>,
        w: &QView<P>,
        rows: Range<usize>,
        out: &mut [f32],
        st: OutStrides,
    ) {
        let lay = &w.lay;
        let (k_chunks, groups) = (ax.k_chunks, ax.groups);
        let per_group = lay.group_size / CHUNK;
        let mut a = zeroed_tiles(k_chunks);
        let mut scales = vec![0.0f32; W_ROWS * groups];
        let mut biases = vec![0.0f32; W_ROWS * groups];
        let mut c_buf = [CTile([[0.0; 16]; 16]); DEPTH];
        let mut total = CTile([[0.0; 16]; W_ROWS]);
        // SAFETY: the caller checked `available`.
        let _tiles = unsafe { TilesInUse::configure() };
        let mut r0 = rows.start;
        while r0 < rows.end {
            let count = (rows.end - r0).min(W_ROWS);
            unsafe { unpack_rows(w, r0, count, &mut a, &mut scales, &mut biases) };
            for c in xrows.start / X_ROWS..xrows.end.div_ceil(X_ROWS) {
                let b = &ax.tiles[c * k_chunks..][..k_chunks];
                let sums = &ax.group_sums[c * groups..][..groups];
                let (a_at, b_at) = (a.as_ptr(), b.as_ptr());
                let mut acc = [_mm512_setzero_ps(); W_ROWS];
                let images = c_buf.as_mut_ptr();
                let product = |g: usize| {
                    let t = g * per_group;
                    // SAFETY: g % DEPTH indexes c_buf; nothing else holds that image now.
                    unsafe {
                        let dst = &mut (*images.add(g % DEPTH)).0;
                        group_product(g, a_at.add(t), b_at.add(t), per_group, dst)
                    };
                };
                for g in 0..(DEPTH - 1).min(groups) {
                    product(g);
                }
                for g in 0..groups {
                    if g + DEPTH - 1 < groups {
                        product(g + DEPTH - 1);
                    }
                    let cb = unsafe { &(*images.add(g % DEPTH)).0 };
                    let gs = unsafe { _mm512_loadu_ps(sums[g].as_ptr()) };
                    for n in 0..W_ROWS {
                        let cv = unsafe { _mm512_load_ps(cb[n].as_ptr()) };
                        let s = _mm512_set1_ps(scales[n * groups + g]);
                        let bias = _mm512_set1_ps(biases[n * groups + g]);
                        acc[n] = _mm512_fmadd_ps(cv, s, acc[n]);
                        acc[n] = _mm512_fmadd_ps(bias, gs, acc[n]);
                    }
                }
                for (row, a) in total.0.iter_mut().zip(&acc).take(count) {
                    // SAFETY: 16 floats.
                    unsafe { _mm512_storeu_ps(row.as_mut_ptr(), *a) };
                }
                store_chunk(&total, c, count, &xrows, r0 - rows.start, out, st);
            }
            r0 += count;
        }
    }

    /// Weight rows `r0..r0 + count` (count ≤ 16) dequantized (`s·q + b` in
    /// f32) and split into bf16 `hi` (the f32's upper half, exact) and
    /// `lo = bf16(w − hi)`, as A tiles in [`Form::Dequantized`]'s slots.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn dequantize_rows<P: Element>(
        w: &QView<P>,
        r0: usize,
        count: usize,
        hi: &mut [Tile],
        lo: &mut [Tile],
    ) {
        let lay = &w.lay;
        let (words, vpw, log2) = (
            lay.words_per_row,
            lay.vals_per_word,
            lay.words_per_group_log2,
        );
        let (lane_group, table) = (lane_groups(log2), nibble_values());
        let upper = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        for n in 0..count {
            let row = w.row(r0 + n);
            let at = row.w.as_ptr();
            for b0 in (0..words).step_by(16) {
                let lanes = (words - b0).min(16);
                let mask: __mmask16 = if lanes == 16 {
                    0xffff
                } else {
                    (1 << lanes) - 1
                };
                let (g0, g1) = (b0 >> log2, (b0 + lanes - 1) >> log2);
                let gmask = ((1u32 << (g1 - g0 + 1)) - 1) as __mmask16;
                // SAFETY (loads): the masks keep them inside the row.
                let (s_l, b_l) = unsafe {
                    (
                        lane_params(row.scales, g0, gmask, lane_group),
                        lane_params(row.biases, g0, gmask, lane_group),
                    )
                };
                let wv = unsafe { _mm512_maskz_loadu_epi32(mask, at.add(b0).cast()) };
                let split = |v: usize| {
                    let q = if vpw == 8 {
                        unpack::<4>(wv, v, table)
                    } else {
                        unpack::<8>(wv, v, table)
                    };
                    let x = _mm512_maskz_fmadd_ps(mask, q, s_l, b_l);
                    let h = _mm512_and_si512(_mm512_castps_si512(x), upper);
                    let h = _mm512_castsi512_ps(h);
                    (h, _mm512_sub_ps(x, h))
                };
                let block = b0 / 16;
                for p in 0..vpw / 2 {
                    let t = block * (vpw / 2) + p;
                    let ((h0, l0), (h1, l1)) = (split(2 * p), split(2 * p + 1));
                    let hv: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(h1, h0));
                    let lv: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(l1, l0));
                    // SAFETY: t < chunks = blocks · vpw / 2; row n of a tile.
                    unsafe {
                        _mm512_store_si512(
                            hi.as_mut_ptr().add(t).cast::<[u32; 16]>().add(n).cast(),
                            hv,
                        );
                        _mm512_store_si512(
                            lo.as_mut_ptr().add(t).cast::<[u32; 16]>().add(n).cast(),
                            lv,
                        );
                    }
                }
            }
        }
    }

    /// [`Form::Dequantized`]: per tile of 16 weight rows, dequantize once,
    /// then for up to four x chunks at a time accumulate `hi·x + lo·x` over
    /// all of K in four C tiles and store them once (four against two
    /// chunks: 4–10% faster at 64–256 rows, best of six alternating runs).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(super) unsafe fn drive_dequantized<P: Element>(
        ax: &AmxX,
        xrows: Range<usize>,
        w: &QView<P>,
        rows: Range<usize>,
        out: &mut [f32],
        st: OutStrides,
    ) {
        let chunks = ax.k_chunks;
        let mut hi = zeroed_tiles(chunks);
        let mut lo = zeroed_tiles(chunks);
        let mut c_img = [CTile([[0.0; 16]; 16]); 4];
        // SAFETY: the caller checked `available`.
        let _tiles = unsafe { TilesInUse::configure() };
        let (first_chunk, end_chunk) = (xrows.start / X_ROWS, xrows.end.div_ceil(X_ROWS));
        let mut r0 = rows.start;
        while r0 < rows.end {
            let count = (rows.end - r0).min(W_ROWS);
            unsafe { dequantize_rows(w, r0, count, &mut hi, &mut lo) };
            let mut c = first_chunk;
            while c < end_chunk {
                let group = (end_chunk - c).min(4);
                let b: [*const Tile; 4] =
                    std::array::from_fn(|q| ax.tiles[(c + q.min(group - 1)) * chunks..].as_ptr());
                // C tiles 0, 1, 6, 7 for the group's x chunks; A's hi in 2 and
                // lo in 4; B alternates between 3 and 5.
                macro_rules! product {
                    ($c:literal, $b:literal, $p:expr) => {
                        asm!(concat!("tileloadd tmm", $b, ", [{p} + {s}*1]"), p = in(reg) $p, s = in(reg) STRIDE, options(nostack, readonly));
                        asm!(
                            concat!("tdpbf16ps tmm", $c, ", tmm2, tmm", $b),
                            concat!("tdpbf16ps tmm", $c, ", tmm4, tmm", $b),
                            options(nostack, nomem)
                        );
                    };
                }
                // SAFETY (tile ops): configured tiles; every pointer is a 1 KiB image.
                unsafe {
                    asm!(
                        "tilezero tmm0",
                        "tilezero tmm1",
                        "tilezero tmm6",
                        "tilezero tmm7",
                        options(nostack, nomem)
                    );
                    for t in 0..chunks {
                        load_a(hi.as_ptr().add(t));
                        asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) lo.as_ptr().add(t), s = in(reg) STRIDE, options(nostack, readonly));
                        product!(0, 3, b[0].add(t));
                        if group > 1 {
                            product!(1, 5, b[1].add(t));
                        }
                        if group > 2 {
                            product!(6, 3, b[2].add(t));
                        }
                        if group > 3 {
                            product!(7, 5, b[3].add(t));
                        }
                    }
                    asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) c_img[0].0.as_mut_ptr(), s = in(reg) STRIDE, options(nostack));
                    asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) c_img[1].0.as_mut_ptr(), s = in(reg) STRIDE, options(nostack));
                    asm!("tilestored [{p} + {s}*1], tmm6", p = in(reg) c_img[2].0.as_mut_ptr(), s = in(reg) STRIDE, options(nostack));
                    asm!("tilestored [{p} + {s}*1], tmm7", p = in(reg) c_img[3].0.as_mut_ptr(), s = in(reg) STRIDE, options(nostack));
                }
                for (h, img) in c_img.iter().enumerate().take(group) {
                    store_chunk(img, c + h, count, &xrows, r0 - rows.start, out, st);
                }
                c += group;
            }
            r0 += count;
        }
    }
}
