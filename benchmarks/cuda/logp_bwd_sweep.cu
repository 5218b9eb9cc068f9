// logp backward launch shapes on the device at hand: the backward's gradient math (bf16, no
// entropy) under several block sizes, unroll depths, row segment sizes and load/store cache
// hints, out of place and in place, beside a device-to-device copy of the same bytes. It chose
// rlk-cuda's one 512-thread block per row for V >= 65536 (docs/backends/cuda.md).
//   nvcc -O3 -std=c++17 --extended-lambda -arch=sm_90a -o /tmp/sweep benchmarks/cuda/logp_bwd_sweep.cu && /tmp/sweep
#include <cstdio>
#include <cuda_runtime.h>
#include "../../packages/rlk-cuda/csrc/common.cuh"
using namespace rlk;

template <int THREADS, int U, int STORE, int LOAD>
__global__ void __launch_bounds__(THREADS) bwd(const bf16_t* logits, bf16_t* grad, int64_t V,
                                               const int64_t* tokens, const float* lse_, const float* g_,
                                               int64_t per_vec) {
  constexpr int W = 8;
  const int64_t row = blockIdx.x;
  const int seg = blockIdx.y;
  const float inv_t = 1.f, lse = lse_[row], c1 = -g_[row], ctok = g_[row];
  const int64_t ltok = tokens[row];
  const uint4* v4 = reinterpret_cast<const uint4*>(logits + row * V);
  uint4* o4 = reinterpret_cast<uint4*>(grad + row * V);
  const int64_t nv_all = V / W;
  const int64_t v0 = seg * per_vec;
  const int64_t nv = v0 + per_vec < nv_all ? v0 + per_vec : nv_all;
  auto vec = [&](const uint4& r, int64_t j) {
    float x[W];
    unpack<bf16_t>(r, x);
    const int64_t dk = ltok - j * W;
    const int kt = (dk >= 0 && dk < W) ? static_cast<int>(dk) : -1;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float t = fmaf(x[k], inv_t, -lse);
      x[k] = exp2f(t * kLog2e) * c1;
      if (k == kt) x[k] += ctok;
    }
    if (STORE == 0) __stcs(o4 + j, pack<bf16_t>(x)); else o4[j] = pack<bf16_t>(x);
  };
  int64_t j = v0 + threadIdx.x;
  for (; j + (U - 1) * THREADS < nv; j += U * THREADS) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u] = LOAD == 0 ? __ldcs(v4 + j + u * THREADS) : __ldg(v4 + j + u * THREADS);
#pragma unroll
    for (int u = 0; u < U; ++u) vec(r[u], j + u * THREADS);
  }
  for (; j < nv; j += THREADS) vec(LOAD == 0 ? __ldcs(v4 + j) : __ldg(v4 + j), j);
}

struct Bufs { bf16_t *x, *g; int64_t* tok; float *lse, *gl; int64_t M, V; };

template <int THREADS, int U, int STORE, int LOAD>
float run(const Bufs& b, int64_t seg_elems, bool inplace, const char* name) {
  const int64_t nv_all = b.V / 8;
  int64_t nseg = seg_elems <= 0 ? 1 : (b.V + seg_elems - 1) / seg_elems;
  const int64_t step = (int64_t)U * THREADS;
  const int64_t per = ((nv_all + nseg - 1) / nseg + step - 1) / step * step;
  nseg = (nv_all + per - 1) / per;
  dim3 grid((unsigned)b.M, (unsigned)nseg);
  bf16_t* out = inplace ? b.x : b.g;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) bwd<THREADS, U, STORE, LOAD><<<grid, THREADS>>>(b.x, out, b.V, b.tok, b.lse, b.gl, per);
  const int reps = 20;
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) bwd<THREADS, U, STORE, LOAD><<<grid, THREADS>>>(b.x, out, b.V, b.tok, b.lse, b.gl, per);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= reps;
  const double gb = 2.0 * b.M * b.V * 2 / 1e9;
  printf("%-28s seg=%7lld nseg=%3lld inplace=%d  %.4f ms  %.0f GB/s  err=%s\n", name, (long long)seg_elems,
         (long long)nseg, (int)inplace, ms, gb / ms * 1e3, cudaGetErrorString(cudaGetLastError()));
  return ms;
}

int main() {
  Bufs b; b.M = 8192; b.V = 151936;
  const size_t n = (size_t)b.M * b.V;
  cudaMalloc(&b.x, n * 2); cudaMalloc(&b.g, n * 2);
  cudaMalloc(&b.tok, b.M * 8); cudaMalloc(&b.lse, b.M * 4); cudaMalloc(&b.gl, b.M * 4);
  cudaMemset(b.x, 0x3c, n * 2); cudaMemset(b.tok, 0, b.M * 8); cudaMemset(b.lse, 0, b.M * 4); cudaMemset(b.gl, 0, b.M * 4);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) cudaMemcpyAsync(b.g, b.x, n * 2, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 10; ++i) cudaMemcpyAsync(b.g, b.x, n * 2, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= 10;
  printf("memcpy D2D %.4f ms  %.0f GB/s\n", ms, 2.0 * n * 2 / 1e9 / ms * 1e3);
  for (int inplace = 0; inplace < 2; ++inplace) {
    for (int64_t seg : {8192LL, 16384LL, 32768LL, 65536LL, 0LL}) {
      run<256, 4, 0, 0>(b, seg, inplace, "T256 U4 cs/cs");
      run<256, 4, 1, 0>(b, seg, inplace, "T256 U4 st-plain/ld-cs");
      run<256, 4, 1, 1>(b, seg, inplace, "T256 U4 st-plain/ldg");
      run<256, 2, 0, 0>(b, seg, inplace, "T256 U2 cs/cs");
      run<512, 4, 0, 0>(b, seg, inplace, "T512 U4 cs/cs");
      run<128, 8, 0, 0>(b, seg, inplace, "T128 U8 cs/cs");
      run<256, 8, 0, 0>(b, seg, inplace, "T256 U8 cs/cs");
    }
  }
  return 0;
}
