//! Vector helpers shared by the quantized bodies: packed fields to int16
//! or f32 lanes, group parameters to lanes, and the dot-product
//! instructions written as inline assembly.

/// AVX-512 helpers (the blocked, `row_lanes` and AMX bodies).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use crate::kernels::cpu::simd::Element;
    use std::arch::x86_64::*;

    /// `acc + a · b` over bf16 pairs into f32 (`vdpbf16ps`), written out as
    /// `dpwssd` is.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(crate) fn dpbf16(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        let mut acc = acc;
        // SAFETY: register operands only; the features are enabled here.
        unsafe {
            std::arch::asm!(
                "vdpbf16ps {acc}, {a}, {b}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }

    /// Field `p` of each 16-bit half of packed `BITS`-bit words as int16
    /// lanes (values `p` and `p + 16 / BITS` of each 32-bit word: the
    /// int16 pairs `vpdpwssd` takes). The top field of a half needs no
    /// mask: a 16-bit shift leaves nothing above it, one instruction where
    /// the middle fields take a shift and a mask (LLVM does not find this
    /// for 4-bit words: one of seven unpack instructions per word).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn int16_field<const BITS: u32>(w: __m512i, p: usize) -> __m512i {
        let field = _mm512_set1_epi32(if BITS == 4 { 0x000F_000F } else { 0x00FF_00FF });
        match (BITS, p) {
            (4, 3) => _mm512_srli_epi16::<12>(w),
            (8, 1) => _mm512_srli_epi16::<8>(w),
            (_, 0) => _mm512_and_si512(w, field),
            _ => _mm512_and_si512(
                _mm512_srlv_epi32(w, _mm512_set1_epi32((BITS as usize * p) as i32)),
                field,
            ),
        }
    }

    /// `acc + a · b` by int16 pairs (`vpdpwssd`), written out: LLVM turns
    /// the intrinsic into `vpmaddwd` + `vpaddd` for the generic x86-64
    /// target, twice the instructions in the kernels' inner loops.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(crate) fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        let mut acc = acc;
        // SAFETY: register operands only; the features are enabled here.
        unsafe {
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, {b}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }

    /// [`dpwssd`] with `b` one i32 pair broadcast from `pair` (a
    /// `{1to16}` memory operand).
    ///
    /// # Safety
    /// `pair` must point at a readable i32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(crate) unsafe fn dpwssd_bcst(acc: __m512i, a: __m512i, pair: *const i32) -> __m512i {
        let mut acc = acc;
        // SAFETY: the caller's pointer is readable.
        unsafe {
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, dword ptr [{p}]{{1to16}}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                p = in(reg) pair,
                options(pure, readonly, nostack, preserves_flags)
            );
        }
        acc
    }

    /// `0.0..=15.0`, the table [`unpack`] reads 4-bit values through.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn nibble_values() -> __m512 {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }

    /// Lane j's group within a block of 16 words, for groups of
    /// `2^log2` words (the index [`lane_params`] permutes by).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn lane_groups(log2: u32) -> __m512i {
        _mm512_srlv_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(log2 as i32),
        )
    }

    /// Value `v` of each of the 16 words, as f32 (`table`: [`nibble_values`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(crate) fn unpack<const BITS: u32>(w: __m512i, v: usize, table: __m512) -> __m512 {
        if BITS == 4 {
            let shifted = _mm512_srlv_epi32(w, _mm512_set1_epi32(4 * v as i32));
            // vpermps reads the low four bits of each index: no mask needed.
            _mm512_permutexvar_ps(shifted, table)
        } else {
            // Byte v of each word to byte 0, the other bytes zeroed (index -1).
            let v = v as i32;
            let pick = (-256i32) | v;
            let idx = _mm512_set4_epi32(pick + 12, pick + 8, pick + 4, pick);
            _mm512_cvtepi32_ps(_mm512_shuffle_epi8(w, idx))
        }
    }

    /// Up to 16 parameters (scales or biases, in their own dtype) from `src`
    /// as f32; lanes outside `mask` read nothing and are zero.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(crate) unsafe fn load_params<P: Element>(src: *const P, mask: __mmask16) -> __m512 {
        use std::any::TypeId;
        // SAFETY (all): the caller's mask keeps the loads inside `src`'s slice.
        if TypeId::of::<P>() == TypeId::of::<f32>() {
            unsafe { _mm512_maskz_loadu_ps(mask, src.cast()) }
        } else {
            let halves = unsafe { _mm256_maskz_loadu_epi16(mask, src.cast()) };
            if TypeId::of::<P>() == TypeId::of::<half::f16>() {
                _mm512_cvtph_ps(halves)
            } else {
                // bf16: the upper half of an f32.
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
            }
        }
    }

    /// 16 lanes of per-group parameters from `src[g0..g0 + groups]`, lane j
    /// taking its word's group.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(crate) unsafe fn lane_params<P: Element>(
        src: &[P],
        g0: usize,
        gmask: __mmask16,
        lane_group: __m512i,
    ) -> __m512 {
        // SAFETY: the caller's mask keeps the load inside `src`.
        let v = unsafe { load_params(src.as_ptr().add(g0), gmask) };
        _mm512_permutexvar_ps(lane_group, v)
    }
}

/// AVX2 helpers (the blocked and `row_lanes` bodies).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// Field `p` of each 16-bit half of packed `BITS`-bit words as int16
    /// lanes, as `avx512::int16_field` (the top field of a half by one
    /// 16-bit shift, no mask).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn int16_field<const BITS: u32>(w: __m256i, p: usize) -> __m256i {
        let field = _mm256_set1_epi32(if BITS == 4 { 0x000F_000F } else { 0x00FF_00FF });
        match (BITS, p) {
            (4, 3) => _mm256_srli_epi16::<12>(w),
            (8, 1) => _mm256_srli_epi16::<8>(w),
            (_, 0) => _mm256_and_si256(w, field),
            _ => _mm256_and_si256(
                _mm256_srlv_epi32(w, _mm256_set1_epi32((BITS as usize * p) as i32)),
                field,
            ),
        }
    }
}
