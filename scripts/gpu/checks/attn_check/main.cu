// Standalone check of attention's CUDA prefill kernels (attention/flash.cuh
// through attention/cuda.cu): random inputs, NaN-poisoned outputs, a
// float64 host reference, and cudaEvent timings. Build and run: see README.
#include "attention/cuda.cu"
#include "../check_common.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

using mlx_backend::AttentionArgs;
using mlx_backend::AttentionStrides;

float round_dt(DT t, float x) {
  if (t == DT::F16) {
    return __half2float(__float2half(x));
  }
  if (t == DT::BF16) {
    return __bfloat162float(__float2bfloat16(x));
  }
  return x;
}
double tol_of(DT t) {
  return t == DT::F32 ? 1e-4 : t == DT::F16 ? 4e-3 : 3e-2;
}

using Kern = void (*)(AttentionArgs);
Kern flash_kernel(DT t, int dp) {
#define K3(DP)                                                                                  \
  if (dp == DP)                                                                                 \
    return t == DT::F32 ? mlx_backend_attention_flash_f32_d##DP                                 \
        : t == DT::F16  ? mlx_backend_attention_flash_f16_d##DP                                 \
                        : mlx_backend_attention_flash_bf16_d##DP;
  K3(32) K3(64) K3(96) K3(128) K3(192) K3(256)
#undef K3
  return nullptr;
}

// Layouts of the inputs as stored on the device.
enum Layout {
  kModel = 0, // q a transpose of [B, L, Hq, D]; k, v the first S rows of a [B, Hkv, S + 16, D] cache
  kDense = 1, // all [B, H, rows, D]
  kKHeadsT = 2, // k stored [B, S, Hkv, D] (the heads' transpose; rows still dense vectors)
  kKElemT = 3, // k stored [B, Hkv, D, S] (element stride S: the element-by-element copy)
  kQOffset = 4, // q one element past a 16-byte boundary (no vector copies)
  kLayouts = 5,
};
const char* layout_name(int l) {
  static const char* n[] = {"model", "dense", "k-headsT", "k-elemT", "q-offset"};
  return n[l];
}

// One input on the host (rounded values as floats, in storage order) and
// on the device (in the dtype).
struct Tensor {
  std::vector<float> host;
  AttentionStrides st{};
  long long offset = 0; // first element
  void* dev = nullptr;
  float at(int b, int h, int r, int e) const {
    return host[offset + b * st.batch + h * st.head + r * st.row + e * st.elem];
  }
};

void upload(Tensor& t, DT dt) {
  size_t n = t.host.size();
  std::vector<unsigned char> bytes(n * dt_bytes(dt));
  for (size_t i = 0; i < n; i++) {
    if (dt == DT::F32) {
      std::memcpy(&bytes[i * 4], &t.host[i], 4);
    } else if (dt == DT::F16) {
      __half h = __float2half(t.host[i]);
      std::memcpy(&bytes[i * 2], &h, 2);
    } else {
      __nv_bfloat16 h = __float2bfloat16(t.host[i]);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  CK(cudaMalloc(&t.dev, bytes.size() + 16));
  CK(cudaMemcpy(t.dev, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
}

// Fills `t` with normal values for logical shape [B, H, R, D] stored as
// `kind`: 0 dense, 1 rows-major transpose [B, R, H, D], 2 cache slice
// [B, H, R + 16, D], 3 element-strided [B, H, D, R], 4 dense plus one
// leading element.
void make(Tensor& t, int b, int h, int r, int d, int kind, DT dt, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  long long n = 0;
  switch (kind) {
    case 0:
      t.st = {1LL * h * r * d, 1LL * r * d, d, 1};
      n = 1LL * b * h * r * d;
      break;
    case 1:
      t.st = {1LL * r * h * d, d, 1LL * h * d, 1};
      n = 1LL * b * h * r * d;
      break;
    case 2:
      t.st = {1LL * h * (r + 16) * d, 1LL * (r + 16) * d, d, 1};
      n = 1LL * b * h * (r + 16) * d;
      break;
    case 3:
      t.st = {1LL * h * r * d, 1LL * r * d, 1, r};
      n = 1LL * b * h * r * d;
      break;
    case 4:
      t.st = {1LL * h * r * d, 1LL * r * d, d, 1};
      t.offset = 1;
      n = 1LL * b * h * r * d + 1;
      break;
  }
  t.host.resize(n);
  for (auto& x : t.host) {
    x = round_dt(dt, nd(rng));
  }
  upload(t, dt);
}

struct Case {
  DT dt;
  int b, hq, hkv, l, s, d;
  bool causal;
  int layout;
  bool timed;
};

std::vector<double> reference(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v, float scale) {
  std::vector<double> out(1LL * c.b * c.hq * c.l * c.d);
  auto work = [&](int bh) {
    int bi = bh / c.hq, h = bh % c.hq, kh = h / (c.hq / c.hkv);
    std::vector<double> sc(c.s), qr(c.d);
    for (int i = 0; i < c.l; i++) {
      int n = c.causal ? i + c.s - c.l + 1 : c.s;
      for (int e = 0; e < c.d; e++) {
        qr[e] = q.at(bi, h, i, e);
      }
      double mx = -INFINITY;
      for (int j = 0; j < n; j++) {
        double dot = 0;
        for (int e = 0; e < c.d; e++) {
          dot += qr[e] * k.at(bi, kh, j, e);
        }
        sc[j] = dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double z = 0;
      for (int j = 0; j < n; j++) {
        sc[j] = std::exp(sc[j] - mx);
        z += sc[j];
      }
      double* o = &out[((1LL * bi * c.hq + h) * c.l + i) * c.d];
      for (int j = 0; j < n; j++) {
        double p = sc[j] / z;
        for (int e = 0; e < c.d; e++) {
          o[e] += p * v.at(bi, kh, j, e);
        }
      }
    }
  };
  int total = c.b * c.hq;
  int threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      for (int bh = t; bh < total; bh += threads) {
        work(bh);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  return out;
}

// The launch attention/cuda.cpp's enqueue_prefill makes.
struct Launch {
  Kern f;
  dim3 grid;
  unsigned smem;
};
Launch prefill_launch(const Case& c, AttentionArgs& a, const Tensor* in[3]) {
  const int dp = mlx_backend::flash_padded_dim(c.d);
  const bool f32 = c.dt == DT::F32;
  const int rows = f32 ? mlx_backend::kFlashF32Rows : mlx_backend::kFlashRows;
  const unsigned smem =
      f32 ? mlx_backend::flash_f32_smem_bytes(dp) : mlx_backend::flash_tc_smem_bytes(dp, dt_bytes(c.dt));
  a.vec = true;
  const void* ptrs[3] = {a.q, a.k, a.v};
  for (int i = 0; i < 3; i++) {
    a.vec = a.vec && mlx_backend::flash_rows_vectorizable(ptrs[i], in[i]->st, c.d, dt_bytes(c.dt));
  }
  Kern f = flash_kernel(c.dt, dp);
  CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return {f, dim3(c.hq, c.b, (c.l + rows - 1) / rows), smem};
}

double visible_pairs(const Case& c) {
  double p = 0;
  for (int i = 0; i < c.l; i++) {
    p += c.causal ? i + c.s - c.l + 1 : c.s;
  }
  return p;
}

bool run_case(const Case& c, std::mt19937_64& rng) {
  Tensor q, k, v;
  int qkind = c.layout == kModel ? 1 : c.layout == kQOffset ? 4 : 0;
  int kkind = c.layout == kModel ? 2 : c.layout == kKHeadsT ? 1 : c.layout == kKElemT ? 3 : 0;
  int vkind = c.layout == kModel ? 2 : 0;
  make(q, c.b, c.hq, c.l, c.d, qkind, c.dt, rng);
  make(k, c.b, c.hkv, c.s, c.d, kkind, c.dt, rng);
  make(v, c.b, c.hkv, c.s, c.d, vkind, c.dt, rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  size_t out_n = 1LL * c.b * c.hq * c.l * c.d;
  void* out = nullptr;
  CK(cudaMalloc(&out, out_n * dt_bytes(c.dt)));
  CK(cudaMemset(out, 0xFF, out_n * dt_bytes(c.dt))); // NaN in every dtype
  auto dev = [&](const Tensor& t) {
    return static_cast<const void*>(static_cast<const char*>(t.dev) + t.offset * dt_bytes(c.dt));
  };
  AttentionArgs a{dev(q), dev(k), dev(v), out, nullptr, q.st, k.st, v.st, c.hq, c.hkv, c.l, c.s, c.d,
                  scale, c.causal, 1, false};
  const Tensor* in[3] = {&q, &k, &v};
  Launch ln = prefill_launch(c, a, in);
  ln.f<<<ln.grid, mlx_backend::kFlashThreads, ln.smem>>>(a);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  std::vector<float> got(out_n);
  {
    std::vector<unsigned char> bytes(out_n * dt_bytes(c.dt));
    CK(cudaMemcpy(bytes.data(), out, bytes.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < out_n; i++) {
      if (c.dt == DT::F32) {
        std::memcpy(&got[i], &bytes[i * 4], 4);
      } else if (c.dt == DT::F16) {
        __half h;
        std::memcpy(&h, &bytes[i * 2], 2);
        got[i] = __half2float(h);
      } else {
        __nv_bfloat16 h;
        std::memcpy(&h, &bytes[i * 2], 2);
        got[i] = __bfloat162float(h);
      }
    }
  }
  std::vector<double> want = reference(c, q, k, v, scale);
  double worst = 0;
  size_t worst_i = 0;
  bool ok = true;
  for (size_t i = 0; i < out_n; i++) {
    double err = std::fabs(got[i] - want[i]) / std::max(std::fabs(want[i]), 1.0);
    if (!(err <= tol_of(c.dt))) {
      ok = false;
    }
    if (!(err <= worst)) {
      worst = std::isnan(err) ? INFINITY : err;
      worst_i = i;
    }
  }
  char timing[96] = "";
  if (c.timed) {
    double med = median_ms(0, 3, [&] { ln.f<<<ln.grid, mlx_backend::kFlashThreads, ln.smem>>>(a); });
    double flops = 4.0 * c.b * c.hq * c.d * visible_pairs(c);
    std::snprintf(timing, sizeof timing, "%9.1f us %7.1f TFLOP/s", med * 1e3, flops / (med * 1e-3) / 1e12);
  }
  std::printf(
      "%-4s %-4s B=%d H=%2d/%-2d L=%4d S=%4d D=%3d %-8s %-8s vec=%d max_err %.2e (tol %.0e at %zu) %s\n",
      ok ? "PASS" : "FAIL", dt_name(c.dt), c.b, c.hq, c.hkv, c.l, c.s, c.d, c.causal ? "causal" : "unmasked",
      layout_name(c.layout), a.vec ? 1 : 0, worst, tol_of(c.dt), worst_i, timing);
  std::fflush(stdout);
  CK(cudaFree(out));
  CK(cudaFree(q.dev));
  CK(cudaFree(k.dev));
  CK(cudaFree(v.dev));
  return ok;
}

int main(int argc, char** argv) {
  // `--bench`: only the timed shapes.
  bool bench_only = argc > 1 && std::strcmp(argv[1], "--bench") == 0;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::vector<Case> cases;
  const DT dts[] = {DT::F32, DT::F16, DT::BF16};
  const int heads[][2] = {{4, 4}, {9, 3}, {16, 8}};
  if (!bench_only) {
    int idx = 0;
    for (DT dt : dts) {
      for (int d : {32, 64, 96, 128, 256}) {
        for (int l : {5, 17, 64, 129, 512}) {
          for (int extra : {0, 77}) {
            for (bool causal : {true, false}) {
              idx++;
              const int* h = heads[idx % 3];
              int b = idx % 7 == 0 ? 2 : 1;
              cases.push_back({dt, b, h[0], h[1], l, l + extra, d, causal, idx % kLayouts, false});
            }
          }
        }
      }
      // Head sizes between the compiled ones (zero padded), one not a
      // multiple of 8 (element-by-element copies), a long uneven prompt,
      // a batch of 3, a long cache behind a short chunk.
      for (int d : {8, 36, 40, 80, 160, 200}) {
        cases.push_back({dt, 1, 6, 2, 70, 70 + 19, d, true, kModel, false});
        cases.push_back({dt, 1, 6, 2, 33, 33, d, false, kDense, false});
      }
      cases.push_back({dt, 1, 8, 2, 1000, 1000, 64, true, kModel, false});
      cases.push_back({dt, 3, 4, 1, 100, 300, 128, true, kKHeadsT, false});
      cases.push_back({dt, 1, 4, 2, 48, 2000, 128, true, kModel, false});
      cases.push_back({dt, 1, 4, 2, 48, 2000, 64, false, kKElemT, false});
    }
  }
  // Timed: SmolLM2-135M (9/3 x 64) and Qwen3-0.6B (16/8 x 128) prefill.
  for (DT dt : dts) {
    for (auto [hq, hkv, d] : {std::tuple{9, 3, 64}, std::tuple{16, 8, 128}}) {
      for (auto [l, s] : {std::pair{512, 512}, std::pair{2048, 2048}, std::pair{512, 2048}}) {
        cases.push_back({dt, 1, hq, hkv, l, s, d, true, kModel, true});
      }
      cases.push_back({dt, 1, hq, hkv, 512, 512, d, false, kModel, true});
    }
  }
  int failed = 0;
  std::mt19937_64 rng(1234);
  for (const auto& c : cases) {
    failed += run_case(c, rng) ? 0 : 1;
  }
  std::printf("%zu cases, %d failed\n", cases.size(), failed);
  return failed ? 1 : 0;
}
