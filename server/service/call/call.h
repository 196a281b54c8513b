// One tensor call as the service runs it, whichever front door it came in
// by: its input and output slots (streamed, in the request or response
// message, or a slice of a shared-memory region), one admission for all its
// bytes, the inputs made ready for the backend (copied out of a region and
// checked against their digest, received through the front door's
// transport), the outputs placed, and the timing. An operation (ops.h)
// declares the slots its plan needs and runs the backend on in()/out(); the
// front door then delivers the outputs its own way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "logitd/tensor.h"
#include "server/kernels/backend.h"
#include "server/service/call/request.h"
#include "server/service/call/row_blocks.h"
#include "server/service/call/stats.h"
#include "server/service/state/admission.h"
#include "server/service/state/registry.h"
#include "server/service/state/shm.h"

namespace logitd::service {

// An input slot: what the request said of the tensor and, once the call is
// admitted, the host buffer the backend reads.
struct InputSlot {
  std::string name;
  CallInput in;
  std::uint64_t bytes = 0;
  std::optional<ShmSlice> slice;
  kernels::HostBuffer buffer;
  // Where the backend reads: `buffer`, or the request message itself.
  const std::byte* data = nullptr;
};

// An output slot: its dtype, shape and size, where it goes and where the
// backend writes it.
struct OutputSlot {
  std::string name;
  DType dtype = DType::kFp32;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes = 0;
  // A shared-memory slot the request asked for, resolved.
  std::optional<ShmSlice> slice;
  // Where the backend writes: the slice itself, the front door's place in
  // its response (Transport::PlaceOutput), or `buffer`.
  std::byte* data = nullptr;
  kernels::HostBuffer buffer;
};

// What a call reports besides its outputs.
struct OpResult {
  kernels::Timing timing;
  // Figures the result carries besides the outputs and the timing, each
  // named as the field of the front door's result that takes it
  // (CrossEntropy: "counted_tokens", the tokens not ignored).
  std::vector<std::pair<std::string, std::int64_t>> figures;
  // Run in blocks of rows (Call::RunInRowBlocks): the result and the outputs
  // went out as the blocks ran, and the front door has nothing left to send.
  bool sent = false;
};

// What a front door does that the call cannot: take in the bytes that
// follow its request, and place outputs in its response.
class Transport {
 public:
  virtual ~Transport() = default;
  // Called once the slots are declared, before admission: limits of the
  // front door's own (the Open Inference Protocol's one message a tensor).
  virtual absl::Status CheckSlots(const std::vector<InputSlot>& inputs,
                                  const std::vector<OutputSlot>& outputs) {
    return absl::OkStatus();
  }
  // Receives every input whose bytes follow the request (From::kStream)
  // into its slot's buffer, checked against its digest.
  virtual absl::Status ReceiveStreamed(std::vector<InputSlot*> streamed) {
    if (streamed.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        streamed.front()->name, ": this protocol carries a tensor in its message only"));
  }
  // Told of every output in declaration order once the inputs are in:
  // where the backend writes one that is not in shared memory, in the front
  // door's response; null for a host buffer of the call's own (streamed
  // after the result, or not returned at all).
  virtual std::byte* PlaceOutput(const OutputSlot& out) { return nullptr; }

  // Whether StartReceive, StopReceiving and FinishReceive work for any call
  // of this front door (Call::ReceiveWhile), its request's choices aside.
  virtual bool ReceivesAside() const { return false; }
  // Blocks of rows (Call::RunInRowBlocks), for a front door whose request
  // asked for them and that can receive, and send, while the backend works.
  virtual bool Pipelined() const { return false; }
  // Starts receiving the streamed inputs on a thread of the front door's,
  // telling `progress` as their bytes land and when reception ends (every
  // digest checked, or why not).
  virtual absl::Status StartReceive(std::vector<InputSlot*> streamed, InputProgress* progress) {
    return absl::InternalError("this front door does not receive while a call runs");
  }
  // Waits for the reception StartReceive began: its status.
  virtual absl::Status FinishReceive() { return absl::OkStatus(); }
  // The call failed while receiving: the rest of its request is not taken
  // in, so that FinishReceive returns without waiting for the client to send
  // it, and the call's status reaches the client at once.
  virtual void StopReceiving() {}
  // Once the outputs are placed, before the first block: sends what
  // precedes the outputs (the result, with `early` in it and the digests of
  // streamed outputs to follow them), then streams each streamed output as
  // the rows of `m` it covers are done (RowsDone), on a thread of its own.
  virtual absl::Status StartSend(const OpResult& early, std::int64_t m) {
    return absl::InternalError("this front door does not send while a call runs");
  }
  // Rows [0, rows) of every output are written.
  virtual void RowsDone(std::int64_t rows) {}
  // After the last block: `computed` is OK when every block and the
  // reception were. Stops or finishes the streaming; when everything was OK
  // sends the outputs' digests (nothing a client may accept goes out
  // otherwise). Returns the call's status.
  virtual absl::Status FinishSend(absl::Status computed) { return computed; }
};

// What a call uses of the service, which owns it all.
struct CallEnv {
  kernels::Backend* backend = nullptr;
  RequestAdmission* admission = nullptr;
  // --shm_in_place (ReadInPlace).
  bool shm_in_place = false;
};

class Call {
 public:
  // `deadline` and `cancelled` bound the wait for admission.
  Call(const CallEnv& env, const Tenant& tenant, absl::Time deadline,
       std::function<bool()> cancelled, CallStats* stats);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Declaring the slots, after the request is validated and before any
  // work. An input takes exactly `bytes`; its shared-memory slice (or its
  // bytes in the message) are checked against that here. An output goes to
  // the shared-memory slot `outputs` names for it, else to the front door.
  absl::Status Input(absl::string_view name, const CallInput& in, std::uint64_t bytes);
  absl::Status Output(absl::string_view name, DType dtype, std::vector<std::int64_t> shape,
                      std::uint64_t bytes, const CallOutputs& outputs);
  // Request memory the call takes besides its slots (scratch of its own).
  void Scratch(std::uint64_t bytes) { scratch_bytes_ += bytes; }
  // For an operation that checks them (CheckInPlace) before its outputs go
  // out: with --shm_in_place, inputs in shared memory (aligned for their
  // dtype) are read where they lie, take no request memory, and are hashed
  // on a thread of the call's own while the backend works.
  void ReadInPlace() { read_in_place_ = env_.shm_in_place; }
  // Waits for that hashing: DataLoss naming the input whose bytes are not
  // the ones its spec describes. OK when nothing is read in place.
  absl::Status CheckInPlace();

  // The front door's checks, then one admission for every slot's bytes and
  // the scratch (waiting at most until the deadline; a wait is the call's
  // queue time); then the inputs: copied out of their region and checked
  // against their digest (DataLoss when the region changed), read in place
  // from the message when aligned, received through `transport`; then the
  // outputs placed.
  absl::Status Receive(absl::string_view what, Transport& transport);
  // Receive's admission and inputs, but the streamed inputs arrive on the
  // front door's thread while `early` runs on this one: it may wait for
  // whole inputs (`whole`, at once for one not streamed) and work on them
  // while the rest arrive. Their digests are checked once every input is in
  // (DataLoss then ends the call, and nothing `early` formed may be used); a
  // failure of early's stops the reception and is the call's status. A
  // front door that cannot receive aside (Transport::ReceivesAside) takes
  // every input first, then runs `early`. Then the outputs placed, as
  // Receive.
  using WaitWhole = std::function<absl::Status(absl::string_view slot)>;
  absl::Status ReceiveWhile(absl::string_view what, Transport& transport,
                            const std::function<absl::Status(const WaitWhole& whole)>& early);
  // Whether RunInRowBlocks overlaps this call with its front door: the
  // front door asked for it and at least one input is streamed.
  bool Pipelines(const Transport& transport) const;
  // A block: rows [r0, r0 + rows) of every input to every output.
  using Block =
      std::function<absl::Status(std::int64_t r0, std::int64_t rows, kernels::Timing* timing)>;
  // Receive's admission and inputs, but the streamed inputs arrive while
  // `block` runs over rows [0, m) in blocks of `block_rows` (the last one
  // takes the rest), each as soon as its rows of every input are in; the
  // outputs go out as the blocks finish. `early` is what the result says
  // before the first block. The inputs are let go and the outputs finished
  // (as Finish) after the last block. Returns the blocks' timing summed, with
  // `sent` set: the front door has nothing left to send.
  absl::StatusOr<OpResult> RunInRowBlocks(absl::string_view what, Transport& transport,
                                          std::int64_t m, std::int64_t block_rows, OpResult early,
                                          const Block& block);
  // What an operation does around its blocks (CrossEntropy's).
  struct RowBlockSteps {
    // Waits until every byte of input `slot` is in place (at once for one
    // not streamed); not yet checked against its digest.
    using WaitWhole = Call::WaitWhole;
    // Before the result goes out: may wait for whole inputs and say more in
    // the result (the tokens the targets count). A failure ends the call
    // before any block.
    std::function<absl::Status(const WaitWhole& whole, OpResult* early)> before;
    // After the last block succeeded, before the outputs are finished: the
    // outputs formed from every block's (a reduced loss).
    std::function<absl::Status()> after;
  };
  absl::StatusOr<OpResult> RunInRowBlocks(absl::string_view what, Transport& transport,
                                          std::int64_t m, std::int64_t block_rows, OpResult early,
                                          const Block& block, const RowBlockSteps& steps);

  // The outputs placed (Receive's last step), for a call that takes no
  // request memory (FetchGradient: its buffer counts against the weight
  // budget already).
  absl::Status AllocateOutputs(Transport& transport);

  // The bytes of input or output `name` (declared, else null).
  template <typename T = std::byte>
  const T* in(absl::string_view name) const {
    return reinterpret_cast<const T*>(InData(name));
  }
  template <typename T = std::byte>
  T* out(absl::string_view name) const {
    return reinterpret_cast<T*>(OutData(name));
  }
  // The xxh3-64 the request gave for input `name`: in its spec, or (once
  // received) after its chunks; nullopt for none (or no such input).
  std::optional<std::uint64_t> InputDigest(absl::string_view name) const;
  // Lets go of the input buffers once the backend is done with them, so that
  // they are not held while the response goes out.
  void ReleaseInputs();
  // Outputs written aside (a region slice not aligned for its dtype) copied
  // into their region, and the backend's timing into the call's stats.
  void Finish(const kernels::Timing& timing);

  const std::vector<InputSlot>& inputs() const { return inputs_; }
  std::vector<OutputSlot>& outputs() { return outputs_; }
  CallStats* stats() const { return stats_; }
  const Tenant& tenant() const { return tenant_; }

 private:
  const std::byte* InData(absl::string_view name) const;
  std::byte* OutData(absl::string_view name) const;
  absl::Status FillInput(InputSlot* slot);
  // Receive's checks, admission and inputs but the streamed ones, which it
  // returns.
  absl::StatusOr<std::vector<InputSlot*>> Admit(absl::string_view what, Transport& transport);

  const CallEnv env_;
  const Tenant tenant_;
  const absl::Time deadline_;
  const std::function<bool()> cancelled_;
  CallStats* const stats_;
  std::vector<InputSlot> inputs_;
  std::vector<OutputSlot> outputs_;
  std::uint64_t scratch_bytes_ = 0;
  std::optional<AdmissionTicket> ticket_;
  bool read_in_place_ = false;
  // The hashing of the inputs read in place, and what it found.
  std::thread in_place_hasher_;
  absl::Status in_place_status_;
  // An input read in place: in a region, aligned, with a digest to check.
  bool InPlace(const InputSlot& slot) const;
};

}  // namespace logitd::service
