// One ModelInfer call of the Open Inference Protocol, whatever the model:
// its inputs found (in raw_input_contents or in a system shared-memory
// region), its outputs placed (in raw_output_contents or in a region), the
// message limits, admission and the response's framing. A model
// (oip_service.cc) binds and checks the tensors it takes, declares its
// outputs, calls Start, runs the backend on InputData and OutputData, and
// calls Finish.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kserve/grpc_predict_v2.pb.h"
#include "logitd/tensor.h"
#include "server/kernels/backend.h"
#include "server/service/oip_shm.h"
#include "server/service/service.h"

namespace logitd::service {

// The Open Inference Protocol's datatype of `dtype`: "BF16", "FP32", ...
std::string OipDatatype(DType dtype);

class OipInferCall {
 public:
  using InputTensor = inference::ModelInferRequest::InferInputTensor;

  // Not owning: everything outlives the call.
  OipInferCall(const ServiceCore& core, const OipShmRegions* regions, grpc::ServerContext* context,
               const inference::ModelInferRequest& request, inference::ModelInferResponse* response,
               CallStats* stats);
  OipInferCall(const OipInferCall&) = delete;
  OipInferCall& operator=(const OipInferCall&) = delete;

  const inference::ModelInferRequest& request() const { return request_; }

  // Binds the request's inputs: each named in `names` and given once, its
  // bytes in raw_input_contents (in order, skipping the inputs in shared
  // memory) or in a region, never in typed contents. InvalidArgument
  // starting with `expected` (the model's inputs) otherwise.
  absl::Status BindInputs(std::initializer_list<absl::string_view> names,
                          absl::string_view expected);
  // The bound input `name`; null when the request has none.
  const InputTensor* input(absl::string_view name) const;
  // Sets the bytes input `name` takes, from its datatype and shape; every
  // bound input needs them. InvalidArgument after `expected` when its
  // raw_input_contents hold another number of bytes (a region's
  // shared_memory_byte_size is checked when Start resolves it).
  absl::Status CheckInputBytes(absl::string_view name, std::uint64_t bytes,
                               absl::string_view expected);

  // Reads the request's `outputs`: each named in `names` and asked once;
  // InvalidArgument naming `model` otherwise.
  absl::Status BindRequestedOutputs(std::initializer_list<absl::string_view> names,
                                    absl::string_view model);
  // Whether the request names output `name`.
  bool requested(absl::string_view name) const;
  // Declares an output the backend writes. The response carries it when the
  // request names it or names no outputs.
  void AddOutput(absl::string_view name, DType dtype, std::vector<std::int64_t> shape);

  // The request, and the response's outputs that travel in it, within the
  // server's message limits: ResourceExhausted naming the limit, the rows of
  // M that fit, and `rpc`, logitd's streaming call that does the same.
  absl::Status CheckMessageSizes(std::int64_t m, absl::string_view rpc) const;
  // Resolves the tensors' shared-memory slices, admits the call (its tensors
  // plus `scratch_bytes`) and places the outputs.
  absl::Status Start(std::uint64_t scratch_bytes);
  // After Start: input `name`'s bytes, `align`-aligned: copied out of its
  // region (so that what is computed is what was checked, as logitd.v1's
  // calls do), and out of raw_input_contents only when misaligned.
  absl::StatusOr<const std::byte*> InputData(absl::string_view name, std::size_t align);
  // After Start: where the backend writes output `name`; null when the call
  // declared none.
  std::byte* OutputData(absl::string_view name) const;
  // Copies outputs written aside into their regions, sets the response's
  // name, version and id, and the call's stats from `timing`.
  void Finish(const kernels::Timing& timing);

 private:
  struct Input {
    const InputTensor* tensor = nullptr;
    // Null when in shared memory.
    const std::string* raw = nullptr;
    std::optional<OipShmRef> shm;
    // The bytes its datatype and shape take (CheckInputBytes).
    std::uint64_t want = 0;
    ShmSlice slice;
    kernels::HostBuffer copy;
  };
  struct Output {
    std::string name;
    DType dtype = DType::kFp32;
    std::vector<std::int64_t> shape;
    std::uint64_t bytes = 0;
    bool returned = false;
    std::optional<OipShmRef> shm;
    ShmSlice slice;
    // The backend's output when not written in place: an output that is not
    // returned, or a region's slice that is not aligned for its dtype.
    kernels::HostBuffer aside;
    std::byte* data = nullptr;
  };
  struct Requested {
    std::string name;
    std::optional<OipShmRef> shm;
  };

  std::uint64_t TensorBytes() const;
  absl::Status PlaceOutput(Output* out);

  ServiceCore core_;
  const OipShmRegions* regions_;
  grpc::ServerContext* context_;
  const inference::ModelInferRequest& request_;
  inference::ModelInferResponse* response_;
  CallStats* stats_;
  std::vector<std::pair<std::string, Input>> inputs_;
  std::vector<Requested> requested_;
  std::vector<Output> outputs_;
  AdmissionTicket ticket_;
};

}  // namespace logitd::service
