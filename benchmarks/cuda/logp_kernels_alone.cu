// The logp forward and backward kernels timed alone with CUDA events, no torch and no Python:
// what a bench row's time holds beyond the kernels (issue #29's V = 32768 question). Built on
// the CPU machine against a tree's csrc and carried to the GPU machine:
//   nvcc -std=c++17 -O3 -ftz=true --extended-lambda -arch=sm_90a -Ipackages/rlk-cuda/csrc \
//     benchmarks/cuda/logp_kernels_alone.cu packages/rlk-cuda/csrc/logp.cu \
//     packages/rlk-cuda/csrc/logp_backward.cu -o logp_kernels_alone
//   ./logp_kernels_alone TAG DTYPE(0 f32, 1 bf16, 2 f16) N V [ROW_STRIDE]
// Logits ~ std 2.4 from a hash of the index; tokens spread over the row; upstream 1 (0.5 on
// the entropy). Each line: forward, backward and a device copy of the logits, 20 calls each.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "rlk_api.h"

__global__ void fill(void* p, int dtype, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    float u = (h & 0xffffff) / 16777216.f, v = ((h >> 8) & 0xffff) / 65536.f;
    float x = 3.f * (u + v - 1.f) * 2.f;  // spread ~ std 2.4
    if (dtype == 0) ((float*)p)[i] = x; else if (dtype == 1) ((__nv_bfloat16*)p)[i] = __float2bfloat16(x);
    else ((__half*)p)[i] = __float2half(x);
  }
}
__global__ void fill_tok(int64_t* t, int64_t n, int64_t V) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    t[i] = (i * 7919) % V;
}
__global__ void fill_f(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = v;
}
#define CK(x) do { cudaError_t e = (x); if (e) { printf("cuda %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
#define RK(x) do { const char* e = (x); if (e) { printf("rlk %s\n", e); exit(1);} } while (0)

template <typename F> float time_ms(F f, int reps) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  cudaEventRecord(a); for (int i = 0; i < reps; ++i) f(); cudaEventRecord(b); CK(cudaEventSynchronize(b));
  float ms; cudaEventElapsedTime(&ms, a, b); return ms / reps;
}

int main(int argc, char** argv) {
  const char* tag = argv[1]; int dtype = atoi(argv[2]); int64_t N = atoll(argv[3]), V = atoll(argv[4]);
  int64_t stride = argc > 5 ? atoll(argv[5]) : V;
  int esz = dtype == 0 ? 4 : 2;
  void *x, *g, *copy; int64_t *tok; float *lp, *ent, *gl, *ge, *part = nullptr; double* lse;
  CK(cudaMalloc(&x, N * stride * esz + 64)); CK(cudaMalloc(&g, N * stride * esz + 64)); CK(cudaMalloc(&copy, N * stride * esz + 64));
  CK(cudaMalloc(&tok, N * 8)); CK(cudaMalloc(&lp, N * 4)); CK(cudaMalloc(&ent, N * 4)); CK(cudaMalloc(&gl, N * 4));
  CK(cudaMalloc(&ge, N * 4)); CK(cudaMalloc(&lse, N * 8));
  fill<<<4096, 256>>>(x, dtype, N * stride, 1234u); fill_tok<<<256, 256>>>(tok, N, V);
  fill_f<<<64, 256>>>(gl, N, 1.f); fill_f<<<64, 256>>>(ge, N, 0.5f);
  int nseg = rlk::logp_forward_segments(V);
  if (nseg > 1) CK(cudaMalloc(&part, N * nseg * 3 * 4));
  for (int with_ent = 0; with_ent < 2; ++with_ent) {
    rlk::LogpFwdArgs f{}; f.logits = x; f.dtype = dtype; f.M = N; f.V = V; f.row_stride = stride; f.tokens = tok;
    f.rows = nullptr; f.R = N; f.temperature = 1.f; f.temp_rows = nullptr; f.ignore_index = -100; f.logp = lp;
    f.logp_stride = 1; f.entropy = with_ent ? ent : nullptr; f.lse = lse; f.stats = nullptr; f.nseg = nseg; f.partial = part;
    float fwd = time_ms([&] { RK(rlk::logp_forward(f, nullptr)); }, 20);
    rlk::LogpBwdArgs b{}; b.logits = x; b.dtype = dtype; b.M = N; b.V = V; b.row_stride = stride; b.grad = g;
    b.grad_dtype = dtype; b.grad_row_stride = stride; b.tokens = tok; b.g_logp = gl; b.g_ent = with_ent ? ge : nullptr;
    b.lse = lse; b.entropy = with_ent ? ent : nullptr; b.temperature = 1.f; b.temp_rows = nullptr; b.ignore_index = -100;
    b.col_offset = 0; b.vocab_total = V;
    float bwd = time_ms([&] { RK(rlk::logp_backward(b, nullptr)); }, 20);
    double bytes = (double)N * V * esz;
    float cp = time_ms([&] { CK(cudaMemcpyAsync(copy, x, N * stride * esz, cudaMemcpyDeviceToDevice)); }, 20);
    printf("%-6s dtype=%d N=%lld V=%lld stride=%lld ent=%d  fwd %.4f ms (%.2f TB/s)  bwd %.4f ms (%.2f TB/s)  sum %.4f  copy %.4f ms (%.2f TB/s)\n",
           tag, dtype, (long long)N, (long long)V, (long long)stride, with_ent, fwd, bytes / fwd / 1e9, bwd, 2 * bytes / bwd / 1e9,
           fwd + bwd, cp, 2 * bytes / cp / 1e9);
  }
  return 0;
}
