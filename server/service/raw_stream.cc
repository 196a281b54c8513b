#include "server/service/raw_stream.h"

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace logitd::service {

// --- CallThreads ---------------------------------------------------------------

namespace {
// How long a thread with nothing to do waits for a call before it exits.
constexpr std::chrono::seconds kIdleExit{30};
}  // namespace

CallThreads::~CallThreads() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  wake_.notify_all();
  exited_.wait(lock, [this] { return threads_ == 0; });
}

bool CallThreads::Run(std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  // Every queued call needs a thread of its own: a handler blocks on its
  // client for as long as the call lasts.
  if (threads_ - busy_ < static_cast<int>(queue_.size()) + 1) {
    if (threads_ >= max_threads_) return false;
    ++threads_;
    std::thread([this] { Work(); }).detach();
  }
  queue_.push_back(std::move(work));
  wake_.notify_one();
  return true;
}

void CallThreads::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const bool woke =
        wake_.wait_for(lock, kIdleExit, [this] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) {
      if (stopping_ || !woke) break;
      continue;
    }
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    work();
    work = nullptr;
    lock.lock();
    --busy_;
  }
  --threads_;
  exited_.notify_all();
}

// --- Reactors ------------------------------------------------------------------

namespace {

// One operation in flight at a time, waited for by the handler's thread and
// completed by a gRPC callback.
class Completion {
 public:
  void Begin() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = false;
  }
  void Done(bool ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ok_ = ok;
      done_ = true;
    }
    cv_.notify_one();
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    return ok_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool ok_ = false;
};

// A call whose handler runs on a CallThreads thread. The handler's status
// finishes the call; gRPC then calls OnDone, which deletes the reactor. The
// handler's thread does not touch the reactor after Finish.
template <typename Reactor>
class BlockingCall : public Reactor, public RawStream {
 public:
  BlockingCall(grpc::CallbackServerContext* context, RawHandler handler)
      : context_(context), handler_(std::move(handler)) {}

  void Start(CallThreads* threads) {
    const bool started = threads->Run([this] {
      const grpc::Status status = handler_(context_, this);
      this->Finish(status);
    });
    if (!started) {
      this->Finish(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("the server is running as many calls as it has threads for (",
                                    threads->max_threads(), "); retry with backoff")));
    }
  }

  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* const context_;
  const RawHandler handler_;
};

// Writes as callback operations, waited for.
template <typename Reactor>
class WritingCall : public BlockingCall<Reactor> {
 public:
  using BlockingCall<Reactor>::BlockingCall;

  bool Write(const grpc::ByteBuffer& message) override {
    write_.Begin();
    this->StartWrite(&message);
    return write_.Wait();
  }
  void OnWriteDone(bool ok) override { write_.Done(ok); }

 private:
  Completion write_;
};

class BidiCall final
    : public WritingCall<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>> {
 public:
  using WritingCall::WritingCall;

  bool Read(grpc::ByteBuffer* message) override {
    read_.Begin();
    StartRead(message);
    return read_.Wait();
  }
  void OnReadDone(bool ok) override { read_.Done(ok); }

 private:
  Completion read_;
};

class ClientStreamingCall final : public BlockingCall<grpc::ServerReadReactor<grpc::ByteBuffer>> {
 public:
  ClientStreamingCall(grpc::CallbackServerContext* context, grpc::ByteBuffer* response,
                      RawHandler handler)
      : BlockingCall(context, std::move(handler)), response_(response) {}

  bool Read(grpc::ByteBuffer* message) override {
    read_.Begin();
    StartRead(message);
    return read_.Wait();
  }
  void OnReadDone(bool ok) override { read_.Done(ok); }
  bool Write(const grpc::ByteBuffer& message) override {
    *response_ = message;
    return true;
  }

 private:
  grpc::ByteBuffer* const response_;
  Completion read_;
};

class ServerStreamingCall final : public WritingCall<grpc::ServerWriteReactor<grpc::ByteBuffer>> {
 public:
  ServerStreamingCall(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                      RawHandler handler)
      : WritingCall(context, std::move(handler)), request_(request) {}

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
