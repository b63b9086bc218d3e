// Quantized matrix products for prefill-size batches (many rows of x) on
// MLX's affine format (the layout of common/qmv.cuh): out[M, N] = x[M, K] ·
// dequant(w[N, K])ᵀ with f32 accumulation and one rounding to T.
//
// A block computes a BM × BN tile of the output, walking K in steps of
// kQmmBK = 32 values. Every valid K is a multiple of 32 and every group
// size (32, 64, 128) a multiple of 32, so a step never straddles the end of
// K or a quantization group: one scale and one bias per weight row per step,
// and no K tail. Each step's packed weights are dequantized once into shared
// memory and used by all BM rows of x there.
//
// Two bodies:
// * f16/bf16 x: W is dequantized to T (scale·q + bias in f32, rounded once),
//   x and W tiles sit in shared memory as T and the warps run tensor-core
//   mma.sync m16n8k16 with f32 accumulators (ldmatrix loads the fragments).
// * f32 x: exact f32 math (the result MLX's f32 matmul gives without TF32):
//   the tiles are f32 in shared memory and each thread accumulates a TM × TN
//   register block with FMAs.
//
// Both are software-pipelined over two shared-memory buffers: the next
// step's global loads are issued into registers before the current step's
// math, and written to the other buffer after it, so one barrier per step
// separates the writes from the reads.
//
// Rows past M read as zero; weight rows past N read row N - 1 (valid
// memory) and their columns are never stored.
#pragma once

#include "common/cuda_common.cuh"
#include "common/mma.cuh"

namespace mlx_backend_cuda {

constexpr int kQmmBK = 32;

// Packed words of one k-step of BN weight rows, staged in registers: 16-byte
// chunks (32 values at 4 bits, 16 at 8), handed out to the block's threads.
template <typename P, int BITS, int BN, int THREADS>
struct QmmWStage {
  static constexpr int kValsPerChunk = 128 / BITS;
  static constexpr int kChunksPerRow = kQmmBK / kValsPerChunk;
  static constexpr int kChunks = BN * kChunksPerRow;
  static constexpr int kIters = (kChunks + THREADS - 1) / THREADS;
  static constexpr uint32_t kMask = (1u << BITS) - 1u;
  static_assert(kQmmBK % kValsPerChunk == 0, "a k-step holds whole chunks");

  uint4 q[kIters];
  float scale[kIters];
  float bias[kIters];

  __device__ __forceinline__ static bool owns(int i) {
    return kChunks % THREADS == 0 || static_cast<int>(threadIdx.x) + i * THREADS < kChunks;
  }
  __device__ __forceinline__ static int row(int i) {
    return (threadIdx.x + i * THREADS) / kChunksPerRow;
  }
  __device__ __forceinline__ static int part(int i) {
    return (threadIdx.x + i * THREADS) % kChunksPerRow;
  }

  __device__ __forceinline__ void load(
      const uint32_t* w,
      const P* scales,
      const P* biases,
      int n0,
      int n_len,
      int k0,
      int k_len,
      int group_size,
      bool vec) {
    const size_t words_per_row = static_cast<size_t>(k_len) * BITS / 32;
    const size_t groups_per_row = k_len / group_size;
    const int g = k0 / group_size;
#pragma unroll
    for (int i = 0; i < kIters; i++) {
      if (owns(i)) {
        const int n = min(n0 + row(i), n_len - 1);
        const uint32_t* p = w + n * words_per_row + (k0 * BITS) / 32 + 4 * part(i);
        if (vec) {
          q[i] = *reinterpret_cast<const uint4*>(p);
        } else {
          q[i] = make_uint4(p[0], p[1], p[2], p[3]);
        }
        scale[i] = to_f32(scales[n * groups_per_row + g]);
        bias[i] = to_f32(biases[n * groups_per_row + g]);
      }
    }
  }

  // Value j (0 .. kValsPerChunk - 1) of chunk i, dequantized in f32 with
  // one rounding (an explicit FMA, so a host reference can repeat it).
  __device__ __forceinline__ float value(int i, int j) const {
    constexpr int kPerWord = 32 / BITS;
    const int word = j / kPerWord;
    const uint32_t bits =
        word == 0 ? q[i].x : word == 1 ? q[i].y : word == 2 ? q[i].z : q[i].w;
    const float qv = static_cast<float>((bits >> (BITS * (j % kPerWord))) & kMask);
    return fmaf(scale[i], qv, bias[i]);
  }
};

// ---------------------------------------------------------------------------
// f16/bf16: tensor cores.

template <typename T>
struct Half2Of;
template <>
struct Half2Of<__half> {
  using type = __half2;
  __device__ __forceinline__ static __half2 make(float a, float b) {
    return __floats2half2_rn(a, b);
  }
};
template <>
struct Half2Of<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ __forceinline__ static __nv_bfloat162 make(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
};

// out[m, n] = Σ_k x[m, k]·w[n, k] for T = __half or __nv_bfloat16 (x,
// scales, biases and out all T). BM × BN per block, WARPS_M × WARPS_N warps
// each owning a (BM / WARPS_M) × (BN / WARPS_N) block of the tile. Grid:
// x over row tiles, y over column tiles. `vec`: x, w and out start on 16
// bytes (x and w rows then do too: K is a multiple of 32).
template <typename T, int BITS, int BM, int BN, int WARPS_M, int WARPS_N>
__device__ __forceinline__ void qmm_mma(
    const T* __restrict__ x,
    const uint32_t* __restrict__ w,
    const T* __restrict__ scales,
    const T* __restrict__ biases,
    T* __restrict__ out,
    int m_len,
    int k_len,
    int n_len,
    int group_size,
    bool vec) {
  constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  constexpr int kWarpM = BM / WARPS_M;
  constexpr int kWarpN = BN / WARPS_N;
  constexpr int kMT = kWarpM / 16; // m16 fragments per warp
  constexpr int kNT = kWarpN / 8; // n8 fragments per warp
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "whole ldmatrix.x4 fragments");
  // Rows padded by 16 bytes: a row is 80 bytes, so the 8 rows one ldmatrix
  // phase reads fall on 8 distinct 16-byte bank groups.
  constexpr int kLd = kQmmBK + 8;
  // x in 16-byte chunks of 8 values, 4 per row.
  constexpr int kXChunks = BM * (kQmmBK / 8);
  constexpr int kXIters = (kXChunks + kThreads - 1) / kThreads;
  using Stage = QmmWStage<T, BITS, BN, kThreads>;
  using H2 = typename Half2Of<T>::type;

  __shared__ alignas(16) T xs[2][BM][kLd];
  __shared__ alignas(16) T ws[2][BN][kLd];

  const int m0 = blockIdx.x * BM;
  const int n0 = blockIdx.y * BN;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int wm = (warp / WARPS_N) * kWarpM;
  const int wn = (warp % WARPS_N) * kWarpN;

  Stage ws_regs;
  uint4 xs_regs[kXIters];

  auto load_x = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kXIters; i++) {
      const int c = threadIdx.x + i * kThreads;
      if (kXChunks % kThreads == 0 || c < kXChunks) {
        const int r = c / 4;
        const int m = m0 + r;
        if (m < m_len) {
          const T* p = x + static_cast<size_t>(m) * k_len + k0 + (c % 4) * 8;
          if (vec) {
            xs_regs[i] = *reinterpret_cast<const uint4*>(p);
          } else {
            Vec<T, 8> v;
#pragma unroll
            for (int j = 0; j < 8; j++) {
              v.v[j] = p[j];
            }
            xs_regs[i] = *reinterpret_cast<const uint4*>(&v);
          }
        } else {
          xs_regs[i] = make_uint4(0, 0, 0, 0);
        }
      }
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kXIters; i++) {
      const int c = threadIdx.x + i * kThreads;
      if (kXChunks % kThreads == 0 || c < kXChunks) {
        *reinterpret_cast<uint4*>(&xs[buf][c / 4][(c % 4) * 8]) = xs_regs[i];
      }
    }
#pragma unroll
    for (int i = 0; i < Stage::kIters; i++) {
      if (Stage::owns(i)) {
        T* dst = &ws[buf][Stage::row(i)][Stage::part(i) * Stage::kValsPerChunk];
#pragma unroll
        for (int j = 0; j < Stage::kValsPerChunk; j += 8) {
          uint4 packed;
          H2* h = reinterpret_cast<H2*>(&packed);
#pragma unroll
          for (int p = 0; p < 4; p++) {
            h[p] = Half2Of<T>::make(ws_regs.value(i, j + 2 * p), ws_regs.value(i, j + 2 * p + 1));
          }
          *reinterpret_cast<uint4*>(dst + j) = packed;
        }
      }
    }
  };

  float acc[kMT][kNT][4] = {};
  const int steps = k_len / kQmmBK;

  load_x(0);
  ws_regs.load(w, scales, biases, n0, n_len, 0, k_len, group_size, vec);
  store(0);
  __syncthreads();

  for (int s = 0; s < steps; s++) {
    const int buf = s % 2;
    if (s + 1 < steps) {
      load_x((s + 1) * kQmmBK);
      ws_regs.load(w, scales, biases, n0, n_len, (s + 1) * kQmmBK, k_len, group_size, vec);
    }
#pragma unroll
    for (int kk = 0; kk < kQmmBK; kk += 16) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; mt++) {
        // Lanes 0-15 address rows 0-15 at k 0, lanes 16-31 the same rows
        // at k 8: the four 8×8 matrices come back in mma's A order.
        ldmatrix_x4(a[mt], &xs[buf][wm + mt * 16 + lane % 16][kk + (lane / 16) * 8]);
      }
      uint32_t b[kNT][2];
#pragma unroll
      for (int np = 0; np < kNT / 2; np++) {
        // Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
        // (n 8-15, k 8-15): two n8 fragments' B registers.
        uint32_t r[4];
        ldmatrix_x4(r, &ws[buf][wn + np * 16 + (lane / 16) * 8 + lane % 8][kk + ((lane / 8) % 2) * 8]);
        b[2 * np][0] = r[0];
        b[2 * np][1] = r[1];
        b[2 * np + 1][0] = r[2];
        b[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMT; mt++) {
#pragma unroll
        for (int nt = 0; nt < kNT; nt++) {
          mma16816<T>(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
      }
    }
    if (s + 1 < steps) {
      store(1 - buf);
    }
    __syncthreads();
  }

  // The accumulator layout of m16n8: c0, c1 at row lane/4, columns
  // 2·(lane%4) and +1; c2, c3 eight rows below.
  const bool pairs = vec && n_len % 2 == 0;
#pragma unroll
  for (int mt = 0; mt < kMT; mt++) {
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const int m = m0 + wm + mt * 16 + lane / 4 + half * 8;
      if (m >= m_len) {
        continue;
      }
      T* orow = out + static_cast<size_t>(m) * n_len;
#pragma unroll
      for (int nt = 0; nt < kNT; nt++) {
        const int n = n0 + wn + nt * 8 + 2 * (lane % 4);
        const float v0 = acc[mt][nt][2 * half];
        const float v1 = acc[mt][nt][2 * half + 1];
        if (pairs && n + 1 < n_len) {
          *reinterpret_cast<H2*>(orow + n) = Half2Of<T>::make(v0, v1);
        } else {
          if (n < n_len) {
            orow[n] = from_f32<T>(v0);
          }
          if (n + 1 < n_len) {
            orow[n + 1] = from_f32<T>(v1);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// f32: exact FMAs on the SIMT cores.

// out[m, n] = Σ_k x[m, k]·w[n, k] for f32 x and out, scales and biases of
// type P (f32, f16 or bf16, upcast). (BM / TM) × (BN / TN) threads, each
// owning TM consecutive rows by TN consecutive columns. Grid as qmm_mma.
template <typename P, int BITS, int BM, int BN, int TM, int TN>
__device__ __forceinline__ void qmm_f32(
    const float* __restrict__ x,
    const uint32_t* __restrict__ w,
    const P* __restrict__ scales,
    const P* __restrict__ biases,
    float* __restrict__ out,
    int m_len,
    int k_len,
    int n_len,
    int group_size,
    bool vec) {
  constexpr int kThreadsN = BN / TN;
  constexpr int kThreads = (BM / TM) * kThreadsN;
  static_assert(TM == 4 && TN == 4, "the shared-memory reads are float4 per thread");
  // Tiles stored k-major (x transposed), so that a thread's TM rows and TN
  // columns at one k are one float4 each; rows padded by 16 bytes.
  constexpr int kLdX = BM + 4;
  constexpr int kLdW = BN + 4;
  // x in 16-byte chunks of 4 values, 8 per row.
  constexpr int kXChunks = BM * (kQmmBK / 4);
  constexpr int kXIters = (kXChunks + kThreads - 1) / kThreads;
  using Stage = QmmWStage<P, BITS, BN, kThreads>;

  __shared__ alignas(16) float xs[2][kQmmBK][kLdX];
  __shared__ alignas(16) float ws[2][kQmmBK][kLdW];

  const int m0 = blockIdx.x * BM;
  const int n0 = blockIdx.y * BN;
  const int tm = (threadIdx.x / kThreadsN) * TM;
  const int tn = (threadIdx.x % kThreadsN) * TN;

  Stage ws_regs;
  float4 xs_regs[kXIters];

  auto load_x = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kXIters; i++) {
      const int c = threadIdx.x + i * kThreads;
      if (kXChunks % kThreads == 0 || c < kXChunks) {
        const int m = m0 + c / 8;
        if (m < m_len) {
          const float* p = x + static_cast<size_t>(m) * k_len + k0 + (c % 8) * 4;
          xs_regs[i] = vec ? *reinterpret_cast<const float4*>(p) : make_float4(p[0], p[1], p[2], p[3]);
        } else {
          xs_regs[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }
    }
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int i = 0; i < kXIters; i++) {
      const int c = threadIdx.x + i * kThreads;
      if (kXChunks % kThreads == 0 || c < kXChunks) {
        const int r = c / 8;
        const int k = (c % 8) * 4;
        xs[buf][k][r] = xs_regs[i].x;
        xs[buf][k + 1][r] = xs_regs[i].y;
        xs[buf][k + 2][r] = xs_regs[i].z;
        xs[buf][k + 3][r] = xs_regs[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < Stage::kIters; i++) {
      if (Stage::owns(i)) {
        const int r = Stage::row(i);
        const int k = Stage::part(i) * Stage::kValsPerChunk;
#pragma unroll
        for (int j = 0; j < Stage::kValsPerChunk; j++) {
          ws[buf][k + j][r] = ws_regs.value(i, j);
        }
      }
    }
  };

  float acc[TM][TN] = {};
  const int steps = k_len / kQmmBK;

  load_x(0);
  ws_regs.load(w, scales, biases, n0, n_len, 0, k_len, group_size, vec);
  store(0);
  __syncthreads();

  for (int s = 0; s < steps; s++) {
    const int buf = s % 2;
    if (s + 1 < steps) {
      load_x((s + 1) * kQmmBK);
      ws_regs.load(w, scales, biases, n0, n_len, (s + 1) * kQmmBK, k_len, group_size, vec);
    }
#pragma unroll
    for (int k = 0; k < kQmmBK; k++) {
      const float4 a = *reinterpret_cast<const float4*>(&xs[buf][k][tm]);
      const float4 b = *reinterpret_cast<const float4*>(&ws[buf][k][tn]);
      const float av[4] = {a.x, a.y, a.z, a.w};
      const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < TM; i++) {
#pragma unroll
        for (int j = 0; j < TN; j++) {
          acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
      }
    }
    if (s + 1 < steps) {
      store(1 - buf);
    }
    __syncthreads();
  }

  const bool quads = vec && n_len % 4 == 0;
#pragma unroll
  for (int i = 0; i < TM; i++) {
    const int m = m0 + tm + i;
    if (m >= m_len) {
      continue;
    }
    float* orow = out + static_cast<size_t>(m) * n_len;
    const int n = n0 + tn;
    if (quads && n + 3 < n_len) {
      *reinterpret_cast<float4*>(orow + n) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    } else {
#pragma unroll
      for (int j = 0; j < TN; j++) {
        if (n + j < n_len) {
          orow[n + j] = acc[i][j];
        }
      }
    }
  }
}

} // namespace mlx_backend_cuda
