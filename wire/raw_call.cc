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
  stream_->StartCall(this);
  // A call that could not start fails its first operation, and Finish says why.
  Wait();
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

bool RawClientCall::Wait() {
  void* tag = nullptr;
  bool ok = false;
  // One operation is in flight at a time: the next event is its completion.
  if (!cq_.Next(&tag, &ok)) return false;
  return ok;
}

bool RawClientCall::Write(const grpc::ByteBuffer& message) {
  stream_->Write(message, this);
  return Wait();
}

bool RawClientCall::WritesDone() {
  stream_->WritesDone(this);
  return Wait();
}

bool RawClientCall::Read(grpc::ByteBuffer* message) {
  stream_->Read(message, this);
  return Wait();
}

grpc::Status RawClientCall::Finish() {
  grpc::Status status;
  stream_->Finish(&status, this);
  Wait();
  finished_ = true;
  return status;
}

}  // namespace logitd::wire
