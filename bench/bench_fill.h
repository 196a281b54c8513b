// Device-side fill for the benchmark: gigabytes of random bf16 operands
// generated where they are used, instead of on the host and copied.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace logitd::bench {

// p[i] = a bf16 value uniform in (-1, 1), never zero, from a counter-based
// hash of (seed, i): the same seed gives the same tensor.
cudaError_t FillRandomBf16(std::uint16_t* p, std::int64_t n, std::uint64_t seed,
                           cudaStream_t stream);
// p[i] = uniform in (-scale, scale) fp32 with full mantissas, never zero.
cudaError_t FillRandomFp32(float* p, std::int64_t n, std::uint64_t seed, float scale,
                           cudaStream_t stream);

// Reads n 16-byte words and writes nothing (unless their xor is a value no
// fill produces), leaving L2 full of clean lines: run before every timed
// sample so that no variant pays for the write-back of another's output.
cudaError_t ScrubL2(const void* p, std::int64_t bytes, unsigned* sink, cudaStream_t stream);

}  // namespace logitd::bench
