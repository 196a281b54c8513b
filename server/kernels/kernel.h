// An operation's kernel as the Backend interface knows it: by the type of
// its arguments, with no entry point of its own on Backend. An operation
// declares its arguments in server/kernels/ops/<op>.h (a struct with a
// `kName`, and beside it `CheckArgs` and `OutputsOf`); each backend defines
// its kernel in a file of its own and registers it (kernel_table.h);
// callers run it with Backend::Kernel(args, &timing). A backend without the
// kernel answers Unimplemented, naming the operation.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "logitd/tensor.h"

namespace logitd::kernels {

// One output a kernel writes: what a layer in front of a backend reads or
// changes after the call (the test faults) without knowing the arguments'
// type.
struct KernelOutput {
  // The output's name in the operation's result ("y", "dx", "dw", "output").
  absl::string_view name;
  DType dtype = DType::kFp32;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// An operation's kernel, its arguments' type erased: one object per type
// (KernelOpOf), whose address identifies the operation.
struct KernelOp {
  // For messages: "cast to bf16".
  absl::string_view name;
  // The checks every backend makes before its kernel runs (the arguments'
  // CheckArgs): InvalidArgument naming the operation and the argument.
  absl::Status (*check)(const void* args) = nullptr;
  // The outputs the arguments point at (OutputsOf).
  std::vector<KernelOutput> (*outputs)(const void* args) = nullptr;
};

// The one KernelOp of the arguments' type `Args`, which has
// `static constexpr absl::string_view kName`, and beside it
// `absl::Status CheckArgs(const Args&)` and
// `std::vector<KernelOutput> OutputsOf(const Args&)`.
template <typename Args>
const KernelOp& KernelOpOf() {
  static const KernelOp op{
      Args::kName,
      [](const void* args) -> absl::Status { return CheckArgs(*static_cast<const Args*>(args)); },
      [](const void* args) { return OutputsOf(*static_cast<const Args*>(args)); }};
  return op;
}

}  // namespace logitd::kernels
