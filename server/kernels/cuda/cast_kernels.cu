// Device side of cast_kernels.h. Memory-bound: the vector path moves 32 bytes
// in and 16 bytes out per thread per step, with coalesced 16-byte accesses.
#include <cstdint>

#include "server/kernels/cuda/bf16_device.cuh"
#include "server/kernels/cuda/cast_kernels.h"

namespace logitd::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// Enough resident blocks to keep every SM's memory pipeline busy; the loops
// stride over the rest.
constexpr std::int64_t kMaxBlocks = 4096;

__device__ __forceinline__ std::uint32_t Pack(float lo, float hi) { return ToBf16x2Bits(lo, hi); }

__global__ void CastVec8Kernel(const float4* __restrict__ in, std::int64_t groups,
                               uint4* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t g = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    // Both loads issue before either is used.
    const float4 a = __ldcs(in + 2 * g);
    const float4 b = __ldcs(in + 2 * g + 1);
    uint4 r;
    r.x = Pack(a.x, a.y);
    r.y = Pack(a.z, a.w);
    r.z = Pack(b.x, b.y);
    r.w = Pack(b.z, b.w);
    __stcs(out + g, r);
  }
}

__global__ void CastScalarKernel(const float* __restrict__ in, std::int64_t n,
                                 std::uint16_t* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = static_cast<std::uint16_t>(ToBf16Bits(in[i]));
  }
}

__global__ void ScaleKernel(const float* in, std::int64_t n, float scale, void* out,
                            bool out_bf16) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = __fmul_rn(in[i], scale);
    if (out_bf16) {
      static_cast<std::uint16_t*>(out)[i] = static_cast<std::uint16_t>(ToBf16Bits(v));
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

// Each value's bf16 bits (Bits(in[i]): the value itself for bf16, its
// round to nearest even for fp32) widened to fp64, exactly (bf16 is the
// upper half of an fp32, and fp32 to fp64 is exact, NaN payloads and
// infinities included), with its magnitude when out_abs is not null;
// *non_finite set when one is a NaN or an infinity.
template <typename In, typename Bits>
__global__ void WidenKernel(const In* __restrict__ in, std::int64_t n, double* __restrict__ out,
                            double* __restrict__ out_abs, unsigned int* non_finite, Bits bits_of) {
  bool seen = false;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::uint32_t bits = bits_of(in[i]);
    const double v = static_cast<double>(__uint_as_float(bits << 16));
    out[i] = v;
    if (out_abs != nullptr) out_abs[i] = fabs(v);
    seen |= (bits & 0x7f80u) == 0x7f80u;
  }
  if (non_finite != nullptr && seen) *non_finite = 1;
}

struct Bf16Bits16 {
  __device__ std::uint32_t operator()(std::uint16_t b) const { return b; }
};
struct RoundedFp32 {
  __device__ std::uint32_t operator()(float f) const { return ToBf16Bits(f); }
};

__global__ void AbsDoubleKernel(const double* __restrict__ in, std::int64_t n,
                                double* __restrict__ out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = fabs(in[i]);
  }
}

#ifdef LOGITD_TEST_FAULTS
__global__ void TrapKernel() { __trap(); }

__global__ void SpinKernel(std::uint64_t nanoseconds) {
  std::uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  std::uint64_t now = start;
  while (now - start < nanoseconds) {
    __nanosleep(1000000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  }
}
#endif  // LOGITD_TEST_FAULTS

unsigned int Blocks(std::int64_t items) {
  std::int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned int>(blocks);
}

bool Aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

}  // namespace

cudaError_t LaunchCastFp32ToBf16(const float* in, std::int64_t n, std::uint16_t* out,
                                 cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  std::int64_t done = 0;
  if (Aligned16(in) && Aligned16(out)) {
    const std::int64_t groups = n / 8;
    if (groups > 0) {
      CastVec8Kernel<<<Blocks(groups), kThreads, 0, stream>>>(
          reinterpret_cast<const float4*>(in), groups, reinterpret_cast<uint4*>(out));
      const cudaError_t error = cudaGetLastError();
      if (error != cudaSuccess) return error;
    }
    done = groups * 8;
  }
  if (done < n) {
    CastScalarKernel<<<Blocks(n - done), kThreads, 0, stream>>>(in + done, n - done, out + done);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

cudaError_t LaunchScale(const float* in, std::int64_t n, float scale, void* out, bool out_bf16,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(in, n, scale, out, out_bf16);
  return cudaGetLastError();
}

cudaError_t LaunchWidenBf16(const std::uint16_t* in, std::int64_t n, double* out, double* out_abs,
                            unsigned int* non_finite, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  WidenKernel<<<Blocks(n), kThreads, 0, stream>>>(in, n, out, out_abs, non_finite, Bf16Bits16{});
  return cudaGetLastError();
}

cudaError_t LaunchRoundWidenFp32(const float* in, std::int64_t n, double* out, double* out_abs,
                                 unsigned int* non_finite, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  WidenKernel<<<Blocks(n), kThreads, 0, stream>>>(in, n, out, out_abs, non_finite, RoundedFp32{});
  return cudaGetLastError();
}

cudaError_t LaunchAbsDouble(const double* in, std::int64_t n, double* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AbsDoubleKernel<<<Blocks(n), kThreads, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

#ifdef LOGITD_TEST_FAULTS
cudaError_t LaunchTestTrap(cudaStream_t stream) {
  TrapKernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t LaunchTestSpin(double seconds, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(static_cast<std::uint64_t>(seconds * 1e9));
  return cudaGetLastError();
}
#endif  // LOGITD_TEST_FAULTS

}  // namespace logitd::kernels::cuda
