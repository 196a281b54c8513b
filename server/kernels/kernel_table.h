// Where a backend keeps its kernels (kernel.h): each backend class B has one
// table, filled before main by the files that define its kernels, and its
// DoKernel runs what the table holds for the operation. A kernel is the
// specialization KernelOf<B, Args>, which the backend class befriends once
// for all operations:
//
//   template <>
//   struct KernelOf<CpuBackend, CastArgs> {
//     static absl::Status Run(CpuBackend& backend, const CastArgs& args, Timing* timing);
//   };
//   LOGITD_KERNEL(CpuBackend, CastArgs);
//
// A backend library whose kernels register themselves is linked whole
// (CMake's WHOLE_ARCHIVE), so that no kernel file is left out of a binary
// for want of a symbol that names it.
#pragma once

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/kernels/backend.h"
#include "server/kernels/kernel.h"

namespace logitd::kernels {

// Backend B's kernel of the operation whose arguments are Args: a struct
// with `static absl::Status Run(B&, const Args&, Timing*)`.
template <typename B, typename Args>
struct KernelOf;

template <typename B>
class KernelTable {
 public:
  using Fn = absl::Status (*)(B& backend, const void* args, Timing* timing);

  static KernelTable& Get() {
    static KernelTable table;
    return table;
  }

  // Before main only (static initialization), so the table is read without
  // a lock afterwards.
  bool Add(const KernelOp* op, Fn fn) {
    entries_.emplace_back(op, fn);
    return true;
  }

  // The backend's kernel of `op`; Unimplemented naming the operation where
  // it has none.
  absl::Status Run(B& backend, const KernelOp& op, const void* args, Timing* timing) const {
    for (const auto& [entry, fn] : entries_) {
      if (entry == &op) return fn(backend, args, timing);
    }
    return absl::UnimplementedError(
        absl::StrCat(backend.Info().backend, " backend has no ", op.name, " kernel"));
  }

 private:
  std::vector<std::pair<const KernelOp*, Fn>> entries_;
};

template <typename B, typename Args>
bool AddKernel() {
  return KernelTable<B>::Get().Add(&KernelOpOf<Args>(), [](B& b, const void* args, Timing* t) {
    return KernelOf<B, Args>::Run(b, *static_cast<const Args*>(args), t);
  });
}

}  // namespace logitd::kernels

// Registers KernelOf<B, Args> in B's table; at namespace scope, after the
// specialization. B and Args are unqualified names (they make the
// registration's own name, unique in a unity batch).
#define LOGITD_KERNEL(B, Args) \
  [[maybe_unused]] static const bool kKernelOf##B##Args = ::logitd::kernels::AddKernel<B, Args>()
