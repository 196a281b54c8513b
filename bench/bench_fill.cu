#include "bench/bench_fill.h"

namespace logitd::bench {
namespace {

__device__ __forceinline__ std::uint64_t SplitMix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 24 random bits -> (-1, 1), never exactly zero.
__device__ __forceinline__ float Uniform(std::uint64_t seed, std::int64_t i) {
  const std::uint64_t h = SplitMix(seed ^ SplitMix(static_cast<std::uint64_t>(i)));
  const float u = (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
  return 2.0f * u - 1.0f;
}

__global__ void FillBf16Kernel(std::uint16_t* p, std::int64_t n, std::uint64_t seed) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    std::uint32_t u = __float_as_uint(Uniform(seed, i));
    u += 0x7fffu + ((u >> 16) & 1u);
    std::uint16_t b = static_cast<std::uint16_t>(u >> 16);
    if ((b & 0x7fffu) == 0) b = 0x3b80;  // 2^-8
    p[i] = b;
  }
}

__global__ void FillFp32Kernel(float* p, std::int64_t n, std::uint64_t seed, float scale) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    p[i] = scale * Uniform(seed, i);
  }
}

__global__ void ScrubKernel(const uint4* __restrict__ p, std::int64_t n, unsigned* sink) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

unsigned int Blocks(std::int64_t n) {
  const std::int64_t b = (n + 255) / 256;
  return static_cast<unsigned int>(b > 8192 ? 8192 : (b < 1 ? 1 : b));
}

}  // namespace

cudaError_t FillRandomBf16(std::uint16_t* p, std::int64_t n, std::uint64_t seed,
                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillBf16Kernel<<<Blocks(n), 256, 0, stream>>>(p, n, seed);
  return cudaGetLastError();
}

cudaError_t FillRandomFp32(float* p, std::int64_t n, std::uint64_t seed, float scale,
                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillFp32Kernel<<<Blocks(n), 256, 0, stream>>>(p, n, seed, scale);
  return cudaGetLastError();
}

cudaError_t ScrubL2(const void* p, std::int64_t bytes, unsigned* sink, cudaStream_t stream) {
  const std::int64_t n = bytes / 16;
  if (n <= 0) return cudaSuccess;
  ScrubKernel<<<Blocks(n), 256, 0, stream>>>(static_cast<const uint4*>(p), n, sink);
  return cudaGetLastError();
}

}  // namespace logitd::bench
