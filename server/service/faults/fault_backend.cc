#include "server/service/faults/fault_backend.h"

#include <cstddef>
#include <utility>

namespace logitd::service {
namespace {

std::size_t Bytes(std::int64_t rows, std::int64_t cols, DType dtype) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * ElementSize(dtype);
}

class FaultBackend final : public kernels::Backend {
 public:
  FaultBackend(std::unique_ptr<kernels::Backend> inner, std::shared_ptr<FaultInjector> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  kernels::BackendInfo Info() const override { return inner_->Info(); }
  absl::Status Health() const override { return inner_->Health(); }
  std::uint64_t DeviceBytesInUse() const override { return inner_->DeviceBytesInUse(); }
  std::uint64_t DeviceBytesTotal() const override { return inner_->DeviceBytesTotal(); }

 protected:
  absl::StatusOr<kernels::HostBuffer> DoAllocateHost(std::size_t bytes) override {
    return inner_->AllocateHost(bytes);
  }
  absl::StatusOr<std::shared_ptr<void>> DoPinHostMemory(void* data, std::size_t bytes) override {
    return inner_->PinHostMemory(data, bytes);
  }
  absl::StatusOr<std::shared_ptr<kernels::Weight>> DoLoadWeight(const Bf16Bits* w, std::int64_t v,
                                                                std::int64_t k) override {
    return inner_->LoadWeight(w, v, k);
  }

  absl::Status DoReadWeight(const kernels::Weight& w, Bf16Bits* out) override {
    return inner_->ReadWeight(w, out);
  }
  absl::StatusOr<std::shared_ptr<Fp64Products>> DoReferenceProducts(
      const kernels::Weight& w) override {
    return inner_->ReferenceProducts(w);
  }

  std::int64_t LogitsBlockRows(const kernels::Weight& w, std::int64_t m,
                               DType out_dtype) const override {
    return inner_->LogitsBlockRows(w, m, out_dtype);
  }
  std::int64_t LogProbsBlockRows(const kernels::Weight& w, std::int64_t m) const override {
    return inner_->LogProbsBlockRows(w, m);
  }
  std::int64_t CrossEntropyBlockRows(const kernels::Weight& w, std::int64_t m) const override {
    return inner_->CrossEntropyBlockRows(w, m);
  }
  absl::StatusOr<std::uint64_t> DoFetchGradient(kernels::Weight& w, float* out,
                                                bool zero_after_fetch) override {
    absl::StatusOr<std::uint64_t> calls = inner_->FetchGradient(w, out, zero_after_fetch);
    if (calls.ok()) {
      faults_->OnDw(reinterpret_cast<std::byte*>(out), Bytes(w.v(), w.k(), DType::kFp32));
    }
    return calls;
  }

  absl::Status DoZeroGradient(kernels::Weight& w) override { return inner_->ZeroGradient(w); }

  // Every operation's kernel (kernel.h): its outputs by their names, the
  // fault each name takes.
  absl::Status DoKernel(const kernels::KernelOp& op, const void* args,
                        kernels::Timing* timing) override {
    absl::Status s = inner_->RunKernel(op, args, timing);
    if (!s.ok()) return s;
    for (const kernels::KernelOutput& out : op.outputs(args)) {
      if (out.name == "y") faults_->OnLogits(out.dtype, out.data, out.bytes);
      if (out.name == "dx") faults_->OnDx(out.data, out.bytes);
      if (out.name == "dw") faults_->OnDw(out.data, out.bytes);
      if (out.name == "output") faults_->OnCast(out.data, out.bytes);
    }
    return s;
  }

 private:
  const std::unique_ptr<kernels::Backend> inner_;
  const std::shared_ptr<FaultInjector> faults_;
};

}  // namespace

std::unique_ptr<kernels::Backend> WithOutputFaults(std::unique_ptr<kernels::Backend> backend,
                                                   std::shared_ptr<FaultInjector> faults) {
  if (faults == nullptr || !faults->faults().any()) return backend;
  return std::make_unique<FaultBackend>(std::move(backend), std::move(faults));
}

}  // namespace logitd::service
