// What the standalone kernel checks share: CUDA error handling (exit status
// 2 on a CUDA error), the activation dtypes, and the kernel timer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

enum class DT { F32, F16, BF16 };
inline const char* dt_name(DT t) {
  return t == DT::F32 ? "f32" : t == DT::F16 ? "f16" : "bf16";
}
inline int dt_bytes(DT t) {
  return t == DT::F32 ? 4 : 2;
}

// Median milliseconds of 20 runs of `run` (which enqueues its launches on
// `st`), each timed alone with CUDA events, after `warm` untimed runs.
template <typename F>
double median_ms(cudaStream_t st, int warm, F run) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < warm; i++) {
    run();
  }
  std::vector<float> ms;
  for (int i = 0; i < 20; i++) {
    CK(cudaEventRecord(e0, st));
    run();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
