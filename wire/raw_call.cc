#include "logitd/wire/raw_call.h"

#include "absl/strings/str_cat.h"
#include "logitd/v1/logitd.grpc.pb.h"

namespace logitd::wire {

std::string MethodPath(absl::string_view method) {
  return absl::StrCat("/", v1::Logitd::service_full_name(), "/", method);
}

RawClientCall::RawClientCall(grpc::GenericStub& stub, absl::string_view method,
                             grpc::ClientContext* context)
    : context_(context), stream_(stub.PrepareCall(context, MethodPath(method), &cq_)) {
  Begin(&call_);
  stream_->StartCall(&call_);
  // A call that could not start fails its first operation, and Finish says why.
  Wait(&call_);
}

RawClientCall::~RawClientCall() {
  if (!finished_) {
    context_->TryCancel();
    Finish();
  }
  cq_.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq_.Next(&tag, &ok)) {
  }
}

void RawClientCall::Begin(Op* op) {
  absl::MutexLock lock(&mu_);
  op->done = false;
  op->ok = false;
}

bool RawClientCall::Wait(Op* op) {
  absl::MutexLock lock(&mu_);
  while (!op->done) {
    if (polling_) {
      // The other side is taking completions off the queue; it hands this
      // one over when it comes.
      completed_.Wait(&mu_);
      continue;
    }
    polling_ = true;
    mu_.Unlock();
    void* tag = nullptr;
    bool ok = false;
    const bool got = cq_.Next(&tag, &ok);
    mu_.Lock();
    polling_ = false;
    if (!got) {
      // The queue is shut down: nothing in flight will complete.
      op->done = true;
      op->ok = false;
    } else {
      auto* completed = static_cast<Op*>(tag);
      completed->done = true;
      completed->ok = ok;
    }
    completed_.SignalAll();
  }
  return op->ok;
}

bool RawClientCall::Write(const grpc::ByteBuffer& message) {
  Begin(&write_);
  stream_->Write(message, &write_);
  return Wait(&write_);
}

bool RawClientCall::WritesDone() {
  Begin(&write_);
  stream_->WritesDone(&write_);
  return Wait(&write_);
}

bool RawClientCall::Read(grpc::ByteBuffer* message) {
  Begin(&read_);
  stream_->Read(message, &read_);
  return Wait(&read_);
}

grpc::Status RawClientCall::Finish() {
  grpc::Status status;
  Begin(&call_);
  stream_->Finish(&status, &call_);
  Wait(&call_);
  finished_ = true;
  return status;
}

}  // namespace logitd::wire
