#include "logitd/reference/blas_kernels.h"

#include <cblas.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace logitd {
namespace {

// Set, with the core type OpenBLAS first chose, in the program executed
// again: so that it can say why.
constexpr char kDetectedEnv[] = "LOGITD_BLAS_DETECTED_CORE";

// Intel x86-64 core types OpenBLAS may fall back to, oldest first, up to
// the two this rule picks.
constexpr std::array<const char*, 7> kOlderThanHaswell = {
    "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge"};

bool Among(const std::string& name, const char* const* begin, const char* const* end) {
  return std::any_of(begin, end, [&](const char* n) { return name == n; });
}

}  // namespace

std::string BetterBlasCore(const std::string& detected, bool avx2_fma, bool avx512) {
  const bool older_than_haswell = Among(detected, kOlderThanHaswell.data(),
                                        kOlderThanHaswell.data() + kOlderThanHaswell.size());
  if (avx512 && (older_than_haswell || detected == "Haswell")) return "SkylakeX";
  if (avx2_fma && older_than_haswell) return "Haswell";
  return "";
}

std::string UseBestBlasKernels(char** argv) {
  const char* detected_before = getenv(kDetectedEnv);
  const char* forced = getenv("OPENBLAS_CORETYPE");
  const char* name = openblas_get_corename();
  const std::string core = name != nullptr ? name : "";
  if (detected_before != nullptr && forced != nullptr) {
    std::string note = absl::StrCat("OpenBLAS kernels: ", core, " (OPENBLAS_CORETYPE=", forced,
                                    "; on its own OpenBLAS chose ", detected_before,
                                    ", older than this CPU runs)");
    unsetenv(kDetectedEnv);
    return note;
  }
  if (forced != nullptr) return "";
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const std::string better = BetterBlasCore(core, avx2_fma, avx512);
  if (better.empty() || argv == nullptr || argv[0] == nullptr) return "";
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv(kDetectedEnv, core.c_str(), 1);
  execv("/proc/self/exe", argv);
  // Not executed again (no /proc, say): keep going with what was chosen.
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kDetectedEnv);
  return absl::StrCat("OpenBLAS kernels: ", core, " (", better,
                      " would be faster on this CPU; set OPENBLAS_CORETYPE=", better, ": ",
                      std::strerror(errno), ")");
#else
  return "";
#endif
}

}  // namespace logitd
