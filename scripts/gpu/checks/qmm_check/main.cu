// Standalone GPU check of the many-row quantized matmul kernels
// (mlx-kernels-cpp/common/qmm.cuh, instantiated in
// mlx-kernels-cpp/quantized_matmul/cuda.cu): correctness of every tile of
// every (x dtype, scale dtype, bits, group) against host references, and
// timings at prefill shapes. See README for the command.
#include "quantized_matmul/cuda.cu"
#include "../check_common.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace qmm = mlx_backend::qmm;

// Unit roundoff of the output dtype.
double dt_u(DT t) {
  return t == DT::F32 ? std::ldexp(1.0, -24) : t == DT::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}
// Row-norm relative tolerance against the exact (double) reference: the
// tests' tolerances (tests/kernels_quantized_matmul.rs).
double dt_tol(DT t) {
  return t == DT::F32 ? 1e-5 : t == DT::F16 ? 2e-3 : 1e-2;
}

float round_to(DT t, float v) {
  if (t == DT::F16) {
    return __half2float(__float2half_rn(v));
  }
  if (t == DT::BF16) {
    return __bfloat162float(__float2bfloat16_rn(v));
  }
  return v;
}

void store(DT t, void* base, size_t i, float v) {
  if (t == DT::F32) {
    static_cast<float*>(base)[i] = v;
  } else if (t == DT::F16) {
    static_cast<__half*>(base)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
  }
}
float load(DT t, const void* base, size_t i) {
  if (t == DT::F32) {
    return static_cast<const float*>(base)[i];
  }
  if (t == DT::F16) {
    return __half2float(static_cast<const __half*>(base)[i]);
  }
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

std::map<std::string, const void*> kernels() {
  std::map<std::string, const void*> k;
#define REG(name) k[#name] = reinterpret_cast<const void*>(&name);
#define REG_HALF(XS, BITS)                          \
  REG(mlx_backend_qmm_##XS##_##XS##_b##BITS##_m64n128) \
  REG(mlx_backend_qmm_##XS##_##XS##_b##BITS##_m64n64)  \
  REG(mlx_backend_qmm_##XS##_##XS##_b##BITS##_m32n64)
#define REG_F32(PS, BITS)                    \
  REG(mlx_backend_qmm_f32_##PS##_b##BITS##_m64n64) \
  REG(mlx_backend_qmm_f32_##PS##_b##BITS##_m32n64)
  REG_HALF(f16, 4)
  REG_HALF(f16, 8)
  REG_HALF(bf16, 4)
  REG_HALF(bf16, 8)
  REG_F32(f32, 4)
  REG_F32(f32, 8)
  REG_F32(f16, 4)
  REG_F32(f16, 8)
  REG_F32(bf16, 4)
  REG_F32(bf16, 8)
  // The decode kernel at 4 rows, timed in 4-row launches beside qmm at
  // small M (where the row threshold between them belongs).
  REG(mlx_backend_qmv_bf16_bf16_b4_r4)
  return k;
}

struct Case {
  int m, n, k;
  DT xt, pt;
  int bits, gs;
  bool misaligned; // x and w one element past a 16-byte boundary (vec = false)
  bool timed;
};

struct Problem {
  Case c;
  std::vector<float> x; // x as stored (T values, widened)
  std::vector<uint32_t> w;
  std::vector<float> s, b; // scales and biases as stored (P values, widened)
  std::vector<double> wd; // exact dequantized weights [n, k]
  std::vector<float> wm; // the kernel's dequantized weights (fmaf, then rounded to T for half x)
};

Problem make_problem(const Case& c, uint64_t seed) {
  Problem p;
  p.c = c;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> nrm(0.0f, 1.0f);
  const int per_word = 32 / c.bits;
  const int groups = c.k / c.gs;
  p.x.resize(static_cast<size_t>(c.m) * c.k);
  for (auto& v : p.x) {
    v = round_to(c.xt, nrm(rng));
  }
  p.w.assign(static_cast<size_t>(c.n) * c.k / per_word, 0);
  std::vector<uint32_t> q(static_cast<size_t>(c.n) * c.k);
  for (size_t i = 0; i < q.size(); i++) {
    q[i] = static_cast<uint32_t>(rng() & ((1u << c.bits) - 1));
    p.w[i / per_word] |= q[i] << (c.bits * (i % per_word));
  }
  p.s.resize(static_cast<size_t>(c.n) * groups);
  p.b.resize(p.s.size());
  const float levels = static_cast<float>((1 << c.bits) - 1);
  for (size_t i = 0; i < p.s.size(); i++) {
    // As affine quantization of N(0, 0.05) weights: the group's range over
    // the levels, the bias near the group's minimum.
    const float range = 0.2f + 0.2f * u01(rng);
    p.s[i] = round_to(c.pt, range / levels);
    p.b[i] = round_to(c.pt, -0.5f * range + 0.01f * nrm(rng));
  }
  p.wd.resize(q.size());
  p.wm.resize(q.size());
  for (int n = 0; n < c.n; n++) {
    for (int k = 0; k < c.k; k++) {
      const size_t i = static_cast<size_t>(n) * c.k + k;
      const size_t g = static_cast<size_t>(n) * groups + k / c.gs;
      p.wd[i] = static_cast<double>(p.s[g]) * q[i] + static_cast<double>(p.b[g]);
      const float f = std::fmaf(p.s[g], static_cast<float>(q[i]), p.b[g]);
      p.wm[i] = c.xt == DT::F32 ? f : round_to(c.xt, f);
    }
  }
  return p;
}

// Per checked row: exact reference (double), the kernel-mimicking one
// (sequential f32 FMAs over the kernel's weights) and Σ|x·w|.
struct RowRef {
  int m;
  std::vector<double> exact;
  std::vector<float> mimic;
  std::vector<double> absum;
};

std::vector<RowRef> references(const Problem& p, const std::vector<int>& rows) {
  std::vector<RowRef> out(rows.size());
  const Case& c = p.c;
  auto work = [&](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; r++) {
      RowRef& ref = out[r];
      ref.m = rows[r];
      ref.exact.resize(c.n);
      ref.mimic.resize(c.n);
      ref.absum.resize(c.n);
      const float* xr = &p.x[static_cast<size_t>(ref.m) * c.k];
      for (int n = 0; n < c.n; n++) {
        const double* wdr = &p.wd[static_cast<size_t>(n) * c.k];
        const float* wmr = &p.wm[static_cast<size_t>(n) * c.k];
        double e = 0.0, a = 0.0;
        float f = 0.0f;
        for (int k = 0; k < c.k; k++) {
          e += static_cast<double>(xr[k]) * wdr[k];
          a += std::fabs(static_cast<double>(xr[k]) * wdr[k]);
          f = std::fmaf(xr[k], wmr[k], f);
        }
        ref.exact[n] = e;
        ref.mimic[n] = f;
        ref.absum[n] = a;
      }
    }
  };
  unsigned threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  size_t per = (rows.size() + threads - 1) / threads;
  for (unsigned t = 0; t < threads; t++) {
    size_t lo = t * per, hi = std::min(rows.size(), lo + per);
    if (lo < hi) {
      pool.emplace_back(work, lo, hi);
    }
  }
  for (auto& t : pool) {
    t.join();
  }
  return out;
}

// The rows checked: all of them for small problems, else the edges of
// every tile height and a random sample.
std::vector<int> check_rows(const Case& c, std::mt19937_64& rng) {
  std::vector<int> rows;
  if (static_cast<double>(c.m) * c.n * c.k <= 6e7) {
    for (int m = 0; m < c.m; m++) {
      rows.push_back(m);
    }
    return rows;
  }
  for (int m : {0, 1, 15, 16, 31, 32, 63, 64, c.m - 2, c.m - 1}) {
    if (m >= 0 && m < c.m) {
      rows.push_back(m);
    }
  }
  for (int i = 0; i < 16; i++) {
    rows.push_back(static_cast<int>(rng() % c.m));
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

struct Device {
  void* x = nullptr;
  void* w = nullptr;
  void* s = nullptr;
  void* b = nullptr;
  void* out = nullptr;
  size_t out_elems = 0; // with the guard
};

constexpr size_t kGuard = 256; // poisoned elements past the output

void* upload(const void* host, size_t bytes, size_t pad) {
  char* d = nullptr;
  CK(cudaMalloc(&d, bytes + pad + 16));
  CK(cudaMemcpy(d + pad, host, bytes, cudaMemcpyHostToDevice));
  return d + pad;
}

Device upload_problem(const Problem& p) {
  const Case& c = p.c;
  Device d;
  std::vector<char> buf(p.x.size() * dt_bytes(c.xt));
  for (size_t i = 0; i < p.x.size(); i++) {
    store(c.xt, buf.data(), i, p.x[i]);
  }
  d.x = upload(buf.data(), buf.size(), c.misaligned ? dt_bytes(c.xt) : 0);
  d.w = upload(p.w.data(), p.w.size() * 4, c.misaligned ? 4 : 0);
  buf.assign(p.s.size() * dt_bytes(c.pt), 0);
  for (size_t i = 0; i < p.s.size(); i++) {
    store(c.pt, buf.data(), i, p.s[i]);
  }
  d.s = upload(buf.data(), buf.size(), c.misaligned ? dt_bytes(c.pt) : 0);
  for (size_t i = 0; i < p.b.size(); i++) {
    store(c.pt, buf.data(), i, p.b[i]);
  }
  d.b = upload(buf.data(), buf.size(), c.misaligned ? dt_bytes(c.pt) : 0);
  d.out_elems = static_cast<size_t>(c.m) * c.n + kGuard;
  CK(cudaMalloc(&d.out, d.out_elems * dt_bytes(c.xt)));
  return d;
}

void free_device(Device& d, const Case& c) {
  CK(cudaFree(static_cast<char*>(d.x) - (c.misaligned ? dt_bytes(c.xt) : 0)));
  CK(cudaFree(static_cast<char*>(d.w) - (c.misaligned ? 4 : 0)));
  CK(cudaFree(static_cast<char*>(d.s) - (c.misaligned ? dt_bytes(c.pt) : 0)));
  CK(cudaFree(static_cast<char*>(d.b) - (c.misaligned ? dt_bytes(c.pt) : 0)));
  CK(cudaFree(d.out));
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

void launch(const void* fn, const qmm::Tile& t, const Case& c, Device& d, cudaStream_t st) {
  // As quantized_matmul/cuda.cpp: vec when every array starts on 16 bytes.
  bool vec = aligned16(d.x) && aligned16(d.w) && aligned16(d.s) && aligned16(d.b) && aligned16(d.out);
  int m = c.m, k = c.k, n = c.n, gs = c.gs;
  void* args[] = {&d.x, &d.w, &d.s, &d.b, &d.out, &m, &k, &n, &gs, &vec};
  dim3 grid((m + t.bm - 1) / t.bm, (n + t.bn - 1) / t.bn);
  CK(cudaLaunchKernel(fn, grid, dim3(t.threads), args, 0, st));
}

struct Verdict {
  bool pass = true;
  double norm_err = 0.0; // worst row: ||got - exact|| / ||exact||
  double elem_ratio = 0.0; // worst |got - mimic| / its bound
  size_t bitexact = 0, checked = 0;
  std::string why;
};

Verdict verify(const Problem& p, const std::vector<RowRef>& refs, const Device& d) {
  const Case& c = p.c;
  Verdict v;
  std::vector<char> host(d.out_elems * dt_bytes(c.xt));
  CK(cudaMemcpy(host.data(), d.out, host.size(), cudaMemcpyDeviceToHost));
  // The guard past the output keeps its poison (0xFF bytes).
  for (size_t i = static_cast<size_t>(c.m) * c.n * dt_bytes(c.xt); i < host.size(); i++) {
    if (static_cast<unsigned char>(host[i]) != 0xFF) {
      v.pass = false;
      v.why = "wrote past the output";
      break;
    }
  }
  // Every output written (no poison left), including unchecked rows.
  for (size_t i = 0; i < static_cast<size_t>(c.m) * c.n; i++) {
    if (!std::isfinite(load(c.xt, host.data(), i))) {
      v.pass = false;
      v.why = "non-finite output at " + std::to_string(i / c.n) + "," + std::to_string(i % c.n);
      break;
    }
  }
  const double u = dt_u(c.xt);
  const double acc_rel = c.xt == DT::F32 ? std::ldexp(1.0, -20) : std::ldexp(1.0, -14);
  for (const auto& r : refs) {
    double num = 0.0, den = 0.0;
    for (int n = 0; n < c.n; n++) {
      const double got = load(c.xt, host.data(), static_cast<size_t>(r.m) * c.n + n);
      num += (got - r.exact[n]) * (got - r.exact[n]);
      den += r.exact[n] * r.exact[n];
      // Against the mimic: the output's rounding to T, and accumulation
      // order (tensor cores sum 16 products at a time).
      const double bound = u * std::fabs(r.mimic[n]) * 1.001 + acc_rel * r.absum[n] + 1e-30;
      const double diff = std::fabs(got - static_cast<double>(round_to(c.xt, r.mimic[n])));
      const double ratio = std::fabs(got - r.mimic[n]) / bound;
      v.elem_ratio = std::max(v.elem_ratio, ratio);
      v.bitexact += diff == 0.0;
      v.checked++;
      if (!(ratio <= 1.0) && v.pass) {
        v.pass = false;
        char buf[200];
        std::snprintf(buf, sizeof buf, "element %d,%d: got %.8g, mimic %.8g, exact %.8g", r.m, n, got,
                      r.mimic[n], r.exact[n]);
        v.why = buf;
      }
    }
    const double e = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    v.norm_err = std::max(v.norm_err, e);
  }
  if (!(v.norm_err <= dt_tol(c.xt)) && v.pass) {
    v.pass = false;
    v.why = "row norm error above tolerance";
  }
  return v;
}

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);
  auto table = kernels();

  const std::pair<DT, DT> dtypes[] = {
      {DT::F32, DT::F32}, {DT::F32, DT::F16}, {DT::F32, DT::BF16}, {DT::F16, DT::F16}, {DT::BF16, DT::BF16}};
  std::vector<Case> cases;
  // Correctness: odd M and N, every tile edge, K from one step up.
  const int shapes[][3] = {{5, 8, 128},   {7, 72, 256},  {6, 7, 96},    {33, 200, 384},
                           {128, 96, 512}, {65, 130, 64}, {512, 72, 128}, {513, 200, 1024},
                           {100, 257, 320}};
  for (auto [xt, pt] : dtypes) {
    for (int bits : {4, 8}) {
      for (int gs : {32, 64, 128}) {
        for (auto& s : shapes) {
          if (s[2] % gs == 0) {
            cases.push_back({s[0], s[1], s[2], xt, pt, bits, gs, false, false});
          }
        }
        // Unaligned arrays (the kernels' scalar-load path).
        cases.push_back({37, 75, 256, xt, pt, bits, gs, true, false});
      }
    }
  }
  // Timed: M = 512 at the projections of SmolLM2-135M and Qwen3-0.6B, and a
  // few smaller row counts; rows sampled for correctness.
  const int projections[][2] = {{576, 576},   {1536, 576},  {576, 1536},  {192, 576},
                                {1024, 1024}, {3072, 1024}, {1024, 3072}, {2048, 1024}};
  for (auto [xt, pt] : std::initializer_list<std::pair<DT, DT>>{
           {DT::BF16, DT::BF16}, {DT::F16, DT::F16}, {DT::F32, DT::F32}}) {
    for (int bits : {4, 8}) {
      if (quick && bits == 8) {
        continue;
      }
      for (auto& nk : projections) {
        cases.push_back({512, nk[0], nk[1], xt, pt, bits, 64, false, true});
      }
    }
  }
  for (int m : {8, 16, 32, 128, 2048}) {
    for (auto& nk : {std::array<int, 2>{1024, 1024}, std::array<int, 2>{3072, 1024}}) {
      cases.push_back({m, nk[0], nk[1], DT::BF16, DT::BF16, 4, 64, false, true});
    }
  }

  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  std::mt19937_64 rng(7);
  int failures = 0, runs = 0;
  std::printf("\n%-4s %-5s %-5s %-4s %-4s %5s %5s %5s %-8s %-8s %10s %10s %9s %s\n", "res", "x", "scale",
              "bits", "gs", "M", "N", "K", "tile", "align", "norm_err", "elem/bnd", "bitexact", "why");
  struct Timing {
    Case c;
    std::string tile;
    bool picked;
    double us, gbs, tflops;
  };
  std::vector<Timing> timings;
  uint64_t seed = 1;
  for (const auto& c : cases) {
    Problem p = make_problem(c, seed++);
    Device d = upload_problem(p);
    auto rows = check_rows(c, rng);
    auto refs = references(p, rows);
    const qmm::Tile* tiles = c.xt == DT::F32 ? qmm::kF32Tiles : qmm::kHalfTiles;
    const int count = c.xt == DT::F32 ? std::size(qmm::kF32Tiles) : std::size(qmm::kHalfTiles);
    const int picked = c.xt == DT::F32 ? qmm::pick_tile(qmm::kF32Tiles, c.m, c.n)
                                       : qmm::pick_tile(qmm::kHalfTiles, c.m, c.n);
    for (int t = 0; t < count; t++) {
      std::string name = std::string("mlx_backend_qmm_") + dt_name(c.xt) + "_" + dt_name(c.pt) + "_b" +
          std::to_string(c.bits) + "_" + tiles[t].name;
      auto it = table.find(name);
      if (it == table.end()) {
        std::printf("FAIL: no kernel %s\n", name.c_str());
        failures++;
        continue;
      }
      CK(cudaMemset(d.out, 0xFF, d.out_elems * dt_bytes(c.xt))); // NaN poison
      launch(it->second, tiles[t], c, d, st);
      CK(cudaStreamSynchronize(st));
      CK(cudaGetLastError());
      Verdict v = verify(p, refs, d);
      runs++;
      failures += !v.pass;
      if (!v.pass || !c.timed || t == picked) {
        std::printf("%-4s %-5s %-5s %-4d %-4d %5d %5d %5d %-8s %-8s %10.2e %10.3f %8.1f%% %s\n",
                    v.pass ? "PASS" : "FAIL", dt_name(c.xt), dt_name(c.pt), c.bits, c.gs, c.m, c.n, c.k,
                    tiles[t].name, c.misaligned ? "scalar" : "vec16", v.norm_err, v.elem_ratio,
                    100.0 * v.bitexact / std::max<size_t>(1, v.checked), v.why.c_str());
      }
      if (c.timed) {
        const double s = median_ms(st, 5, [&] { launch(it->second, tiles[t], c, d, st); }) * 1e-3;
        const double bytes = static_cast<double>(c.m) * c.k * dt_bytes(c.xt) +
            static_cast<double>(c.n) * c.k * c.bits / 8 +
            2.0 * c.n * (c.k / c.gs) * dt_bytes(c.pt) + static_cast<double>(c.m) * c.n * dt_bytes(c.xt);
        timings.push_back({c, tiles[t].name, t == picked, s * 1e6, bytes / s / 1e9,
                           2.0 * c.m * c.n * c.k / s / 1e12});
      }
    }
    if (c.timed && c.m <= 32 && c.xt == DT::BF16 && c.bits == 4) {
      // ceil(M/4) launches of the 4-row decode kernel (common/qmv.cuh): 4
      // warps a block, 4 columns a warp.
      const void* fn = table["mlx_backend_qmv_bf16_bf16_b4_r4"];
      auto run = [&] {
        for (int r0 = 0; r0 < c.m; r0 += 4) {
          const void* xp = static_cast<const __nv_bfloat16*>(d.x) + static_cast<size_t>(r0) * c.k;
          void* op = static_cast<__nv_bfloat16*>(d.out) + static_cast<size_t>(r0) * c.n;
          int rows = std::min(4, c.m - r0), k = c.k, n = c.n, gs = c.gs;
          bool vec = true;
          void* args[] = {&xp, &d.w, &d.s, &d.b, &op, &rows, &k, &n, &gs, &vec};
          CK(cudaLaunchKernel(fn, dim3((c.n + 15) / 16), dim3(128), args, 0, st));
        }
      };
      const double s = median_ms(st, 5, run) * 1e-3;
      timings.push_back({c, "qmv_r4xN", false, s * 1e6, 0.0, 2.0 * c.m * c.n * c.k / s / 1e12});
    }
    free_device(d, c);
  }

  std::printf("\ntimings (median of 20 launches, cudaEvent; * = the tile the host picks)\n");
  std::printf("%-5s %-4s %-4s %5s %5s %5s %-9s %9s %9s %9s\n", "x", "bits", "gs", "M", "N", "K", "tile", "us",
              "GB/s", "TFLOP/s");
  for (const auto& t : timings) {
    std::printf("%-5s %-4d %-4d %5d %5d %5d %-8s%s %9.2f %9.1f %9.2f\n", dt_name(t.c.xt), t.c.bits, t.c.gs,
                t.c.m, t.c.n, t.c.k, t.tile.c_str(), t.picked ? "*" : " ", t.us, t.gbs, t.tflops);
  }
  std::printf("\n%s: %d of %d kernel runs failed\n", failures ? "FAIL" : "PASS", failures, runs);
  return failures ? 1 : 0;
}
