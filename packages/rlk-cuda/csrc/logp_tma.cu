// logp / logp_entropy forward on Hopper through the bulk copy engine (TMA): each block streams
// one fixed segment of a row into a ring of shared-memory stages with 1-D cp.async.bulk copies
// (one thread issues them, an mbarrier per stage says when the bytes have landed) and reduces
// it with the same online statistics as the generic kernel (logp_row.cuh); the generic merge
// kernel then combines the segments in order. The segments depend on V only: batch-invariant.
//
// Machine code exists only for sm_90a. Builds without a 90a target (RLK_CUDA_TMA unset) and the
// HIP build of rlk-rocm compile this file to a stub that says so.
#include "logp_fwd.cuh"

namespace rlk {

namespace {
constexpr int64_t kTmaSegment = 32768;  // elements of a row per block
}  // namespace

int logp_forward_tma_segments(int64_t V) {
  return V <= kTmaSegment ? 1 : static_cast<int>((V + kTmaSegment - 1) / kTmaSegment);
}

#if defined(RLK_CUDA_TMA) && !defined(__HIPCC__)

namespace {

constexpr int kThreads = 256;
constexpr int kStages = 4;
constexpr int kChunkBytes = 16384;  // one stage, one bulk copy
constexpr int kRingBytes = kStages * kChunkBytes;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kChunkVecs = kChunkBytes / 16;  // 16-byte vectors per stage

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Initialised barriers become visible to the copy engine (the async proxy) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The logits are read once: let the copies evict them from L2 first.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Announce `bytes` on `bar`, then copy them global -> shared; the copy engine completes the
// barrier's phase once they have all landed.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar, uint64_t policy) {
  const uint32_t b = smem_addr(bar);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(b), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t b = smem_addr(bar);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(b), "r"(parity)
        : "memory");
  }
}

// Vector j of a stage: a 16-byte shared-memory load, or W scalar global loads for rows that do
// not start on a 16-byte boundary (no bulk copy possible). Same values either way.
template <typename T, bool STAGED>
__device__ __forceinline__ void load_vector(const T* src, int j, float (&x)[VecWidth<T>::value]) {
  if (STAGED) unpack<T>(reinterpret_cast<const uint4*>(src)[j], x);
  else load_vec<T, false>(src, j, x);
}

// Statistics of the first nv vectors of one stage, in an order that does not depend on where
// they come from, so staged and unaligned rows give the same bits.
template <typename T, bool ENT, bool STAGED>
__device__ __forceinline__ void consume(RowAcc& acc, const T* src, int nv, float sc) {
  constexpr int W = VecWidth<T>::value, U = kChunkVecs / kThreads;
  if (nv == kChunkVecs) {
    float x[U * W];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float y[W];
      load_vector<T, STAGED>(src, threadIdx.x + u * kThreads, y);
#pragma unroll
      for (int k = 0; k < W; ++k) x[u * W + k] = y[k];
    }
    acc_chunk<ENT>(acc, x, sc);
    return;
  }
  for (int j = threadIdx.x; j < nv; j += kThreads) {
    float y[W];
    load_vector<T, STAGED>(src, j, y);
    acc_chunk<ENT>(acc, y, sc);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Block (i, seg) reduces segment seg of row i into part[i][seg]; the merge kernel finishes.
template <typename T, bool ENT>
__global__ void __launch_bounds__(kThreads) logp_fwd_tma_kernel(LogpFwdArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int W = VecWidth<T>::value;
  constexpr int kChunkElems = kChunkBytes / static_cast<int>(sizeof(T));
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ uint64_t full[kStages];
  const int64_t i = blockIdx.x;
  const RowInfo ri = row_info(a, i);
  if (skip_row(a, ri)) return;
  const int64_t begin = blockIdx.y * kTmaSegment;
  const int64_t len = a.V - begin < kTmaSegment ? a.V - begin : kTmaSegment;
  const T* p = static_cast<const T*>(a.logits) + ri.row * a.row_stride + begin;
  const int nvec = static_cast<int>(len / W);
  const int nchunks = (nvec + kChunkVecs - 1) / kChunkVecs;
  const float sc = ri.inv_t * kLog2e;
  auto chunk_vecs = [&](int c) { return min(kChunkVecs, nvec - c * kChunkVecs); };
  RowAcc acc{-INFINITY, 0.f, 0.f};
  if (is_aligned16(p)) {  // the same for the whole block
    uint64_t policy = 0;
    auto issue = [&](int c) {
      const int s = c % kStages;
      bulk_load(ring + s * kChunkBytes, p + static_cast<int64_t>(c) * kChunkElems,
                static_cast<uint32_t>(chunk_vecs(c)) * 16u, &full[s], policy);
    };
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) mbar_init(&full[s], 1);
      fence_barrier_init();
      policy = evict_first_policy();
      for (int c = 0; c < kStages && c < nchunks; ++c) issue(c);
    }
    __syncthreads();
    for (int c = 0; c < nchunks; ++c) {
      const int s = c % kStages;
      mbar_wait(&full[s], static_cast<uint32_t>(c / kStages) & 1u);
      consume<T, ENT, true>(acc, reinterpret_cast<const T*>(ring + s * kChunkBytes),
                            chunk_vecs(c), sc);
      if (c + kStages < nchunks) {
        __syncthreads();  // every thread is done with stage s: refill it
        if (threadIdx.x == 0) issue(c + kStages);
      }
    }
  } else {
    for (int c = 0; c < nchunks; ++c)
      consume<T, ENT, false>(acc, p + static_cast<int64_t>(c) * kChunkElems, chunk_vecs(c), sc);
  }
  const int64_t t = static_cast<int64_t>(nvec) * W + threadIdx.x;  // the last V % W elements
  if (t < len) {
    const float x[1] = {to_float(p[t])};
    acc_chunk<ENT>(acc, x, sc);
  }
  const RowAcc r = acc_block_reduce<ENT, kThreads>(acc, sc);
  if (threadIdx.x == 0) {
    float* out = a.partial + (i * gridDim.y + blockIdx.y) * 3;
    out[0] = r.m;
    out[1] = r.s;
    out[2] = r.w;
  }
#endif
}

template <typename T, bool ENT>
cudaError_t launch_tma(const LogpFwdArgs& a, cudaStream_t s) {
  auto kernel = logp_fwd_tma_kernel<T, ENT>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(a.R), static_cast<unsigned>(a.nseg));
  kernel<<<grid, kThreads, kRingBytes, s>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_tma_sized(const LogpFwdArgs& a, cudaStream_t s) {
  return a.entropy ? launch_tma<T, true>(a, s) : launch_tma<T, false>(a, s);
}

// The kernels above carry code only for sm_90a, which runs on compute capability 9.0 alone.
bool on_sm90() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

}  // namespace

bool logp_tma_built() { return true; }

const char* logp_forward_tma(const LogpFwdArgs& a, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (a.R == 0) return nullptr;
  if (a.nseg != logp_forward_tma_segments(a.V))
    return "logp_forward_tma: nseg must be logp_forward_tma_segments(V)";
  if (a.partial == nullptr) return "logp_forward_tma: needs a partial buffer";
  if (a.R > 0x7fffffffLL || a.nseg > 65535) return "logp_forward_tma: too many rows or segments";
  if (!on_sm90()) return "logp_forward_tma: the bulk-copy path runs on sm_90 devices only";
  cudaError_t e;
  switch (a.dtype) {
    case kF32: e = launch_tma_sized<float>(a, s); break;
    case kBF16: e = launch_tma_sized<bf16_t>(a, s); break;
    case kF16: e = launch_tma_sized<f16_t>(a, s); break;
    default: return "logp_forward_tma: unsupported dtype code";
  }
  if (e != cudaSuccess) return cudaGetErrorString(e);
  return logp_forward_merge(a, s);
}

#else  // no sm_90a target in this build, or HIP

bool logp_tma_built() { return false; }

const char* logp_forward_tma(const LogpFwdArgs&, void*) {
  return "logp_forward_tma: this build has no sm_90a code (RLK_CUDA_ARCHITECTURES without 90a)";
}

#endif

}  // namespace rlk
