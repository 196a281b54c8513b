// The backend's own device kernels, behind a plain C++ interface so that the
// code calling them compiles with the host compiler: the fp32 -> bf16 cast
// that defines G = bf16(dY), and the scale applied when alpha must follow the
// accumulation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace logitd::kernels::cuda {

// out[i] = logitd::FloatToBf16(in[i]) bit for bit: round to nearest even,
// NaN stays NaN (quieted, sign kept), overflow to +-Inf. 16-byte loads and
// stores when both pointers are 16-byte aligned, a scalar path otherwise.
// Returns the launch status.
cudaError_t LaunchCastFp32ToBf16(const float* in, std::int64_t n, std::uint16_t* out,
                                 cudaStream_t stream);

// out[i] = in[i] * scale in fp32, written as fp32 (in place allowed) or
// rounded once to bf16 (out_bf16). Used for alpha == 0, where the GEMM
// library may skip reading the operands and so lose IEEE's 0 * Inf = NaN.
cudaError_t LaunchScale(const float* in, std::int64_t n, float scale, void* out, bool out_bf16,
                        cudaStream_t stream);

// out[i] = in[i] widened exactly from bf16 to fp64 and, when out_abs is not
// null, out_abs[i] = |in[i]|: the operands of the references' fp64 products.
// *non_finite (when not null) is set to 1 if any in[i] is NaN or infinite,
// and left as it was otherwise.
cudaError_t LaunchWidenBf16(const std::uint16_t* in, std::int64_t n, double* out, double* out_abs,
                            unsigned int* non_finite, cudaStream_t stream);
// out[i] = in[i] rounded once to bf16 (FloatToBf16's bits) and widened
// exactly to fp64, out_abs[i] = |out[i]|: G = bf16(dY) of an fp32 dY as the
// references take it. *non_finite is set to 1 if any rounded value is NaN
// or infinite (an fp32 past bf16's range rounds to an infinity).
cudaError_t LaunchRoundWidenFp32(const float* in, std::int64_t n, double* out, double* out_abs,
                                 unsigned int* non_finite, cudaStream_t stream);
// out[i] = |in[i]|.
cudaError_t LaunchAbsDouble(const double* in, std::int64_t n, double* out, cudaStream_t stream);

// Test faults only (kTestDeviceTrap, kTestDeviceHang), in builds with
// LOGITD_ENABLE_TEST_FAULTS (LOGITD_TEST_FAULTS defined): a kernel that traps,
// which poisons the context as a real device fault does, and one that spins
// for `seconds` of device time before it returns, as a hung kernel would
// (bounded, so that even a forgotten one ends).
cudaError_t LaunchTestTrap(cudaStream_t stream);
cudaError_t LaunchTestSpin(double seconds, cudaStream_t stream);

}  // namespace logitd::kernels::cuda
