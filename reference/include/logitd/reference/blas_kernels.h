// OpenBLAS picks its kernels for the CPU when the library loads. Under some
// hypervisors it does not recognise the CPU (a generic model name) and falls
// back to its oldest x86-64 kernels, Prescott's (SSE3): on a 2-core AVX-512
// virtual machine a dgemm then runs 2.75x slower than with the SkylakeX
// kernels the CPU can run (docs/OPERATIONS.md). OPENBLAS_CORETYPE overrides
// the choice, but only before the library loads, hence a restart of the
// program.
#pragma once

#include <string>

namespace logitd {

// The OpenBLAS core type to ask for on a CPU with these features when
// OpenBLAS chose `detected`: "SkylakeX" (AVX-512 F, BW, DQ, VL), "Haswell"
// (AVX2 and FMA), or empty when `detected` is as good (or not an Intel
// x86-64 core type this rule knows: AMD's are left alone).
std::string BetterBlasCore(const std::string& detected, bool avx2_fma, bool avx512);

// Called first thing in main(), before any thread starts: when OpenBLAS
// chose kernels older than the CPU runs and OPENBLAS_CORETYPE is not set,
// sets it and executes the program again with the same arguments (it does
// not return then). Otherwise returns a sentence for the log: what was
// chosen and why, or empty when nothing was changed.
std::string UseBestBlasKernels(char** argv);

}  // namespace logitd
