// logitd::client::Client over gRPC: one channel per Client, one deadline and
// one set of credentials per call, tensors streamed with wire::SendChunks and
// reassembled (offsets, length, xxh3) with wire::Assembler.
#include "logitd/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/raw_call.h"
#include "common/wire.h"
#include "logitd/v1/logitd.grpc.pb.h"

namespace logitd::client {
namespace {

// Room a chunk message needs beyond its payload (tensor name, offset, framing),
// so that a full chunk never trips the channel's message size limit.
constexpr std::size_t kMessageHeadroom = 1u << 20;
// gRPC sizes messages with int; keep well inside it.
constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 30;

// The single place where a gRPC status becomes an absl::Status. The two code
// enums share their numbering (both follow google.rpc.Code), so the code and
// the message travel unchanged.
absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// The call's parsed timing trailer and GEMM trailer; empty when both are
// absent, the times empty when malformed (timing is an observation, never a
// reason to fail a call that succeeded).
std::optional<TimingTrailer> TrailerOf(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  std::optional<TimingTrailer> out;
  const auto it =
      trailers.find(grpc::string_ref(wire::kTimingTrailer.data(), wire::kTimingTrailer.size()));
  if (it != trailers.end()) {
    absl::StatusOr<TimingTrailer> t =
        ParseTimingTrailer(absl::string_view(it->second.data(), it->second.size()));
    if (t.ok()) out = *std::move(t);
  }
  const auto gemm =
      trailers.find(grpc::string_ref(wire::kGemmTrailer.data(), wire::kGemmTrailer.size()));
  if (gemm != trailers.end()) {
    if (!out.has_value()) out.emplace();
    out->gemms.assign(gemm->second.data(), gemm->second.size());
  }
  return out;
}

Timing FromProto(const v1::Timing& t) {
  Timing out;
  out.queue_us = t.queue_us();
  out.receive_us = t.receive_us();
  out.h2d_us = t.h2d_us();
  out.compute_us = t.compute_us();
  out.d2h_us = t.d2h_us();
  return out;
}

WeightInfo FromProto(const v1::WeightInfo& w) {
  WeightInfo out;
  out.handle = w.handle();
  out.name = w.name();
  out.shape.assign(w.shape().begin(), w.shape().end());
  out.xxh3 = w.xxh3();
  out.bytes = w.bytes();
  out.has_gradient = w.has_gradient();
  out.already_registered = w.already_registered();
  out.registrations = w.registrations();
  out.converted_from = w.converted_from();
  return out;
}

ServerInfo FromProto(const v1::ServerInfo& s) {
  ServerInfo out;
  out.version = s.version();
  out.build_id = s.build_id();
  out.backend = s.backend();
  out.device_name = s.device_name();
  out.compute_capability = s.compute_capability();
  out.multiprocessor_count = s.multiprocessor_count();
  out.driver_version = s.driver_version();
  out.cuda_runtime_version = s.cuda_runtime_version();
  out.cublaslt_version = s.cublaslt_version();
  out.blas_version = s.blas_version();
  out.weight_budget_bytes = s.weight_budget_bytes();
  out.weight_bytes_in_use = s.weight_bytes_in_use();
  out.max_request_bytes = s.max_request_bytes();
  out.chunk_bytes = s.chunk_bytes();
  out.max_receive_message_bytes = s.max_receive_message_bytes();
  out.max_request_chunk_bytes = s.max_request_chunk_bytes();
  out.max_send_message_bytes = s.max_send_message_bytes();
  out.device_bytes_in_use = s.device_bytes_in_use();
  out.split_k = s.split_k();
  out.request_memory_bytes = s.request_memory_bytes();
  out.request_bytes_in_flight = s.request_bytes_in_flight();
  out.request_bytes_high_water = s.request_bytes_high_water();
  out.requests_in_flight = s.requests_in_flight();
  out.max_concurrent_requests = s.max_concurrent_requests();
  return out;
}

// A default-constructed or moved-from Tensor has no shape and no bytes; on the
// wire it would look like a rank-0 tensor, and the server's complaint about a
// rank would not point at the real mistake.
absl::Status CheckNotEmpty(absl::string_view what, const Tensor& t) {
  if (t.rank() == 0 && t.nbytes() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        ": expected a tensor with a shape, got an empty one (default-constructed or moved-from)"));
  }
  return absl::OkStatus();
}

// Streams one tensor's bytes as chunk messages of a request stream. Returns
// false when the server stopped reading; the call's status then says why.
template <typename Request, typename Stream>
bool WriteTensor(Stream& stream, absl::string_view name, const Tensor& t, std::size_t chunk_bytes) {
  Request request;
  const absl::Status s =
      wire::SendChunksInPlace(name, t.bytes(), t.nbytes(), chunk_bytes, request.mutable_chunk(),
                              [&] { return stream.Write(request); });
  return s.ok();
}

// Reassembles the tensors a result message announces. The buffer cap is the
// announced total, so the server decides the sizes but the client never
// accepts a byte beyond them.
class ResponseTensors {
 public:
  absl::Status Announce(const std::vector<const v1::TensorSpec*>& specs) {
    std::uint64_t total = 0;
    for (const v1::TensorSpec* spec : specs) {
      absl::StatusOr<DType> dtype = wire::FromProto(spec->dtype());
      if (!dtype.ok()) return Corrupt(dtype.status());
      const std::vector<std::int64_t> shape(spec->shape().begin(), spec->shape().end());
      absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, *dtype);
      if (!n.ok()) return Corrupt(n.status());
      if (static_cast<std::uint64_t>(*n) > std::numeric_limits<std::uint64_t>::max() - total) {
        return absl::DataLossError("response from server: announced tensors overflow 64 bits");
      }
      total += static_cast<std::uint64_t>(*n);
    }
    assembler_ = std::make_unique<wire::Assembler>(total);
    for (const v1::TensorSpec* spec : specs) {
      auto it = recycle_.find(spec->name());
      Tensor* recycle = it != recycle_.end() ? it->second : nullptr;
      if (absl::Status s = assembler_->Expect(*spec, recycle); !s.ok()) return Corrupt(s);
    }
    return absl::OkStatus();
  }

  // Offers `t`'s memory for the tensor called `name` (taken when the dtype
  // and shape match what the server announces).
  void Recycle(const std::string& name, Tensor* t) { recycle_[name] = t; }

  // A chunk, as a message or read straight from the received bytes (then
  // taken over).
  absl::Status Add(const v1::TensorChunk& chunk) { return AddChunk(chunk.name(), chunk); }
  absl::Status Add(wire::ChunkView&& chunk) {
    const std::string name = chunk.name;
    return AddChunk(name, std::move(chunk));
  }

  // DataLoss for a truncated tensor or a digest mismatch (from the Assembler).
  absl::Status Finish() {
    if (assembler_ == nullptr) {
      return absl::DataLossError("response from server: the call ended without a result");
    }
    if (absl::Status s = assembler_->Finish(); !s.ok()) return Corrupt(s);
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Take(const v1::TensorSpec& spec) { return assembler_->Take(spec.name()); }

  // The digest of a tensor announced without one, sent after its chunks.
  absl::Status SetDigest(const v1::TensorDigest& digest) {
    if (assembler_ == nullptr) {
      return absl::DataLossError(absl::StrCat("response from server: digest of '", digest.name(),
                                              "' arrived before the result that announces it"));
    }
    if (absl::Status s = assembler_->SetExpectedDigest(digest.name(), digest.xxh3()); !s.ok()) {
      return Corrupt(s);
    }
    return absl::OkStatus();
  }

 private:
  // Whatever the server sent that does not add up is data loss to the caller:
  // the request was fine, the answer cannot be trusted.
  static absl::Status Corrupt(const absl::Status& s) {
    return absl::DataLossError(absl::StrCat("response from server: ", s.message()));
  }

  template <typename Chunk>
  absl::Status AddChunk(const std::string& name, Chunk&& chunk) {
    if (assembler_ == nullptr) {
      return absl::DataLossError(absl::StrCat("response from server: chunk of '", name,
                                              "' arrived before the result that announces it"));
    }
    if (absl::Status s = assembler_->Add(std::forward<Chunk>(chunk)); !s.ok()) return Corrupt(s);
    return absl::OkStatus();
  }

  std::unique_ptr<wire::Assembler> assembler_;
  std::map<std::string, Tensor*> recycle_;
};

// What reading a response stream produced.
enum class Next { kEnd, kMessage, kChunk, kMalformed };

// A tensor call's stream as raw messages (see common/chunk_message.h):
// requests and results travel as their message types, while a response
// chunk's bytes are read straight from gRPC's buffers into the tensor they
// belong to, without a copy into a message first.
template <typename Request, typename Response>
class RawCall {
 public:
  RawCall(grpc::GenericStub& stub, absl::string_view method, grpc::ClientContext* context)
      : call_(stub, method, context) {}

  bool Write(const Request& request) { return call_.Write(wire::SerializeMessage(request)); }
  bool Write(const grpc::ByteBuffer& message) { return call_.Write(message); }
  bool WritesDone() { return call_.WritesDone(); }
  grpc::Status Finish() { return call_.Finish(); }

  Next Read(Response* message, wire::ChunkView* chunk) {
    grpc::ByteBuffer buffer;
    if (!call_.Read(&buffer)) return Next::kEnd;
    if (wire::ReadChunkMessage(buffer, chunk)) return Next::kChunk;
    return wire::ParseMessage(&buffer, message) ? Next::kMessage : Next::kMalformed;
  }

 private:
  wire::RawClientCall call_;
};

// Into a raw stream, each chunk is copied once, into a buffer its message
// owns (gRPC sends from it and frees it once sent), instead of into a chunk
// message and again into gRPC's buffer when that is serialized.
template <typename Request, typename Response>
bool WriteTensor(RawCall<Request, Response>& stream, absl::string_view name, const Tensor& t,
                 std::size_t chunk_bytes) {
  if (chunk_bytes == 0) chunk_bytes = wire::kDefaultChunkBytes;
  for (std::size_t off = 0; off < t.nbytes(); off += chunk_bytes) {
    const std::size_t len = std::min(chunk_bytes, t.nbytes() - off);
    std::shared_ptr<std::byte> copy(new std::byte[len], std::default_delete<std::byte[]>());
    std::memcpy(copy.get(), t.bytes() + off, len);
    if (!stream.Write(wire::ChunkMessage(name, off, copy.get(), len, copy))) return false;
  }
  return true;
}

// The generated streams: every message is parsed.
template <typename Stream, typename Response>
Next ReadNext(Stream& stream, Response* message, wire::ChunkView* /*chunk*/) {
  return stream.Read(message) ? Next::kMessage : Next::kEnd;
}
template <typename Request, typename Response>
Next ReadNext(RawCall<Request, Response>& stream, Response* message, wire::ChunkView* chunk) {
  return stream.Read(message, chunk);
}

// The digest message of a response stream that has one (the tensor calls,
// with digest_last).
template <typename Response>
const v1::TensorDigest* DigestOf(const Response& /*response*/) {
  return nullptr;
}
const v1::TensorDigest* DigestOf(const v1::LogitsResponse& response) {
  return response.has_digest() ? &response.digest() : nullptr;
}
const v1::TensorDigest* DigestOf(const v1::BackwardResponse& response) {
  return response.has_digest() ? &response.digest() : nullptr;
}
const v1::TensorDigest* DigestOf(const v1::CrossEntropyResponse& response) {
  return response.has_digest() ? &response.digest() : nullptr;
}
const v1::TensorDigest* DigestOf(const v1::FetchGradientResponse& response) {
  return response.has_digest() ? &response.digest() : nullptr;
}
const v1::TensorDigest* DigestOf(const v1::CastResponse& response) {
  return response.has_digest() ? &response.digest() : nullptr;
}

// Reads a response stream (one result message, then the chunks of the
// tensors it announces, and for a tensor announced without its digest the
// digest after its chunks) and finishes the call. A local error cancels the call first:
// Finish() would otherwise wait for chunks nobody reads.
template <typename Response, typename Stream, typename Result, typename SpecsOf>
absl::Status ReceiveResponse(Stream& stream, grpc::ClientContext& context, Result* result,
                             ResponseTensors* tensors, SpecsOf specs_of) {
  Response response;
  wire::ChunkView chunk;
  bool have_result = false;
  absl::Status local;
  while (local.ok()) {
    const Next next = ReadNext(stream, &response, &chunk);
    if (next == Next::kEnd) break;
    if (next == Next::kChunk) {
      local = tensors->Add(std::move(chunk));
    } else if (next == Next::kMalformed) {
      local = absl::DataLossError(absl::StrCat("response from server: a message that is not a ",
                                               Response::descriptor()->full_name()));
    } else if (response.has_result()) {
      if (have_result) {
        local = absl::DataLossError("response from server: a second result message");
        break;
      }
      *result = std::move(*response.mutable_result());
      have_result = true;
      local = tensors->Announce(specs_of(*result));
    } else if (response.has_chunk()) {
      local = tensors->Add(response.chunk());
    } else if (const v1::TensorDigest* digest = DigestOf(response); digest != nullptr) {
      local = tensors->SetDigest(*digest);
    } else {
      local = absl::DataLossError("response from server: a message with neither result nor chunk");
    }
  }
  if (!local.ok()) {
    context.TryCancel();
    stream.Finish();  // Cancelled on purpose: `local` is the reason, not this status.
    return local;
  }
  if (absl::Status s = FromGrpc(stream.Finish()); !s.ok()) return s;
  if (!have_result) {
    return absl::DataLossError("response from server: the call ended without a result");
  }
  return tensors->Finish();
}

}  // namespace

absl::StatusOr<TimingTrailer> ParseTimingTrailer(absl::string_view text) {
  TimingTrailer out;
  if (text.empty()) return out;
  for (absl::string_view pair : absl::StrSplit(text, ',')) {
    const std::size_t eq = pair.find('=');
    std::int64_t us = 0;
    if (eq == absl::string_view::npos || !absl::SimpleAtoi(pair.substr(eq + 1), &us)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logitd-timing: expected key=integer, got '", pair, "'"));
    }
    const absl::string_view key = pair.substr(0, eq);
    if (key == "queue_us") {
      out.queue_us = us;
    } else if (key == "receive_us") {
      out.receive_us = us;
    } else if (key == "h2d_us") {
      out.h2d_us = us;
    } else if (key == "compute_us") {
      out.compute_us = us;
    } else if (key == "d2h_us") {
      out.d2h_us = us;
    } else if (key == "send_us") {
      out.send_us = us;
    } else if (key == "total_us") {
      out.total_us = us;
    }
  }
  return out;
}

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Logitd::Stub> stub;
  // The calls that stream tensors back, made as raw streams (RawCall).
  std::unique_ptr<grpc::GenericStub> generic;

  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> attempts{0};
  std::atomic<std::uint64_t> retries{0};
  std::atomic<std::uint64_t> exhausted{0};
  std::atomic<std::uint64_t> not_retried{0};
  std::atomic<std::uint64_t> data_loss{0};

  // Deadline and credentials for one attempt.
  void Prepare(grpc::ClientContext& context, absl::Time deadline) const {
    if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
    if (!options.auth_token.empty()) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", options.auth_token));
    }
  }

  // Runs one call: `attempt` sends the whole request on the fresh context it
  // is given and returns the call's result (absl::Status or absl::StatusOr).
  // An attempt that fails with UNAVAILABLE is sent again, after a backoff, when
  // the call is `idempotent` and options.retry allows another attempt before
  // the call's deadline. Every RPC goes through here, so the policy and its
  // counters live in one place.
  template <typename Attempt>
  auto Call(bool idempotent, Attempt attempt) {
    const RetryPolicy& policy = options.retry;
    const absl::Time start = absl::Now();
    const absl::Time deadline = options.timeout == absl::InfiniteDuration()
                                    ? absl::InfiniteFuture()
                                    : start + options.timeout;
    calls.fetch_add(1, std::memory_order_relaxed);
    absl::Duration backoff = policy.initial_backoff;
    for (int n = 1;; ++n) {
      attempts.fetch_add(1, std::memory_order_relaxed);
      grpc::ClientContext context;
      Prepare(context, deadline);
      auto result = attempt(context);
      const absl::Status status = StatusOf(result);
      if (status.code() == absl::StatusCode::kDataLoss) {
        data_loss.fetch_add(1, std::memory_order_relaxed);
      }
      if (status.code() != absl::StatusCode::kUnavailable) return result;
      if (!idempotent) {
        not_retried.fetch_add(1, std::memory_order_relaxed);
        return result;
      }
      if (policy.max_attempts == 1) return result;
      const absl::Duration sleep = Jittered(std::min(backoff, policy.max_backoff), policy.jitter);
      if ((policy.max_attempts > 0 && n >= policy.max_attempts) ||
          absl::Now() + sleep >= deadline) {
        exhausted.fetch_add(1, std::memory_order_relaxed);
        result = decltype(result)(absl::UnavailableError(absl::StrFormat(
            "%s (gave up after %d attempts in %s)", status.message(), n,
            absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))))));
        return result;
      }
      // Wait on the channel rather than only on the clock: that makes gRPC
      // try to reconnect (and notice that it can) while the client sleeps.
      // A channel that fails calls at once does not do so by itself soon
      // enough to be ready when the backoff ends.
      const absl::Time wake = absl::Now() + sleep;
      channel->WaitForConnected(absl::ToChronoTime(wake));
      absl::SleepFor(wake - absl::Now());
      backoff = std::min(backoff * policy.multiplier, policy.max_backoff);
      retries.fetch_add(1, std::memory_order_relaxed);
    }
  }

  static absl::Status StatusOf(const absl::Status& s) { return s; }
  template <typename T>
  static absl::Status StatusOf(const absl::StatusOr<T>& s) {
    return s.status();
  }

  // `d` scaled by a uniform factor in [1 - jitter, 1 + jitter].
  static absl::Duration Jittered(absl::Duration d, double jitter) {
    if (jitter <= 0) return d;
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::uniform_real_distribution<double> factor(1.0 - jitter, 1.0 + jitter);
    return d * factor(rng);
  }
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& address,
                                                       ClientOptions options) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "server address: expected a gRPC target such as 127.0.0.1:50051, got an empty string");
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("chunk_bytes: expected 1 to %d bytes, got %d",
                                                      kMaxChunkBytes, options.chunk_bytes));
  }
  if (options.client_cert_pem.empty() != options.client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "TLS client identity: expected both a certificate and a key, got only one of them");
  }
  if (options.lb_policy != "pick_first" && options.lb_policy != "round_robin") {
    return absl::InvalidArgumentError(
        absl::StrCat("load-balancing policy: expected pick_first or round_robin, got '",
                     options.lb_policy, "'"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("timeout: expected a positive duration, got ",
                                                   absl::FormatDuration(options.timeout)));
  }

  const RetryPolicy& retry = options.retry;
  if (retry.max_attempts < 0 || retry.initial_backoff <= absl::ZeroDuration() ||
      retry.max_backoff < retry.initial_backoff || !(retry.multiplier >= 1.0) ||
      !(retry.jitter >= 0.0 && retry.jitter < 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "retry policy: expected max_attempts >= 0, 0 < initial_backoff <= max_backoff, "
        "multiplier >= 1 and 0 <= jitter < 1, got max_attempts=%d initial_backoff=%s "
        "max_backoff=%s multiplier=%g jitter=%g",
        retry.max_attempts, absl::FormatDuration(retry.initial_backoff),
        absl::FormatDuration(retry.max_backoff), retry.multiplier, retry.jitter));
  }

  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.use_tls || !options.root_ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.root_ca_pem;
    ssl.pem_cert_chain = options.client_cert_pem;
    ssl.pem_private_key = options.client_key_pem;
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(options.chunk_bytes + kMessageHeadroom));
  // The server picks its own chunk size (--chunk_bytes); its messages are
  // bounded by that, and each tensor by the size it announced.
  args.SetMaxReceiveMessageSize(-1);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetLoadBalancingPolicyName(options.lb_policy);
  if (retry.max_attempts != 1) {
    // gRPC waits longer and longer (up to 2 minutes) between attempts to
    // reconnect to a server that went away, and fails calls at once while it
    // waits: bound that wait by the retry policy's, so that a retry after a
    // restart finds the server.
    const auto ms = [](absl::Duration d) {
      return static_cast<int>(
          std::min<std::int64_t>(absl::ToInt64Milliseconds(d), std::numeric_limits<int>::max()));
    };
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms(retry.initial_backoff));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms(retry.max_backoff));
  }

  auto impl = std::make_unique<Impl>();
  impl->channel = grpc::CreateCustomChannel(address, credentials, args);
  if (impl->channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address: cannot create a channel to '", address, "'"));
  }
  impl->stub = v1::Logitd::NewStub(impl->channel);
  impl->generic = std::make_unique<grpc::GenericStub>(impl->channel);
  impl->options = std::move(options);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

CallStats Client::call_stats() const {
  CallStats out;
  out.calls = impl_->calls.load(std::memory_order_relaxed);
  out.attempts = impl_->attempts.load(std::memory_order_relaxed);
  out.retries = impl_->retries.load(std::memory_order_relaxed);
  out.exhausted = impl_->exhausted.load(std::memory_order_relaxed);
  out.not_retried = impl_->not_retried.load(std::memory_order_relaxed);
  out.data_loss = impl_->data_loss.load(std::memory_order_relaxed);
  return out;
}

absl::StatusOr<ServerInfo> Client::Info() {
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<ServerInfo> {
    v1::ServerInfo info;
    if (absl::Status s = FromGrpc(impl_->stub->GetServerInfo(&context, {}, &info)); !s.ok()) {
      return s;
    }
    return FromProto(info);
  });
}

absl::StatusOr<WeightInfo> Client::RegisterWeight(const Tensor& weight, const std::string& name) {
  if (absl::Status s = CheckNotEmpty("weight", weight); !s.ok()) return s;
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<WeightInfo> {
    v1::WeightInfo info;
    std::unique_ptr<grpc::ClientWriter<v1::RegisterWeightRequest>> stream =
        impl_->stub->RegisterWeight(&context, &info);

    v1::RegisterWeightRequest header;
    header.mutable_header()->set_name(name);
    *header.mutable_header()->mutable_weight() = wire::MakeSpec("weight", weight);
    // A failed write means the server ended the call; Finish() says why.
    if (stream->Write(header) && WriteTensor<v1::RegisterWeightRequest>(
                                     *stream, "weight", weight, impl_->options.chunk_bytes)) {
      stream->WritesDone();
    }
    if (absl::Status s = FromGrpc(stream->Finish()); !s.ok()) return s;
    return FromProto(info);
  });
}

absl::StatusOr<WeightInfo> Client::LoadWeight(const std::string& path, const std::string& tensor,
                                              const std::string& name) {
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<WeightInfo> {
    v1::LoadWeightRequest request;
    request.set_path(path);
    request.set_tensor(tensor);
    request.set_name(name);
    v1::WeightInfo response;
    if (absl::Status s = FromGrpc(impl_->stub->LoadWeight(&context, request, &response)); !s.ok()) {
      return s;
    }
    return FromProto(response);
  });
}

absl::StatusOr<std::vector<WeightInfo>> Client::ListWeights() {
  return impl_->Call(
      true, [&](grpc::ClientContext& context) -> absl::StatusOr<std::vector<WeightInfo>> {
        v1::ListWeightsResponse response;
        if (absl::Status s = FromGrpc(impl_->stub->ListWeights(&context, {}, &response)); !s.ok()) {
          return s;
        }
        std::vector<WeightInfo> out;
        out.reserve(static_cast<std::size_t>(response.weights_size()));
        for (const v1::WeightInfo& w : response.weights()) out.push_back(FromProto(w));
        return out;
      });
}

absl::StatusOr<std::uint64_t> Client::ReleaseWeight(const std::string& handle, bool force) {
  return impl_->Call(false, [&](grpc::ClientContext& context) -> absl::StatusOr<std::uint64_t> {
    v1::ReleaseWeightRequest request;
    request.set_handle(handle);
    request.set_force(force);
    v1::ReleaseWeightResponse response;
    if (absl::Status s = FromGrpc(impl_->stub->ReleaseWeight(&context, request, &response));
        !s.ok()) {
      return s;
    }
    return response.bytes_freed() + response.bytes_freed_when_calls_end();
  });
}

absl::StatusOr<Tensor> Client::Logits(const Tensor& x, const std::string& handle,
                                      const LogitsOptions& options, Timing* timing) {
  Tensor y;
  if (absl::Status s = LogitsInto(x, handle, &y, options, timing); !s.ok()) return s;
  return y;
}

absl::Status Client::LogitsInto(const Tensor& x, const std::string& handle, Tensor* y,
                                const LogitsOptions& options, Timing* timing) {
  if (y == nullptr) return absl::InvalidArgumentError("y: expected a tensor to receive into");
  // LogitsShm without slots streams X up and Y back.
  LogitsShmArgs args;
  args.x = &x;
  args.y_into = y;
  absl::StatusOr<LogitsShmResult> r = LogitsShm(args, handle, options);
  if (!r.ok()) return r.status();
  if (timing != nullptr) *timing = std::move(r->timing);
  return absl::OkStatus();
}

absl::StatusOr<BackwardResult> Client::Backward(const Tensor& dy, const Tensor& x,
                                                const std::string& handle,
                                                const BackwardOptions& options) {
  // BackwardShm without slots streams every tensor both ways.
  BackwardShmArgs args;
  args.dy = &dy;
  args.x = &x;
  absl::StatusOr<BackwardShmResult> r = BackwardShm(args, handle, options);
  if (!r.ok()) return r.status();
  BackwardResult out;
  out.dx = std::move(r->dx);
  out.dw = std::move(r->dw);
  out.timing = std::move(r->timing);
  return out;
}

absl::StatusOr<GradientResult> Client::FetchGradient(const std::string& handle,
                                                     bool zero_after_fetch) {
  Tensor dw;
  absl::StatusOr<GradientResult> r = FetchGradientInto(handle, zero_after_fetch, &dw);
  if (r.ok()) r->dw = std::move(dw);
  return r;
}

absl::StatusOr<GradientResult> Client::FetchGradientInto(const std::string& handle,
                                                         bool zero_after_fetch, Tensor* into) {
  if (into == nullptr) return absl::InvalidArgumentError("dw: expected a tensor to receive into");
  return impl_->Call(
      !zero_after_fetch, [&](grpc::ClientContext& context) -> absl::StatusOr<GradientResult> {
        auto stream =
            std::make_unique<RawCall<v1::FetchGradientRequest, v1::FetchGradientResponse>>(
                *impl_->generic, "FetchGradient", &context);
        v1::FetchGradientRequest request;
        request.set_weight_handle(handle);
        request.set_zero_after_fetch(zero_after_fetch);
        request.set_digest_last(true);  // dW hashed while it travels
        if (stream->Write(request)) stream->WritesDone();

        v1::FetchGradientResult result;
        ResponseTensors tensors;
        tensors.Recycle("dw", into);
        absl::Status s = ReceiveResponse<v1::FetchGradientResponse>(
            *stream, context, &result, &tensors, [](const v1::FetchGradientResult& r) {
              return std::vector<const v1::TensorSpec*>{&r.dw()};
            });
        if (!s.ok()) return s;
        absl::StatusOr<Tensor> dw = tensors.Take(result.dw());
        if (!dw.ok()) return dw.status();
        *into = std::move(*dw);
        GradientResult out;
        out.accumulated_calls = result.accumulated_calls();
        out.trailer = TrailerOf(context);
        return out;
      });
}

absl::Status Client::ZeroGradient(const std::string& handle) {
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::Status {
    v1::ZeroGradientRequest request;
    request.set_weight_handle(handle);
    v1::ZeroGradientResponse response;
    return FromGrpc(impl_->stub->ZeroGradient(&context, request, &response));
  });
}

absl::StatusOr<Tensor> Client::CastToBf16(const Tensor& input) {
  if (absl::Status s = CheckNotEmpty("input", input); !s.ok()) return s;
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<Tensor> {
    auto stream = std::make_unique<RawCall<v1::CastRequest, v1::CastResponse>>(*impl_->generic,
                                                                               "Cast", &context);

    v1::CastRequest header;
    *header.mutable_header()->mutable_input() = wire::MakeSpec("input", input);
    header.mutable_header()->set_digest_last(true);  // the output hashed while it travels
    if (stream->Write(header) &&
        WriteTensor<v1::CastRequest>(*stream, "input", input, impl_->options.chunk_bytes)) {
      stream->WritesDone();
    }

    v1::CastResult result;
    ResponseTensors tensors;
    absl::Status s = ReceiveResponse<v1::CastResponse>(
        *stream, context, &result, &tensors,
        [](const v1::CastResult& r) { return std::vector<const v1::TensorSpec*>{&r.output()}; });
    if (!s.ok()) return s;
    return tensors.Take(result.output());
  });
}

absl::StatusOr<CrossEntropyResult> Client::CrossEntropy(const Tensor& x, const Tensor& targets,
                                                        const std::string& handle,
                                                        const CrossEntropyOptions& options) {
  if (absl::Status s = CheckNotEmpty("x", x); !s.ok()) return s;
  if (absl::Status s = CheckNotEmpty("targets", targets); !s.ok()) return s;
  // As for alpha: proto3 reads 0 as "unset", which the server takes as 1.
  if (options.grad_scale == 0.0f) {
    return absl::InvalidArgumentError(
        "grad_scale: expected a non-zero loss gradient (0 on the wire means the default 1), "
        "got 0");
  }
  v1::Reduction reduction = v1::REDUCTION_MEAN;
  switch (options.reduction) {
    case Reduction::kNone:
      reduction = v1::REDUCTION_NONE;
      break;
    case Reduction::kSum:
      reduction = v1::REDUCTION_SUM;
      break;
    case Reduction::kMean:
      reduction = v1::REDUCTION_MEAN;
      break;
  }
  return impl_->Call(
      !options.accumulate_dw,
      [&](grpc::ClientContext& context) -> absl::StatusOr<CrossEntropyResult> {
        auto stream = std::make_unique<RawCall<v1::CrossEntropyRequest, v1::CrossEntropyResponse>>(
            *impl_->generic, "CrossEntropy", &context);

        v1::CrossEntropyRequest header;
        v1::CrossEntropyHeader* h = header.mutable_header();
        h->set_weight_handle(handle);
        *h->mutable_x() = wire::MakeSpec("x", x);
        *h->mutable_targets() = wire::MakeSpec("targets", targets);
        // Always sent: the default lives in CrossEntropyOptions, not on the wire.
        h->set_ignore_index(options.ignore_index);
        h->set_reduction(reduction);
        h->set_z_loss(options.z_loss);
        h->set_logit_softcap(options.logit_softcap);
        h->set_grad_scale(options.grad_scale);
        h->set_want_lse(options.want_lse);
        h->set_want_dx(options.want_dx);
        h->set_want_dw(options.want_dw);
        h->set_dx_dtype(wire::ToProto(options.dx_dtype));
        h->set_accumulate_dw(options.accumulate_dw);
        h->set_digest_last(true);  // outputs hashed while they travel
        if (stream->Write(header) &&
            WriteTensor<v1::CrossEntropyRequest>(*stream, "x", x, impl_->options.chunk_bytes) &&
            WriteTensor<v1::CrossEntropyRequest>(*stream, "targets", targets,
                                                 impl_->options.chunk_bytes)) {
          stream->WritesDone();
        }

        v1::CrossEntropyResult result;
        ResponseTensors tensors;
        absl::Status s = ReceiveResponse<v1::CrossEntropyResponse>(
            *stream, context, &result, &tensors, [](const v1::CrossEntropyResult& r) {
              std::vector<const v1::TensorSpec*> specs;
              if (r.has_loss()) specs.push_back(&r.loss());
              if (r.has_lse()) specs.push_back(&r.lse());
              if (r.has_dx()) specs.push_back(&r.dx());
              if (r.has_dw()) specs.push_back(&r.dw());
              return specs;
            });
        if (!s.ok()) return s;
        if (!result.has_loss()) {
          return absl::DataLossError("response from server: the cross-entropy result has no loss");
        }

        CrossEntropyResult out;
        out.counted_tokens = result.counted_tokens();
        out.timing = FromProto(result.timing());
        out.timing.trailer = TrailerOf(context);
        absl::StatusOr<Tensor> loss = tensors.Take(result.loss());
        if (!loss.ok()) return loss.status();
        out.loss = std::move(*loss);
        if (result.has_lse()) {
          absl::StatusOr<Tensor> lse = tensors.Take(result.lse());
          if (!lse.ok()) return lse.status();
          out.lse = std::move(*lse);
        }
        if (result.has_dx()) {
          absl::StatusOr<Tensor> dx = tensors.Take(result.dx());
          if (!dx.ok()) return dx.status();
          out.dx = std::move(*dx);
        }
        if (result.has_dw()) {
          absl::StatusOr<Tensor> dw = tensors.Take(result.dw());
          if (!dw.ok()) return dw.status();
          out.dw = std::move(*dw);
        }
        return out;
      });
}

absl::StatusOr<ProbeResult> Client::Probe(const ProbeOptions& options) {
  return impl_->Call(false, [&](grpc::ClientContext& context) -> absl::StatusOr<ProbeResult> {
    std::unique_ptr<grpc::ClientReaderWriter<v1::ProbeRequest, v1::ProbeChunk>> stream =
        impl_->stub->Probe(&context);

    v1::ProbeRequest header;
    header.mutable_header()->set_request_bytes(options.request_bytes);
    header.mutable_header()->set_response_bytes(options.response_bytes);
    header.mutable_header()->set_chunk_bytes(options.chunk_bytes);
    // As a tensor upload: messages of chunk_bytes, but one message built once.
    bool writing = stream->Write(header);
    if (writing && options.request_bytes > 0) {
      v1::ProbeRequest data;
      data.mutable_data()->assign(static_cast<std::size_t>(std::min<std::uint64_t>(
                                      impl_->options.chunk_bytes, options.request_bytes)),
                                  '\0');
      for (std::uint64_t sent = 0; writing && sent < options.request_bytes;) {
        const std::uint64_t n =
            std::min<std::uint64_t>(impl_->options.chunk_bytes, options.request_bytes - sent);
        if (n < data.data().size()) data.mutable_data()->resize(static_cast<std::size_t>(n));
        writing = stream->Write(data);
        sent += n;
      }
    }
    if (writing) stream->WritesDone();

    ProbeResult out;
    v1::ProbeChunk chunk;
    while (stream->Read(&chunk)) out.response_bytes += chunk.data().size();
    if (absl::Status s = FromGrpc(stream->Finish()); !s.ok()) return s;
    if (out.response_bytes != options.response_bytes) {
      return absl::DataLossError(
          absl::StrFormat("response from server: probe asked for %d bytes, got %d",
                          options.response_bytes, out.response_bytes));
    }
    out.trailer = TrailerOf(context);
    return out;
  });
}

absl::StatusOr<std::string> Client::RegisterShm(const std::string& name, std::uint64_t bytes) {
  return impl_->Call(false, [&](grpc::ClientContext& context) -> absl::StatusOr<std::string> {
    v1::RegisterShmRequest request;
    request.set_name(name);
    request.set_bytes(bytes);
    v1::ShmRegion response;
    if (absl::Status s = FromGrpc(impl_->stub->RegisterShm(&context, request, &response));
        !s.ok()) {
      return s;
    }
    return response.handle();
  });
}

absl::Status Client::ReleaseShm(const std::string& handle) {
  return impl_->Call(false, [&](grpc::ClientContext& context) -> absl::Status {
    v1::ReleaseShmRequest request;
    request.set_handle(handle);
    v1::ReleaseShmResponse response;
    return FromGrpc(impl_->stub->ReleaseShm(&context, request, &response));
  });
}

namespace {

// The bytes [slot.offset, slot.offset + bytes) of the slot's mapped region,
// checked to lie inside it.
absl::StatusOr<const std::byte*> SlotBytes(absl::string_view what, const ShmSlot& slot,
                                           std::uint64_t bytes) {
  if (slot.region == nullptr || !slot.region->valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " shm slot: expected a mapped SharedRegion, got none"));
  }
  if (slot.handle.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " shm slot: expected the region handle RegisterShm returned, got none"));
  }
  const std::uint64_t size = slot.region->size();
  if (slot.offset > size || bytes > size - slot.offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, " shm slot: offset ", slot.offset,
                                                   " + bytes ", bytes, " exceeds region '",
                                                   slot.region->name(), "' of ", size, " bytes"));
  }
  return slot.region->data() + slot.offset;
}

// The spec of an input that is either a tensor (streamed) or the bytes of a
// shared-memory slot (dtype and shape given); sets *ref for a slot.
absl::StatusOr<v1::TensorSpec> InputSpec(absl::string_view name, const Tensor* tensor,
                                         const std::optional<ShmSlot>& slot, DType dtype,
                                         const std::vector<std::int64_t>& shape,
                                         std::optional<v1::ShmRef>* ref) {
  if (!slot) {
    if (tensor == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected a tensor or a shm slot, got neither"));
    }
    if (absl::Status s = CheckNotEmpty(name, *tensor); !s.ok()) return s;
    return wire::MakeSpec(name, *tensor);
  }
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, dtype);
  if (!n.ok()) return n.status();
  absl::StatusOr<const std::byte*> bytes = SlotBytes(name, *slot, static_cast<std::uint64_t>(*n));
  if (!bytes.ok()) return bytes.status();
  v1::TensorSpec spec;
  spec.set_name(std::string(name));
  spec.set_dtype(wire::ToProto(dtype));
  for (std::int64_t d : shape) spec.add_shape(d);
  spec.set_xxh3(Xxh3(*bytes, static_cast<std::size_t>(*n)));
  v1::ShmRef r;
  r.set_region(slot->handle);
  r.set_offset(slot->offset);
  r.set_bytes(static_cast<std::uint64_t>(*n));
  *ref = std::move(r);
  return spec;
}

// The ref asking for an output at `slot`: the room from its offset to the
// end of the region.
v1::ShmRef OutputRef(const ShmSlot& slot) {
  v1::ShmRef r;
  r.set_region(slot.handle);
  r.set_offset(slot.offset);
  r.set_bytes(slot.region->size() - slot.offset);
  r.set_skip_digest(slot.skip_digest);
  return r;
}

// Checks an output the server says it wrote at `slot`: DataLoss unless it is
// where it was asked for, its shape matches its bytes, and the bytes in the
// region have the announced digest.
absl::StatusOr<ShmOutput> CheckShmOutput(const v1::TensorSpec& spec, const v1::ShmRef& where,
                                         const ShmSlot& slot) {
  if (where.offset() != slot.offset) {
    return absl::DataLossError(
        absl::StrCat("response from server: '", spec.name(), "' not at the requested shm slot"));
  }
  absl::StatusOr<DType> dtype = wire::FromProto(spec.dtype());
  if (!dtype.ok()) return absl::DataLossError(dtype.status().message());
  const std::vector<std::int64_t> shape(spec.shape().begin(), spec.shape().end());
  absl::StatusOr<std::int64_t> n = CheckedByteCount(shape, *dtype);
  if (!n.ok() || static_cast<std::uint64_t>(*n) != where.bytes()) {
    return absl::DataLossError(absl::StrCat("response from server: '", spec.name(),
                                            "': shape does not match its shm bytes"));
  }
  absl::StatusOr<const std::byte*> bytes =
      SlotBytes(spec.name(), slot, static_cast<std::uint64_t>(*n));
  if (!bytes.ok()) return absl::DataLossError(bytes.status().message());
  if (where.skip_digest() && !slot.skip_digest) {
    return absl::DataLossError(absl::StrCat("response from server: '", spec.name(),
                                            "' was written without a digest, which was not asked"));
  }
  // A server that hashed anyway (skip_digest unset) is still checked.
  const std::uint64_t got = where.skip_digest() ? 0 : Xxh3(*bytes, static_cast<std::size_t>(*n));
  if (got != spec.xxh3()) {
    return absl::DataLossError(absl::StrFormat(
        "response from server: xxh3 of '%s' (%d bytes in shared memory) is %016x, the server "
        "announced %016x",
        spec.name(), *n, got, spec.xxh3()));
  }
  ShmOutput out;
  out.dtype = *dtype;
  out.shape = shape;
  out.xxh3 = got;
  out.offset = slot.offset;
  out.bytes = static_cast<std::uint64_t>(*n);
  return out;
}

}  // namespace

absl::StatusOr<LogitsShmResult> Client::LogitsShm(const LogitsShmArgs& args,
                                                  const std::string& handle,
                                                  const LogitsOptions& options) {
  if (options.alpha == 0.0f) {
    return absl::InvalidArgumentError(
        "alpha: expected a non-zero scale (0 on the wire means the default 1), got 0");
  }
  // X's spec: from the tensor, or computed here from the region's bytes.
  std::optional<v1::ShmRef> x_ref;
  absl::StatusOr<v1::TensorSpec> x_spec =
      InputSpec("x", args.x, args.x_slot, DType::kBf16, args.x_shape, &x_ref);
  if (!x_spec.ok()) return x_spec.status();
  if (args.y_slot) {
    if (absl::Status s = SlotBytes("y", *args.y_slot, 0).status(); !s.ok()) return s;
  }

  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<LogitsShmResult> {
    auto stream = std::make_unique<RawCall<v1::LogitsRequest, v1::LogitsResponse>>(
        *impl_->generic, "Logits", &context);

    v1::LogitsRequest header;
    v1::LogitsHeader* h = header.mutable_header();
    h->set_weight_handle(handle);
    *h->mutable_x() = *x_spec;
    h->set_out_dtype(wire::ToProto(options.out_dtype));
    h->set_alpha(options.alpha);
    if (x_ref) *h->mutable_x_shm() = *x_ref;
    if (args.y_slot) *h->mutable_y_shm() = OutputRef(*args.y_slot);
    // The server hashes a streamed Y while its chunks travel.
    if (!args.y_slot) h->set_digest_last(true);
    if (stream->Write(header) &&
        (x_ref ||
         WriteTensor<v1::LogitsRequest>(*stream, "x", *args.x, impl_->options.chunk_bytes))) {
      stream->WritesDone();
    }

    v1::LogitsResult result;
    ResponseTensors tensors;
    if (args.y_into != nullptr) tensors.Recycle("y", args.y_into);
    absl::Status s = ReceiveResponse<v1::LogitsResponse>(
        *stream, context, &result, &tensors, [](const v1::LogitsResult& r) {
          return r.has_y_shm() ? std::vector<const v1::TensorSpec*>{}
                               : std::vector<const v1::TensorSpec*>{&r.y()};
        });
    if (!s.ok()) return s;
    LogitsShmResult out;
    out.timing = FromProto(result.timing());
    out.timing.trailer = TrailerOf(context);
    if (!args.y_slot) {
      if (result.has_y_shm()) {
        return absl::DataLossError("response from server: Y placed in shared memory unasked");
      }
      absl::StatusOr<Tensor> y = tensors.Take(result.y());
      if (!y.ok()) return y.status();
      if (args.y_into != nullptr) {
        *args.y_into = std::move(*y);
      } else {
        out.y = std::move(*y);
      }
      return out;
    }
    // Y in the region: what the server announced must be what is there.
    if (!result.has_y_shm()) {
      return absl::DataLossError(
          "response from server: expected Y at the requested shm slot, got it streamed");
    }
    absl::StatusOr<ShmOutput> y = CheckShmOutput(result.y(), result.y_shm(), *args.y_slot);
    if (!y.ok()) return y.status();
    out.y_dtype = y->dtype;
    out.y_shape = std::move(y->shape);
    out.y_xxh3 = y->xxh3;
    out.y_offset = y->offset;
    out.y_bytes = y->bytes;
    return out;
  });
}

absl::StatusOr<BackwardShmResult> Client::BackwardShm(const BackwardShmArgs& args,
                                                      const std::string& handle,
                                                      const BackwardOptions& options) {
  std::optional<v1::ShmRef> dy_ref;
  std::optional<v1::ShmRef> x_ref;
  absl::StatusOr<v1::TensorSpec> dy_spec =
      InputSpec("dy", args.dy, args.dy_slot, args.dy_dtype, args.dy_shape, &dy_ref);
  if (!dy_spec.ok()) return dy_spec.status();
  absl::StatusOr<v1::TensorSpec> x_spec =
      InputSpec("x", args.x, args.x_slot, DType::kBf16, args.x_shape, &x_ref);
  if (!x_spec.ok()) return x_spec.status();
  for (const auto* slot : {&args.dx_slot, &args.dw_slot}) {
    if (!*slot) continue;
    if (absl::Status s = SlotBytes(slot == &args.dx_slot ? "dx" : "dw", **slot, 0).status();
        !s.ok()) {
      return s;
    }
  }

  return impl_->Call(
      !options.accumulate_dw,
      [&](grpc::ClientContext& context) -> absl::StatusOr<BackwardShmResult> {
        auto stream = std::make_unique<RawCall<v1::BackwardRequest, v1::BackwardResponse>>(
            *impl_->generic, "Backward", &context);
        v1::BackwardRequest header;
        v1::BackwardHeader* h = header.mutable_header();
        h->set_weight_handle(handle);
        *h->mutable_dy() = *dy_spec;
        *h->mutable_x() = *x_spec;
        h->set_want_dx(options.want_dx);
        h->set_want_dw(options.want_dw);
        h->set_dx_dtype(wire::ToProto(options.dx_dtype));
        h->set_dw_dtype(wire::ToProto(options.dw_dtype));
        h->set_accumulate_dw(options.accumulate_dw);
        if (dy_ref) *h->mutable_dy_shm() = *dy_ref;
        if (x_ref) *h->mutable_x_shm() = *x_ref;
        if (args.dx_slot) *h->mutable_dx_shm() = OutputRef(*args.dx_slot);
        if (args.dw_slot) *h->mutable_dw_shm() = OutputRef(*args.dw_slot);
        h->set_digest_last(true);  // streamed outputs hashed while they travel
        if (stream->Write(header) &&
            (dy_ref || WriteTensor<v1::BackwardRequest>(*stream, "dy", *args.dy,
                                                        impl_->options.chunk_bytes)) &&
            (x_ref ||
             WriteTensor<v1::BackwardRequest>(*stream, "x", *args.x, impl_->options.chunk_bytes))) {
          stream->WritesDone();
        }

        v1::BackwardResult result;
        ResponseTensors tensors;
        absl::Status s = ReceiveResponse<v1::BackwardResponse>(
            *stream, context, &result, &tensors, [](const v1::BackwardResult& r) {
              std::vector<const v1::TensorSpec*> specs;
              if (r.has_dx() && !r.has_dx_shm()) specs.push_back(&r.dx());
              if (r.has_dw() && !r.has_dw_shm()) specs.push_back(&r.dw());
              return specs;
            });
        if (!s.ok()) return s;
        BackwardShmResult out;
        out.timing = FromProto(result.timing());
        out.timing.trailer = TrailerOf(context);
        if (result.has_dx_shm() != (result.has_dx() && args.dx_slot.has_value()) ||
            result.has_dw_shm() != (result.has_dw() && args.dw_slot.has_value())) {
          return absl::DataLossError(
              "response from server: outputs in shared memory other than those asked for");
        }
        if (result.has_dx_shm()) {
          absl::StatusOr<ShmOutput> o = CheckShmOutput(result.dx(), result.dx_shm(), *args.dx_slot);
          if (!o.ok()) return o.status();
          out.dx_shm = *std::move(o);
        } else if (result.has_dx()) {
          absl::StatusOr<Tensor> t = tensors.Take(result.dx());
          if (!t.ok()) return t.status();
          out.dx = std::move(*t);
        }
        if (result.has_dw_shm()) {
          absl::StatusOr<ShmOutput> o = CheckShmOutput(result.dw(), result.dw_shm(), *args.dw_slot);
          if (!o.ok()) return o.status();
          out.dw_shm = *std::move(o);
        } else if (result.has_dw()) {
          absl::StatusOr<Tensor> t = tensors.Take(result.dw());
          if (!t.ok()) return t.status();
          out.dw = std::move(*t);
        }
        return out;
      });
}

}  // namespace logitd::client
