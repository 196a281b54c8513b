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
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/call_tensors.h"
#include "client/cpp/client_impl.h"
#include "logitd/v1/logitd.grpc.pb.h"
#include "logitd/wire/raw_call.h"
#include "logitd/wire/wire.h"

namespace logitd::client {
namespace {

// Room a chunk message needs beyond its payload (tensor name, offset, framing),
// so that a full chunk never trips the channel's message size limit.
constexpr std::size_t kMessageHeadroom = 1u << 20;
// gRPC sizes messages with int; keep well inside it.
constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 30;

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
  out.logits_block_rows_fp32 = w.logits_block_rows_fp32();
  out.logits_block_rows_bf16 = w.logits_block_rows_bf16();
  out.logprobs_block_rows = w.logprobs_block_rows();
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
  out.request_digest_last = s.request_digest_last();
  out.max_send_message_bytes = s.max_send_message_bytes();
  out.device_bytes_in_use = s.device_bytes_in_use();
  out.split_k = s.split_k();
  out.algo_choices = s.algo_choices();
  out.algo_cache_path = s.algo_cache_path();
  out.request_memory_bytes = s.request_memory_bytes();
  out.request_bytes_in_flight = s.request_bytes_in_flight();
  out.request_bytes_high_water = s.request_bytes_high_water();
  out.requests_in_flight = s.requests_in_flight();
  out.max_concurrent_requests = s.max_concurrent_requests();
  return out;
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

}  // namespace

absl::string_view ReductionName(Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return "none";
    case Reduction::kSum:
      return "sum";
    case Reduction::kMean:
      return "mean";
  }
  return "?";
}

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
    } else if (key == "pipeline_rows") {
      out.pipeline_rows = us;
    }
  }
  return out;
}

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
  impl->address = address;
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

absl::StatusOr<ListRunsResult> Client::ListRuns(const ListRunsArgs& args) {
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<ListRunsResult> {
    v1::ListRunsRequest request;
    request.set_project(args.project);
    request.set_case_name(args.case_name);
    request.set_branch(args.branch);
    request.set_page_size(args.page_size);
    request.set_before_run_id(args.before_run_id);
    request.set_run_id(args.run_id);
    request.set_backend(args.backend);
    request.set_device(args.device);
    request.set_recorded_after_unix_micros(args.recorded_after_unix_micros);
    request.set_recorded_before_unix_micros(args.recorded_before_unix_micros);
    v1::ListRunsResponse response;
    if (absl::Status s = FromGrpc(impl_->stub->ListRuns(&context, request, &response)); !s.ok()) {
      return s;
    }
    ListRunsResult out;
    out.next_before_run_id = response.next_before_run_id();
    for (const v1::RunSummary& r : response.runs()) {
      RunSummary run;
      run.run_id = r.run_id();
      run.labels = RunLabels{r.labels().project(), r.labels().case_name(), r.labels().branch(),
                             r.labels().ref()};
      run.operation = r.operation() == v1::VERIFY_LOGITS          ? "logits"
                      : r.operation() == v1::VERIFY_BACKWARD      ? "backward"
                      : r.operation() == v1::VERIFY_CROSS_ENTROPY ? "cross_entropy"
                      : r.operation() == v1::VERIFY_LOGPROBS      ? "logprobs"
                      : r.operation() == v1::VERIFY_VALIDATION    ? "validation"
                                                                  : "unspecified";
      run.inputs_xxh3 = r.inputs_xxh3();
      run.verdict = r.verdict();
      run.backend = r.backend();
      run.device = r.device();
      run.logitd_version = r.logitd_version();
      run.libraries = r.libraries();
      run.recorded_unix_micros = r.recorded_unix_micros();
      for (const v1::CandidateSummary& c : r.candidates()) {
        run.candidates.push_back(CandidateSummary{c.name(), c.verdict(), c.xxh3(), c.elements(),
                                                  c.outside_bound(), c.worst_bound_fraction(),
                                                  c.bitwise_equal_fraction(), c.max_ulp(),
                                                  c.p99_ulp(), c.rms_ratio(), c.effective_bits()});
      }
      run.alerts = AlertsOf(r.alerts());
      run.baseline_run_id = r.baseline_run_id();
      out.runs.push_back(std::move(run));
    }
    return out;
  });
}

absl::Status Client::PromoteRun(std::int64_t run_id, const std::string& name) {
  absl::StatusOr<bool> done =
      impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<bool> {
        v1::PromoteRunRequest request;
        request.set_run_id(run_id);
        request.set_name(name);
        v1::PromoteRunResponse response;
        if (absl::Status s = FromGrpc(impl_->stub->PromoteRun(&context, request, &response));
            !s.ok()) {
          return s;
        }
        return true;
      });
  return done.status();
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

}  // namespace logitd::client
