// The tensor calls served as raw byte streams through gRPC's public callback
// API (the methods the service marks generic, served by its callback generic
// service, and the generated WithRawCallbackMethod_* ones), and read and written
// by handlers that block.
//
// A handler reads a request stream chunk by chunk, hands the tensors to the
// backend and streams the outputs back; written as straight-line code that
// blocks, it stays short. gRPC's callback threads must not block, so each
// call's handler runs on a thread of CallThreads, and the reactor turns each
// blocking Read and Write into one callback operation it waits for.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include <cstddef>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace logitd::service {

// One call's stream of raw messages, as its handler sees it. Read returns
// false at the end of the request stream (or when the call is gone); Write
// returns false when the client is gone.
class RawStream {
 public:
  virtual ~RawStream() = default;
  virtual bool Read(grpc::ByteBuffer* message) = 0;
  virtual bool Write(const grpc::ByteBuffer& message) = 0;
  // The call has failed: what the client still sends is not read (the
  // status goes out without waiting for the rest of a large request), and
  // Read returns false from now on.
  virtual void StopReading() {}
};

// A handler: runs on its own thread, returns the call's status.
using RawHandler = std::function<grpc::Status(grpc::CallbackServerContext*, RawStream*)>;

// Threads for the handlers: a free one takes the next call, otherwise a new
// one starts, up to `max_threads`; a thread free for a while exits. The
// destructor waits for every thread to finish.
class CallThreads {
 public:
  explicit CallThreads(int max_threads) : max_threads_(max_threads) {}
  ~CallThreads();
  CallThreads(const CallThreads&) = delete;
  CallThreads& operator=(const CallThreads&) = delete;

  // Runs `work` on a thread; false (and `work` not run) when max_threads
  // calls are running already.
  bool Run(std::function<void()> work);
  int max_threads() const { return max_threads_; }

 private:
  void Work();

  const int max_threads_;
  // mu_ guards the calls waiting for a thread, the threads' counts and the
  // stop; wake_ tells the threads of a call or the stop, exited_ tells the
  // destructor of a thread's end.
  absl::Mutex mu_;
  absl::CondVar wake_;
  absl::CondVar exited_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int threads_ ABSL_GUARDED_BY(mu_) = 0;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

// The reactor of a bidirectional raw call that runs `handler` on `threads`.
// gRPC deletes it when the call is done.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServeBidi(
    grpc::CallbackServerContext* context, CallThreads* threads, RawHandler handler);

// The reactor of a client-streaming raw call (one response message): the
// handler's one Write sets `*response`, sent when the call finishes OK.
grpc::ServerReadReactor<grpc::ByteBuffer>* ServeClientStreaming(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response, CallThreads* threads,
    RawHandler handler);

// The reactor of a server-streaming raw call (one request message): the
// handler's first Read gives `request`, the next one the end of the stream.
grpc::ServerWriteReactor<grpc::ByteBuffer>* ServeServerStreaming(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request, CallThreads* threads,
    RawHandler handler);

}  // namespace logitd::service
