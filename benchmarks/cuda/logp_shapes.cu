// rlk-cuda's own logp kernels (csrc/logp.cu and logp_backward.cu, included whole) under launch
// shapes other than the ones they pick, beside a device-to-device copy: which shape reads a
// row of V logits fastest, per dtype. Percentages are of the copy's bandwidth (read + write
// bytes), as the benchmark's roofline counts them. N = 8192 rows, random logits, one token per
// row. Every V here is a multiple of 16, so the kernels built for aligned rows are the ones timed
// (ANY = false); logp_kernels_alone.cu times unaligned rows.
//   nvcc -O3 -std=c++17 -ftz=true --extended-lambda -arch=sm_90a -I packages/rlk-cuda/csrc \
//     -o /tmp/logp_shapes benchmarks/cuda/logp_shapes.cu && /tmp/logp_shapes
#include <cstdio>
#include <string>
#include <vector>

#include "logp.cu"
#include "logp_backward.cu"

namespace rlk {
namespace shapes {  // named: the kernels live in rlk's anonymous namespace

constexpr int64_t kRows = 8192;

__global__ void fill_logits(uint16_t* bits16, float* f32, int64_t n, int dtype) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32);
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  const float x = (static_cast<float>(h & 0xffffff) / 16777216.f - 0.5f) * 8.f;
  if (dtype == kF32) f32[i] = x;
  else if (dtype == kBF16) bits16[i] = static_cast<uint16_t>(bf16_bits(x));
  else bits16[i] = __half_as_ushort(__float2half_rn(x));
}

__global__ void fill_rows(int64_t* tokens, float* g, int64_t V) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kRows) return;
  tokens[i] = (i * 7919) % V;
  g[i] = 1.f;
}

struct Bufs {
  void* x;
  void* grad;
  int64_t* tokens;
  float *g, *logp, *partial;
  double* lse;
};

float copy_gbps(const Bufs& b, size_t bytes) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) cudaMemcpyAsync(b.grad, b.x, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e0);
  for (int i = 0; i < 10; ++i) cudaMemcpyAsync(b.grad, b.x, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms;
  cudaEventElapsedTime(&ms, e0, e1);
  return 2.0 * bytes / 1e6 / (ms / 10);
}

// Milliseconds per call of `launch` (warm-up, then the mean of 20 back-to-back calls).
template <typename F>
float time_ms(F launch) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) launch();
  cudaEventRecord(e0);
  for (int i = 0; i < 20; ++i) launch();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms;
  cudaEventElapsedTime(&ms, e0, e1);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) printf("error: %s\n", cudaGetErrorString(err));
  return ms / 20;
}

LogpFwdArgs fwd_args(const Bufs& b, int dtype, int64_t V, int nseg) {
  LogpFwdArgs a{};
  a.logits = b.x;
  a.dtype = dtype;
  a.M = a.R = kRows;
  a.V = a.row_stride = V;
  a.tokens = b.tokens;
  a.temperature = 1.f;
  a.ignore_index = -100;
  a.logp = b.logp;
  a.logp_stride = 1;
  a.lse = b.lse;
  a.nseg = nseg;
  a.partial = b.partial;
  return a;
}

LogpBwdArgs bwd_args(const Bufs& b, int dtype, int64_t V) {
  LogpBwdArgs a{};
  a.logits = b.x;
  a.dtype = a.grad_dtype = dtype;
  a.M = kRows;
  a.V = a.row_stride = a.grad_row_stride = V;
  a.grad = b.grad;
  a.tokens = b.tokens;
  a.g_logp = b.g;
  a.lse = b.lse;
  a.temperature = 1.f;
  a.ignore_index = -100;
  a.vocab_total = V;
  return a;
}

struct Line {
  std::string text;
  void add(const char* label, float ms, double bytes, float copy) {
    char buf[64];
    snprintf(buf, sizeof buf, " %s %.3f/%.0f%%", label, ms, 100.0 * bytes / 1e6 / ms / copy);
    text += buf;
  }
};

template <typename T, int THREADS, int U>
void fwd_whole(Line& line, const char* label, const Bufs& b, int dtype, int64_t V, float copy) {
  const LogpFwdArgs a = fwd_args(b, dtype, V, 1);
  const float ms =
      time_ms([&] { logp_fwd_kernel<T, THREADS, false, false, U><<<kRows, THREADS>>>(a); });
  line.add(label, ms, static_cast<double>(kRows) * V * sizeof(T), copy);
}

template <typename T, bool ENT>
void fwd_split(Line& line, const char* label, const Bufs& b, int dtype, int64_t V, int nseg,
               float copy) {
  LogpFwdArgs a = fwd_args(b, dtype, V, nseg);
  const float ms = time_ms([&] {
    logp_fwd_partial_kernel<T, ENT, false><<<dim3(kRows, nseg), kSplitThreads>>>(a);
    logp_fwd_merge_kernel<T, ENT><<<(kRows + 127) / 128, 128>>>(a);
  });
  line.add(label, ms, static_cast<double>(kRows) * V * sizeof(T), copy);
}

template <typename T, int THREADS>
void bwd(Line& line, const char* label, const Bufs& b, int dtype, int64_t V, int nseg,
         float copy) {
  const LogpBwdArgs a = bwd_args(b, dtype, V);
  const float ms = time_ms([&] {
    logp_bwd_kernel<T, T, THREADS, false, false><<<dim3(kRows, nseg), THREADS>>>(a);
  });
  line.add(label, ms, 2.0 * kRows * V * sizeof(T), copy);
}

template <typename T>
void sweep(const char* name, int dtype, const Bufs& b) {
  for (int64_t V : {8192LL, 16384LL, 32768LL, 65536LL, 151936LL}) {
    const size_t bytes = static_cast<size_t>(kRows) * V * sizeof(T);
    const float copy = copy_gbps(b, bytes);
    fill_rows<<<kRows / 256, 256>>>(b.tokens, b.g, V);
    fill_logits<<<(kRows * V + 255) / 256, 256>>>(static_cast<uint16_t*>(b.x),
                                                  static_cast<float*>(b.x), kRows * V, dtype);
    // the forward writes lse for the backward
    logp_forward(fwd_args(b, dtype, V, logp_forward_segments(V)), nullptr);
    Line f, g;
    if (V < 65536) {
      fwd_whole<T, 128, 4>(f, "T128U4", b, dtype, V, copy);
      fwd_whole<T, 128, 8>(f, "T128U8", b, dtype, V, copy);
      fwd_whole<T, 256, 4>(f, "T256U4", b, dtype, V, copy);
      fwd_whole<T, 256, 8>(f, "T256U8", b, dtype, V, copy);
      fwd_whole<T, 512, 4>(f, "T512U4", b, dtype, V, copy);
      if (V >= 32768) fwd_split<T, false>(f, "split2", b, dtype, V, 2, copy);
    } else {
      const int nseg = logp_forward_segments(V);
      fwd_split<T, false>(f, "split", b, dtype, V, nseg, copy);
      fwd_split<T, true>(f, "split+ent", b, dtype, V, nseg, copy);
    }
    bwd<T, 128>(g, "T128s1", b, dtype, V, 1, copy);
    bwd<T, 256>(g, "T256s1", b, dtype, V, 1, copy);
    bwd<T, 512>(g, "T512s1", b, dtype, V, 1, copy);
    bwd<T, 256>(g, "T256s16k", b, dtype, V, static_cast<int>((V + 16383) / 16384), copy);
    bwd<T, 128>(g, "T128s8k", b, dtype, V, static_cast<int>((V + 8191) / 8192), copy);
    printf("%s V=%-6lld copy %4.0f GB/s | fwd%s\n", name, static_cast<long long>(V), copy,
           f.text.c_str());
    printf("%s V=%-6lld          bwd%s\n", name, static_cast<long long>(V), g.text.c_str());
  }
}

void run() {
  Bufs b;
  const size_t most = static_cast<size_t>(kRows) * 151936 * 4;
  cudaMalloc(&b.x, most);
  cudaMalloc(&b.grad, most);
  cudaMalloc(&b.tokens, kRows * 8);
  cudaMalloc(&b.g, kRows * 4);
  cudaMalloc(&b.logp, kRows * 4);
  cudaMalloc(&b.lse, kRows * 8);
  cudaMalloc(&b.partial, kRows * 16 * 3 * 4);
  printf("ms per call / %% of the copy bandwidth, N=%lld (fwd: logits read once; bwd: read "
         "+ gradient written)\n", static_cast<long long>(kRows));
  sweep<bf16_t>("bf16", kBF16, b);
  sweep<f16_t>("fp16", kF16, b);
  sweep<float>("fp32", kF32, b);
}

}  // namespace shapes
}  // namespace rlk

int main() {
  rlk::shapes::run();
  return 0;
}
