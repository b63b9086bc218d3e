// Prefill attention (more query rows than the row-per-block decode kernel
// suits): one block per (tile of query rows, query head, batch) walks the
// key tiles up to its causal limit with an online softmax in f32, as
// FlashAttention-2 does. Two bodies:
//
// - f16/bf16 (flash_tc): tensor cores through mma.sync m16n8k16 with f32
//   accumulation. Each of the 4 warps owns 16 query rows; its scores stay in
//   registers, where the accumulator layout of q·kᵀ is already the operand
//   layout p·v needs (so p never goes through shared memory). The head is
//   padded with zeros to a multiple of 32 (kFlashDims), so any head_dim up
//   to 256 runs here. Tiles are copied to shared memory with cp.async when
//   the rows are 16-byte vectors (V's copy overlaps q·kᵀ, the next K's
//   overlaps p·v); other views are read element by element through their
//   strides.
// - f32 (flash_f32): exact f32 on the CUDA cores (TF32 tensor cores would
//   lose the f32 precision callers expect); each thread owns 4 query rows
//   by 2 keys of a 32x32 score tile and 4 rows by head_dim/16 columns of
//   the output. Key and value tiles are double-buffered: tile j + 1 is
//   copied (cp.async for dense rows) while tile j is computed on.
//
// Causal masking is lower-right aligned (row i sees keys 0..=i + S - L);
// only the key tiles that cross the diagonal or the end of the keys are
// masked element by element. For causal launches the heaviest query tiles
// (the last) are numbered first (blockIdx.z counts from the end and is the
// slowest-varying block index), so they start first and the light ones
// fill in behind them.
#pragma once

#include <cstdint>

#include "attention/cuda_args.h"
#include "common/cuda_common.cuh"
#include "common/mma.cuh"

namespace mlx_backend_cuda {

using mlx_backend::AttentionArgs;
using mlx_backend::kFlashRows;
using mlx_backend::kFlashThreads;

// Where one (batch, head)'s rows of q, k or v start, and their row and
// element strides.
template <typename T>
struct Rows {
  const T* p;
  long long row, elem;
};

// Rows first..first + ROWS - 1 of `src` (those from `valid` on, and the
// head elements from d on, as zeros) into shared memory rows of STRIDE
// elements, DP of them written. `vec`: rows are dense 16-byte vectors
// (element stride 1; pointer, row stride and d multiples of 16 bytes),
// copied with cp.async (the caller commits and waits); otherwise element
// by element.
template <typename T, int ROWS, int DP, int STRIDE>
__device__ __forceinline__ void load_tile(T* dst, const Rows<T>& src, int first, int valid, int d, bool vec) {
  if (vec) {
    constexpr int kChunks = DP * static_cast<int>(sizeof(T)) / 16;
    constexpr int kPer = 16 / sizeof(T);
    for (int c = threadIdx.x; c < ROWS * kChunks; c += kFlashThreads) {
      const int r = c / kChunks;
      const int e = (c % kChunks) * kPer;
      const bool ok = r < valid && e < d;
      const T* from = ok ? src.p + (first + r) * src.row + e : src.p;
      cp_async16(dst + r * STRIDE + e, from, ok);
    }
    return;
  }
  for (int i = threadIdx.x; i < ROWS * DP; i += kFlashThreads) {
    const int r = i / DP;
    const int e = i % DP;
    T x = from_f32<T>(0.0f);
    if (r < valid && e < d) {
      x = src.p[(first + r) * src.row + e * src.elem];
    }
    dst[r * STRIDE + e] = x;
  }
}

// The tile's geometry, the same for both bodies: which (batch, head, query
// tile) this block takes and how many keys its rows see.
struct FlashTile {
  int batch, head, kv_head, m0, rows, key_end, offset;
};

__device__ __forceinline__ FlashTile flash_tile(const AttentionArgs& a, int block_rows) {
  FlashTile t;
  t.head = blockIdx.x;
  t.batch = blockIdx.y;
  t.kv_head = t.head / (a.hq / a.hkv);
  // Causal: the last (heaviest) tiles first.
  const int tile = a.causal ? gridDim.z - 1 - blockIdx.z : blockIdx.z;
  t.m0 = tile * block_rows;
  t.rows = min(block_rows, a.l_len - t.m0);
  t.offset = a.s_len - a.l_len;
  // Row i sees keys 0..=i + offset; the tile's last row sees the most.
  t.key_end = a.causal ? min(a.s_len, t.m0 + t.rows + t.offset) : a.s_len;
  return t;
}

template <typename T>
__device__ __forceinline__ Rows<T> rows_of(const void* base, const mlx_backend::AttentionStrides& s, int batch, int head) {
  return {static_cast<const T*>(base) + batch * s.batch + head * s.head, s.row, s.elem};
}

// ---------------------------------------------------------------------------
// f16/bf16: tensor cores.

template <typename T, int DP>
__device__ void flash_tc(const AttentionArgs& a) {
  constexpr int BM = kFlashRows;
  constexpr int BN = mlx_backend::flash_tc_keys(DP);
  // 8 elements (16 bytes) of padding per row: DP / 8 + 1 is odd, so the 8
  // rows one ldmatrix reads fall in 8 different 16-byte bank groups.
  constexpr int STRIDE = DP + 8;
  extern __shared__ uint4 flash_smem[];
  T* sq = reinterpret_cast<T*>(flash_smem);
  T* sk = sq + BM * STRIDE;
  T* sv = sk + BN * STRIDE;

  const FlashTile t = flash_tile(a, BM);
  const Rows<T> q = rows_of<T>(a.q, a.qs, t.batch, t.head);
  const Rows<T> k = rows_of<T>(a.k, a.ks, t.batch, t.kv_head);
  const Rows<T> v = rows_of<T>(a.v, a.vs, t.batch, t.kv_head);
  const bool vec = a.vec;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4; // the fragment's row (and row + 8)
  const int tq = lane % 4; // the fragment's column pair
  const int n_tiles = (t.key_end + BN - 1) / BN;

  load_tile<T, BM, DP, STRIDE>(sq, q, t.m0, t.rows, a.d, vec);
  load_tile<T, BN, DP, STRIDE>(sk, k, 0, t.key_end, a.d, vec);
  cp_async_commit();

  // Scores in log2 units: exp2(s·scale·log2 e - m) is e^(s·scale - m').
  const float scale = a.scale * 1.4426950408889634f;
  float o[DP / 8][4];
#pragma unroll
  for (int i = 0; i < DP / 8; i++) {
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  }
  // Running max and (this thread's share of the) sum for rows g and g + 8.
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  const int row0 = t.m0 + warp * 16 + g;

  for (int j = 0; j < n_tiles; j++) {
    const int k0 = j * BN;
    cp_async_wait_all();
    __syncthreads(); // K tile j (and q) in place; every warp is past the last p·v
    load_tile<T, BN, DP, STRIDE>(sv, v, k0, t.key_end - k0, a.d, vec);
    cp_async_commit();

    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; i++) {
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) {
      uint32_t qa[4];
      ldmatrix_x4(qa, sq + (warp * 16 + lane % 16) * STRIDE + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int nn = 0; nn < BN / 16; nn++) {
        uint32_t kb[4];
        ldmatrix_x4(kb, sk + (nn * 16 + lane % 8 + (lane / 16) * 8) * STRIDE + kk * 16 + ((lane / 8) % 2) * 8);
        mma16816<T>(s[2 * nn], qa, kb[0], kb[1]);
        mma16816<T>(s[2 * nn + 1], qa, kb[2], kb[3]);
      }
    }

    // Mask the keys past the end or past a row's causal limit; only tiles
    // that reach past the first row's limit or the keys' end need it.
    const bool mask = k0 + BN > t.key_end || (a.causal && k0 + BN - 1 > t.m0 + t.offset);
#pragma unroll
    for (int i = 0; i < BN / 8; i++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[i][e] * scale;
        if (mask) {
          const int key = k0 + i * 8 + 2 * tq + (e & 1);
          const int row = row0 + (e >= 2 ? 8 : 0);
          if (key >= t.key_end || (a.causal && key > row + t.offset)) {
            x = -INFINITY;
          }
        }
        s[i][e] = x;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = m[r];
#pragma unroll
      for (int i = 0; i < BN / 8; i++) {
        mx = fmaxf(mx, fmaxf(s[i][2 * r], s[i][2 * r + 1]));
      }
      // The quad's four threads hold the row's columns.
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with no visible key so far keeps m = -inf; subtracting 0
      // then keeps its p at 0 instead of NaN.
      const float base = mx == -INFINITY ? 0.0f : mx;
      const float corr = exp2f(m[r] - base);
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < BN / 8; i++) {
        s[i][2 * r] = exp2f(s[i][2 * r] - base);
        s[i][2 * r + 1] = exp2f(s[i][2 * r + 1] - base);
        sum += s[i][2 * r] + s[i][2 * r + 1];
      }
      l[r] = l[r] * corr + sum;
      m[r] = mx;
#pragma unroll
      for (int i = 0; i < DP / 8; i++) {
        o[i][2 * r] *= corr;
        o[i][2 * r + 1] *= corr;
      }
    }

    cp_async_wait_all();
    __syncthreads(); // V tile j in place; every warp is done with K tile j
    if (j + 1 < n_tiles) {
      load_tile<T, BN, DP, STRIDE>(sk, k, k0 + BN, t.key_end - k0 - BN, a.d, vec);
      cp_async_commit();
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      // The score accumulators of key columns 16kk..16kk + 15 are the
      // A operand of p·v as they stand.
      uint32_t pa[4];
      pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dd = 0; dd < DP / 16; dd++) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sv + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * STRIDE + dd * 16 + (lane / 16) * 8);
        mma16816<T>(o[2 * dd], pa, vb[0], vb[1]);
        mma16816<T>(o[2 * dd + 1], pa, vb[2], vb[3]);
      }
    }
  }

  T* out = static_cast<T*>(a.out) + ((static_cast<long long>(t.batch) * a.hq + t.head) * a.l_len) * a.d;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = 1.0f / sum;
    const int row = row0 + 8 * r;
    if (row >= a.l_len) {
      continue;
    }
    T* orow = out + static_cast<long long>(row) * a.d;
#pragma unroll
    for (int i = 0; i < DP / 8; i++) {
      const int col = i * 8 + 2 * tq;
      if (col < a.d) {
        orow[col] = from_f32<T>(o[i][2 * r] * inv);
      }
      if (col + 1 < a.d) {
        orow[col + 1] = from_f32<T>(o[i][2 * r + 1] * inv);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// f32: CUDA cores, exact.

// NC output columns per thread: head elements c, c + 16, ..., up to
// DP = 16·NC (zero padded past head_dim).
template <int NC>
__device__ void flash_f32(const AttentionArgs& a) {
  constexpr int BM = mlx_backend::kFlashF32Rows;
  constexpr int BN = mlx_backend::kFlashF32Keys;
  constexpr int DP = 16 * NC;
  // 4 floats of padding: the 8 key rows one quarter-warp reads as float4s
  // start 4 banks apart, so they cover all 32 banks once.
  constexpr int QSTR = DP + 4;
  constexpr int VSTR = DP;
  constexpr int PSTR = BN + 4;
  extern __shared__ uint4 flash_smem[];
  // q; then two buffers of (k, v) tiles, so tile j + 1 is copied while
  // tile j is computed on; then the probabilities.
  float* sq = reinterpret_cast<float*>(flash_smem);
  float* skv = sq + BM * QSTR;
  constexpr int KV = BN * QSTR + BN * VSTR;
  float* sp = skv + 2 * KV;

  const FlashTile t = flash_tile(a, BM);
  const Rows<float> q = rows_of<float>(a.q, a.qs, t.batch, t.head);
  const Rows<float> k = rows_of<float>(a.k, a.ks, t.batch, t.kv_head);
  const Rows<float> v = rows_of<float>(a.v, a.vs, t.batch, t.kv_head);
  const bool vec = a.vec;
  // Thread (rg, c): rows 4rg..4rg + 3 of the tile; keys c and c + 16 of a
  // key tile; output columns c + 16n. A row group's 16 threads are one
  // half-warp, so row reductions are half-warp shuffles.
  const int rg = threadIdx.x / 16;
  const int c = threadIdx.x % 16;
  const int n_tiles = (t.key_end + BN - 1) / BN;

  load_tile<float, BM, DP, QSTR>(sq, q, t.m0, t.rows, a.d, vec);
  load_tile<float, BN, DP, QSTR>(skv, k, 0, t.key_end, a.d, vec);
  load_tile<float, BN, DP, VSTR>(skv + BN * QSTR, v, 0, t.key_end, a.d, vec);
  cp_async_commit();

  const float scale = a.scale * 1.4426950408889634f;
  float o[4][NC];
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int n = 0; n < NC; n++) {
      o[i][n] = 0.0f;
    }
  }

  for (int j = 0; j < n_tiles; j++) {
    const int k0 = j * BN;
    const float* sk = skv + (j % 2) * KV;
    const float* sv = sk + BN * QSTR;
    cp_async_wait_all();
    __syncthreads(); // tile j in place; every thread is done with tile j - 1's buffer
    if (j + 1 < n_tiles) {
      float* next = skv + ((j + 1) % 2) * KV;
      load_tile<float, BN, DP, QSTR>(next, k, k0 + BN, t.key_end - k0 - BN, a.d, vec);
      load_tile<float, BN, DP, VSTR>(next + BN * QSTR, v, k0 + BN, t.key_end - k0 - BN, a.d, vec);
      cp_async_commit();
    }

    float s[4][2] = {};
#pragma unroll 4
    for (int e = 0; e < DP; e += 4) {
      float4 qv[4], kv[2];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        qv[i] = *reinterpret_cast<const float4*>(sq + (4 * rg + i) * QSTR + e);
      }
#pragma unroll
      for (int jj = 0; jj < 2; jj++) {
        kv[jj] = *reinterpret_cast<const float4*>(sk + (c + 16 * jj) * QSTR + e);
      }
#pragma unroll
      for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int jj = 0; jj < 2; jj++) {
          s[i][jj] = fmaf(qv[i].x, kv[jj].x, s[i][jj]);
          s[i][jj] = fmaf(qv[i].y, kv[jj].y, s[i][jj]);
          s[i][jj] = fmaf(qv[i].z, kv[jj].z, s[i][jj]);
          s[i][jj] = fmaf(qv[i].w, kv[jj].w, s[i][jj]);
        }
      }
    }

    const bool mask = k0 + BN > t.key_end || (a.causal && k0 + BN - 1 > t.m0 + t.offset);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int row = t.m0 + 4 * rg + i;
#pragma unroll
      for (int jj = 0; jj < 2; jj++) {
        float x = s[i][jj] * scale;
        const int key = k0 + c + 16 * jj;
        if (mask && (key >= t.key_end || (a.causal && key > row + t.offset))) {
          x = -INFINITY;
        }
        s[i][jj] = x;
      }
      float mx = fmaxf(m[i], fmaxf(s[i][0], s[i][1]));
#pragma unroll
      for (int w = 1; w < 16; w *= 2) {
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, w));
      }
      const float base = mx == -INFINITY ? 0.0f : mx;
      const float corr = exp2f(m[i] - base);
      const float p0 = exp2f(s[i][0] - base);
      const float p1 = exp2f(s[i][1] - base);
      l[i] = l[i] * corr + p0 + p1;
      m[i] = mx;
      sp[(4 * rg + i) * PSTR + c] = p0;
      sp[(4 * rg + i) * PSTR + c + 16] = p1;
#pragma unroll
      for (int n = 0; n < NC; n++) {
        o[i][n] *= corr;
      }
    }
    // A warp's rows (two row groups) are written and read by that warp only.
    __syncwarp();
#pragma unroll
    for (int jk = 0; jk < BN; jk += 4) {
      float4 p[4];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        p[i] = *reinterpret_cast<const float4*>(sp + (4 * rg + i) * PSTR + jk);
      }
#pragma unroll
      for (int n = 0; n < NC; n++) {
        const float v0 = sv[(jk + 0) * VSTR + c + 16 * n];
        const float v1 = sv[(jk + 1) * VSTR + c + 16 * n];
        const float v2 = sv[(jk + 2) * VSTR + c + 16 * n];
        const float v3 = sv[(jk + 3) * VSTR + c + 16 * n];
#pragma unroll
        for (int i = 0; i < 4; i++) {
          o[i][n] = fmaf(p[i].x, v0, o[i][n]);
          o[i][n] = fmaf(p[i].y, v1, o[i][n]);
          o[i][n] = fmaf(p[i].z, v2, o[i][n]);
          o[i][n] = fmaf(p[i].w, v3, o[i][n]);
        }
      }
    }
    __syncwarp(); // the p tile is rewritten next iteration
  }

  float* out = static_cast<float*>(a.out) + ((static_cast<long long>(t.batch) * a.hq + t.head) * a.l_len) * a.d;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float sum = l[i];
#pragma unroll
    for (int w = 1; w < 16; w *= 2) {
      sum += __shfl_xor_sync(0xffffffffu, sum, w);
    }
    const float inv = 1.0f / sum;
    const int row = t.m0 + 4 * rg + i;
    if (row >= a.l_len) {
      continue;
    }
#pragma unroll
    for (int n = 0; n < NC; n++) {
      const int col = c + 16 * n;
      if (col < a.d) {
        out[static_cast<long long>(row) * a.d + col] = o[i][n] * inv;
      }
    }
  }
}

} // namespace mlx_backend_cuda
