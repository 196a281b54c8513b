#include "server/service/transport/raw_stream.h"

#include <deque>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace logitd::service {

// --- CallThreads ---------------------------------------------------------------

namespace {
// How long a thread with nothing to do waits for a call before it exits.
constexpr absl::Duration kIdleExit = absl::Seconds(30);
}  // namespace

CallThreads::~CallThreads() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  wake_.SignalAll();
  while (threads_ != 0) exited_.Wait(&mu_);
}

bool CallThreads::Run(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  // Every queued call needs a thread of its own: a handler blocks on its
  // client for as long as the call lasts.
  if (threads_ - busy_ < static_cast<int>(queue_.size()) + 1) {
    if (threads_ >= max_threads_) return false;
    ++threads_;
    std::thread([this] { Work(); }).detach();
  }
  queue_.push_back(std::move(work));
  wake_.Signal();
  return true;
}

void CallThreads::Work() {
  absl::MutexLock lock(&mu_);
  while (true) {
    // Until a call or the stop comes, or kIdleExit passes without either.
    const absl::Time idle_until = absl::Now() + kIdleExit;
    while (queue_.empty() && !stopping_ && !wake_.WaitWithDeadline(&mu_, idle_until)) {
    }
    const bool woke = !queue_.empty() || stopping_;
    if (queue_.empty()) {
      if (stopping_ || !woke) break;
      continue;
    }
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    mu_.Unlock();
    work();
    work = nullptr;
    mu_.Lock();
    --busy_;
  }
  --threads_;
  exited_.SignalAll();
}

// --- Reactors ------------------------------------------------------------------

namespace {

// Messages read ahead of the handler, and messages the handler may have
// written before gRPC has taken them: the handler and gRPC's callbacks hand
// messages over without waiting for each other on every one.
constexpr std::size_t kReadAhead = 2;
constexpr std::size_t kWriteQueue = 2;

// A call whose handler runs on a CallThreads thread. The handler's status
// finishes the call once every message it wrote has gone; gRPC then calls
// OnDone, which deletes the reactor. The handler's thread does not touch
// the reactor after asking for the finish.
template <typename Reactor>
class CallCore : public Reactor, public RawStream {
 public:
  CallCore(grpc::CallbackServerContext* context, RawHandler handler)
      : context_(context), handler_(std::move(handler)) {}

  void Start(CallThreads* threads) {
    BeginReading();
    const bool started = threads->Run([this] { FinishWhenWritten(handler_(context_, this)); });
    if (!started) {
      FinishWhenWritten(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("the server is running as many calls as it has threads for (",
                                    threads->max_threads(), "); retry with backoff")));
    }
  }

  void OnDone() override { delete this; }

 protected:
  // Starts reading ahead (calls that read).
  virtual void BeginReading() {}

  void FinishWhenWritten(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      finishing_ = true;
      if (writing_) {
        finish_status_ = std::move(status);
        finish_when_written_ = true;
        return;
      }
    }
    this->Finish(status);
  }

  // mu_ guards the call's finish and writes here, and the reading and
  // writing state of the classes built on this; cv_ wakes the handler when
  // a message comes, a write is done or reading stops.
  absl::Mutex mu_;
  absl::CondVar cv_;
  // A finish was asked for: no read is started any more.
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  // A write is with gRPC; the finish waits for the last one.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_when_written_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);

 private:
  grpc::CallbackServerContext* const context_;
  const RawHandler handler_;
};

// Reads ahead: up to kReadAhead messages wait for the handler.
template <typename Base>
class Reading : public Base {
 public:
  using Base::Base;

  bool Read(grpc::ByteBuffer* message) override {
    absl::ReleasableMutexLock lock(&this->mu_);
    while (ready_.empty() && !ended_) this->cv_.Wait(&this->mu_);
    if (ready_.empty()) return false;
    *message = ready_.front();
    ready_.pop_front();
    const bool rearm = !pending_ && !ended_ && !this->finishing_;
    if (rearm) pending_ = true;
    lock.Release();
    if (rearm) this->StartRead(&incoming_);
    return true;
  }

  void StopReading() override {
    {
      absl::MutexLock lock(&this->mu_);
      stopped_ = true;
      ended_ = true;
      ready_.clear();
    }
    this->cv_.SignalAll();
  }

  void OnReadDone(bool ok) override {
    bool rearm = false;
    {
      absl::MutexLock lock(&this->mu_);
      if (stopped_) {
        // A read that was in flight: its message is dropped, none follows.
        incoming_.Clear();
        pending_ = false;
        return;
      }
      if (ok) {
        ready_.push_back(incoming_);
        incoming_.Clear();
        rearm = ready_.size() < kReadAhead && !this->finishing_;
      } else {
        ended_ = true;
      }
      pending_ = rearm;
    }
    this->cv_.SignalAll();
    if (rearm) this->StartRead(&incoming_);
  }

 protected:
  void BeginReading() override {
    {
      absl::MutexLock lock(&this->mu_);
      pending_ = true;
    }
    this->StartRead(&incoming_);
  }

 private:
  grpc::ByteBuffer incoming_;  // the target of the read in flight
  // The messages read ahead, whether a read is in flight, and whether the
  // stream has ended; Base::mu_ guards them.
  std::deque<grpc::ByteBuffer> ready_ ABSL_GUARDED_BY(Base::mu_);
  bool pending_ ABSL_GUARDED_BY(Base::mu_) = false;
  bool ended_ ABSL_GUARDED_BY(Base::mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(Base::mu_) = false;  // StopReading: nothing more is read
};

// Queues writes: Write returns once gRPC has the message or it is queued
// behind at most kWriteQueue - 1 others; false once a write has failed.
template <typename Base>
class Writing : public Base {
 public:
  using Base::Base;

  bool Write(const grpc::ByteBuffer& message) override {
    absl::ReleasableMutexLock lock(&this->mu_);
    while (queue_.size() >= kWriteQueue && !failed_) this->cv_.Wait(&this->mu_);
    if (failed_) return false;
    queue_.push_back(message);  // shares the slices
    if (this->writing_) return true;
    this->writing_ = true;
    const grpc::ByteBuffer* next = &queue_.front();
    lock.Release();
    this->StartWrite(next);
    return true;
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&this->mu_);
      queue_.pop_front();
      if (!ok) {
        failed_ = true;
        queue_.clear();
      }
      if (!queue_.empty()) {
        next = &queue_.front();  // a deque keeps its elements in place
      } else {
        this->writing_ = false;
        finish = this->finish_when_written_;
        status = this->finish_status_;
      }
    }
    this->cv_.SignalAll();
    if (next != nullptr) {
      this->StartWrite(next);
    } else if (finish) {
      this->Finish(status);
    }
  }

 private:
  // The messages written and not yet taken by gRPC (the first is with it
  // while a write is in flight), and whether a write failed; Base::mu_
  // guards them.
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(Base::mu_);
  bool failed_ ABSL_GUARDED_BY(Base::mu_) = false;
};

using BidiCall =
    Reading<Writing<CallCore<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>>>>;

class ClientStreamingCall final
    : public Reading<CallCore<grpc::ServerReadReactor<grpc::ByteBuffer>>> {
 public:
  ClientStreamingCall(grpc::CallbackServerContext* context, grpc::ByteBuffer* response,
                      RawHandler handler)
      : Reading(context, std::move(handler)), response_(response) {}

  // The one response message, sent when the call finishes OK.
  bool Write(const grpc::ByteBuffer& message) override {
    *response_ = message;
    return true;
  }

 private:
  grpc::ByteBuffer* const response_;
};

class ServerStreamingCall final
    : public Writing<CallCore<grpc::ServerWriteReactor<grpc::ByteBuffer>>> {
 public:
  ServerStreamingCall(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                      RawHandler handler)
      : Writing(context, std::move(handler)), request_(request) {}

  bool Read(grpc::ByteBuffer* message) override {
    // A client that ended its stream without a message gives no buffer.
    const grpc::ByteBuffer* request = std::exchange(request_, nullptr);
    if (request == nullptr || !request->Valid()) return false;
    *message = *request;  // shares the slices
    return true;
  }

 private:
  const grpc::ByteBuffer* request_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServeBidi(
    grpc::CallbackServerContext* context, CallThreads* threads, RawHandler handler) {
  auto* call = new BidiCall(context, std::move(handler));
  call->Start(threads);
  return call;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* ServeClientStreaming(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response, CallThreads* threads,
    RawHandler handler) {
  auto* call = new ClientStreamingCall(context, response, std::move(handler));
  call->Start(threads);
  return call;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ServeServerStreaming(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request, CallThreads* threads,
    RawHandler handler) {
  auto* call = new ServerStreamingCall(context, request, std::move(handler));
  call->Start(threads);
  return call;
}

}  // namespace logitd::service
