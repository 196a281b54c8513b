// One ModelInfer call of the Open Inference Protocol, as the front door
// translates it: its inputs bound (in raw_input_contents or in a system
// shared-memory region) and handed to the protocol-neutral call as
// CallInputs, its requested outputs read, and the Transport that places the
// outputs in the response (raw_output_contents in the outputs' order, or
// their region's parameters) within the message limits. A model
// (oip_service.cc) builds the request of its operation from these, runs it
// (call/ops.h) on call(), then calls Finish.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kserve/grpc_predict_v2.pb.h"
#include "logitd/tensor.h"
#include "server/service/call/call.h"
#include "server/service/oip/oip_shm.h"
#include "server/service/shared/shared_state.h"

namespace logitd::service {

class OipInferCall final : public Transport {
 public:
  using InputTensor = inference::ModelInferRequest::InferInputTensor;

  // Not owning: everything outlives the call. `rpc` is logitd's streaming
  // RPC that serves the same operation, named when a message is too large.
  OipInferCall(SharedState* state, const OipShmRegions* regions, grpc::ServerContext* context,
               const inference::ModelInferRequest& request, inference::ModelInferResponse* response,
               CallStats* stats, absl::string_view rpc);
  OipInferCall(const OipInferCall&) = delete;
  OipInferCall& operator=(const OipInferCall&) = delete;

  const inference::ModelInferRequest& request() const { return request_; }
  Call& call() { return call_; }

  // Binds the request's inputs: each named in `names` and given once, its
  // bytes in raw_input_contents (in order, skipping the inputs in shared
  // memory) or in a region, never in typed contents. InvalidArgument
  // starting with `expected` (the model's inputs) otherwise.
  absl::Status BindInputs(std::initializer_list<absl::string_view> names,
                          absl::string_view expected);
  // The bound input `name` as the call takes it; not given when the request
  // has none.
  CallInput Input(absl::string_view name) const;

  // Reads the request's `outputs`: each named in `names` and asked once;
  // InvalidArgument naming `model` otherwise. `renamed` maps the names the
  // operation gives its outputs to the model's, where they differ.
  absl::Status BindRequestedOutputs(std::initializer_list<absl::string_view> names,
                                    absl::string_view model,
                                    std::map<std::string, std::string> renamed = {});
  // Whether the request names output `name` (the model's name).
  bool requested(absl::string_view name) const;
  // The requested outputs that go to a region, by the operation's names.
  CallOutputs Outputs() const;

  // Transport: the request, and the response's outputs that travel in it,
  // within the server's message limits (ResourceExhausted naming the limit,
  // the rows that fit, and the streaming RPC that does the same); each
  // output placed in the response in order, when returned.
  absl::Status CheckSlots(const std::vector<InputSlot>& inputs,
                          const std::vector<OutputSlot>& outputs) override;
  std::byte* PlaceOutput(const OutputSlot& out) override;

  // Sets the response's name, version and id, and the call's byte counts.
  void Finish();

 private:
  struct Bound {
    const InputTensor* tensor = nullptr;
    // Null when in shared memory.
    const std::string* raw = nullptr;
    std::optional<OipShmRef> shm;
  };
  struct Requested {
    std::string name;
    std::optional<OipShmRef> shm;
  };

  // The model's name of the operation's output `name`.
  std::string ModelName(absl::string_view name) const;
  const Requested* FindRequested(absl::string_view model_name) const;
  // Returned in the response: named by the request, or the request names none.
  bool Returned(absl::string_view model_name) const;

  SharedState* const state_;
  const OipShmRegions* regions_;
  const inference::ModelInferRequest& request_;
  inference::ModelInferResponse* response_;
  CallStats* stats_;
  const std::string rpc_;
  std::vector<std::pair<std::string, Bound>> inputs_;
  std::vector<Requested> requested_;
  std::map<std::string, std::string> renamed_;
  Call call_;
};

}  // namespace logitd::service
