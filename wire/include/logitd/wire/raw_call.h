// The raw-stream transport of logitd.v1's tensor calls, the client's side,
// on gRPC's public API: a call made through grpc::GenericStub as a stream of
// ByteBuffers (see chunk_message.h for what travels in them), and the names
// and sizes both ends share.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace logitd::wire {

// Trailing metadata of a tensor call: the server's time split
// ("queue_us=..,receive_us=..,..."), and the GEMM configurations it ran
// ("; "-separated "shape: configuration" entries; cuda only).
inline constexpr absl::string_view kTimingTrailer = "logitd-timing";
inline constexpr absl::string_view kGemmTrailer = "logitd-gemm";

// A logitd.v1.Logitd method's path, e.g. "/logitd.v1.Logitd/Logits".
std::string MethodPath(absl::string_view method);

// One call of a logitd.v1 method as a bidirectional stream of raw messages:
// each operation waits for its completion on the call's own completion
// queue. One thread may write (Write, WritesDone) while another reads
// (Read); Finish comes after both. A server-streaming method (FetchGradient)
// is called the same way, writing its one request: the same messages on the
// wire. The call is cancelled if it is destroyed before Finish.
class RawClientCall {
 public:
  RawClientCall(grpc::GenericStub& stub, absl::string_view method, grpc::ClientContext* context);
  ~RawClientCall();
  RawClientCall(const RawClientCall&) = delete;
  RawClientCall& operator=(const RawClientCall&) = delete;

  // False when the call is over (read the reason with Finish).
  bool Write(const grpc::ByteBuffer& message);
  bool WritesDone();
  // False at the end of the response stream.
  bool Read(grpc::ByteBuffer* message);
  grpc::Status Finish();

 private:
  // An operation in flight; its address is its tag.
  struct Op {
    bool done = false;
    bool ok = false;
  };
  // Marks `op` as started (before it is handed to gRPC).
  void Begin(Op* op) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for `op` to complete, taking whichever completion comes first off
  // the queue (the other side's too) until it is this one's; its success.
  bool Wait(Op* op) ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ClientContext* const context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream_;
  bool finished_ = false;
  absl::Mutex mu_;
  absl::CondVar completed_;
  // Whether a thread is in cq_.Next, and each operation's state; mu_ guards
  // them (the operations' addresses go to gRPC as tags, their fields are
  // read and written only under mu_).
  bool polling_ ABSL_GUARDED_BY(mu_) = false;
  Op read_ ABSL_GUARDED_BY(mu_);
  Op write_ ABSL_GUARDED_BY(mu_);
  Op call_ ABSL_GUARDED_BY(mu_);
};

}  // namespace logitd::wire
