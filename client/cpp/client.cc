// logitd::client::Client over gRPC: one channel per Client, one deadline and
// one set of credentials per call, tensors streamed with wire::SendChunks and
// reassembled (offsets, length, xxh3) with wire::Assembler.
#include "logitd/client.h"

#include <grpcpp/grpcpp.h>

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
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
  out.device_bytes_in_use = s.device_bytes_in_use();
  out.split_k = s.split_k();
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
  const absl::Status s =
      wire::SendChunks(name, t.bytes(), t.nbytes(), chunk_bytes, [&](v1::TensorChunk&& chunk) {
        Request request;
        *request.mutable_chunk() = std::move(chunk);
        return stream.Write(request);
      });
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
      if (absl::Status s = assembler_->Expect(*spec); !s.ok()) return Corrupt(s);
    }
    return absl::OkStatus();
  }

  absl::Status Add(const v1::TensorChunk& chunk) {
    if (assembler_ == nullptr) {
      return absl::DataLossError(absl::StrCat("response from server: chunk of '", chunk.name(),
                                              "' arrived before the result that announces it"));
    }
    if (absl::Status s = assembler_->Add(chunk); !s.ok()) return Corrupt(s);
    return absl::OkStatus();
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

 private:
  // Whatever the server sent that does not add up is data loss to the caller:
  // the request was fine, the answer cannot be trusted.
  static absl::Status Corrupt(const absl::Status& s) {
    return absl::DataLossError(absl::StrCat("response from server: ", s.message()));
  }

  std::unique_ptr<wire::Assembler> assembler_;
};

// Reads a response stream (one result message, then the chunks of the tensors
// it announces) and finishes the call. A local error cancels the call first:
// Finish() would otherwise wait for chunks nobody reads.
template <typename Response, typename Stream, typename Result, typename SpecsOf>
absl::Status ReceiveResponse(Stream& stream, grpc::ClientContext& context, Result* result,
                             ResponseTensors* tensors, SpecsOf specs_of) {
  Response response;
  bool have_result = false;
  absl::Status local;
  while (local.ok() && stream.Read(&response)) {
    if (response.has_result()) {
      if (have_result) {
        local = absl::DataLossError("response from server: a second result message");
        break;
      }
      *result = std::move(*response.mutable_result());
      have_result = true;
      local = tensors->Announce(specs_of(*result));
    } else if (response.has_chunk()) {
      local = tensors->Add(response.chunk());
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
  return tensors->Finish();
}

}  // namespace

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Logitd::Stub> stub;

  // Deadline and credentials for one call.
  void Prepare(grpc::ClientContext& context) const {
    if (options.timeout != absl::InfiniteDuration()) {
      context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
    }
    if (!options.auth_token.empty()) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", options.auth_token));
    }
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
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("timeout: expected a positive duration, got ",
                                                   absl::FormatDuration(options.timeout)));
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

  auto impl = std::make_unique<Impl>();
  impl->channel = grpc::CreateCustomChannel(address, credentials, args);
  if (impl->channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("server address: cannot create a channel to '", address, "'"));
  }
  impl->stub = v1::Logitd::NewStub(impl->channel);
  impl->options = std::move(options);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<ServerInfo> Client::Info() {
  grpc::ClientContext context;
  impl_->Prepare(context);
  v1::ServerInfo info;
  if (absl::Status s = FromGrpc(impl_->stub->GetServerInfo(&context, {}, &info)); !s.ok()) {
    return s;
  }
  return FromProto(info);
}

absl::StatusOr<WeightInfo> Client::RegisterWeight(const Tensor& weight, const std::string& name) {
  if (absl::Status s = CheckNotEmpty("weight", weight); !s.ok()) return s;
  grpc::ClientContext context;
  impl_->Prepare(context);
  v1::WeightInfo info;
  std::unique_ptr<grpc::ClientWriter<v1::RegisterWeightRequest>> stream =
      impl_->stub->RegisterWeight(&context, &info);

  v1::RegisterWeightRequest header;
  header.mutable_header()->set_name(name);
  *header.mutable_header()->mutable_weight() = wire::MakeSpec("weight", weight);
  // A failed write means the server ended the call; Finish() says why.
  if (stream->Write(header) && WriteTensor<v1::RegisterWeightRequest>(*stream, "weight", weight,
                                                                      impl_->options.chunk_bytes)) {
    stream->WritesDone();
  }
  if (absl::Status s = FromGrpc(stream->Finish()); !s.ok()) return s;
  return FromProto(info);
}

absl::StatusOr<WeightInfo> Client::LoadWeight(const std::string& path, const std::string& tensor,
                                              const std::string& name) {
  grpc::ClientContext context;
  impl_->Prepare(context);
  v1::LoadWeightRequest request;
  request.set_path(path);
  request.set_tensor(tensor);
  request.set_name(name);
  v1::WeightInfo response;
  if (absl::Status s = FromGrpc(impl_->stub->LoadWeight(&context, request, &response)); !s.ok()) {
    return s;
  }
  return FromProto(response);
}

absl::StatusOr<std::vector<WeightInfo>> Client::ListWeights() {
  grpc::ClientContext context;
  impl_->Prepare(context);
  v1::ListWeightsResponse response;
  if (absl::Status s = FromGrpc(impl_->stub->ListWeights(&context, {}, &response)); !s.ok()) {
    return s;
  }
  std::vector<WeightInfo> out;
  out.reserve(static_cast<std::size_t>(response.weights_size()));
  for (const v1::WeightInfo& w : response.weights()) out.push_back(FromProto(w));
  return out;
}

absl::StatusOr<std::uint64_t> Client::ReleaseWeight(const std::string& handle, bool force) {
  grpc::ClientContext context;
  impl_->Prepare(context);
  v1::ReleaseWeightRequest request;
  request.set_handle(handle);
  request.set_force(force);
  v1::ReleaseWeightResponse response;
  if (absl::Status s = FromGrpc(impl_->stub->ReleaseWeight(&context, request, &response));
      !s.ok()) {
    return s;
  }
  return response.bytes_freed();
}

absl::StatusOr<Tensor> Client::Logits(const Tensor& x, const std::string& handle,
                                      const LogitsOptions& options, Timing* timing) {
  if (absl::Status s = CheckNotEmpty("x", x); !s.ok()) return s;
  // proto3 cannot tell 0 from "unset", and the server reads unset as 1: a
  // zero alpha would silently become 1.
  if (options.alpha == 0.0f) {
    return absl::InvalidArgumentError(
        "alpha: expected a non-zero scale (0 on the wire means the default 1), got 0");
  }
  grpc::ClientContext context;
  impl_->Prepare(context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::LogitsRequest, v1::LogitsResponse>> stream =
      impl_->stub->Logits(&context);

  v1::LogitsRequest header;
  v1::LogitsHeader* h = header.mutable_header();
  h->set_weight_handle(handle);
  *h->mutable_x() = wire::MakeSpec("x", x);
  h->set_out_dtype(wire::ToProto(options.out_dtype));
  h->set_alpha(options.alpha);
  if (stream->Write(header) &&
      WriteTensor<v1::LogitsRequest>(*stream, "x", x, impl_->options.chunk_bytes)) {
    stream->WritesDone();
  }

  v1::LogitsResult result;
  ResponseTensors tensors;
  absl::Status s = ReceiveResponse<v1::LogitsResponse>(
      *stream, context, &result, &tensors,
      [](const v1::LogitsResult& r) { return std::vector<const v1::TensorSpec*>{&r.y()}; });
  if (!s.ok()) return s;
  if (timing != nullptr) *timing = FromProto(result.timing());
  return tensors.Take(result.y());
}

absl::StatusOr<BackwardResult> Client::Backward(const Tensor& dy, const Tensor& x,
                                                const std::string& handle,
                                                const BackwardOptions& options) {
  if (absl::Status s = CheckNotEmpty("dy", dy); !s.ok()) return s;
  if (absl::Status s = CheckNotEmpty("x", x); !s.ok()) return s;
  grpc::ClientContext context;
  impl_->Prepare(context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::BackwardRequest, v1::BackwardResponse>> stream =
      impl_->stub->Backward(&context);

  v1::BackwardRequest header;
  v1::BackwardHeader* h = header.mutable_header();
  h->set_weight_handle(handle);
  *h->mutable_dy() = wire::MakeSpec("dy", dy);
  *h->mutable_x() = wire::MakeSpec("x", x);
  h->set_want_dx(options.want_dx);
  h->set_want_dw(options.want_dw);
  h->set_dx_dtype(wire::ToProto(options.dx_dtype));
  h->set_dw_dtype(wire::ToProto(options.dw_dtype));
  h->set_accumulate_dw(options.accumulate_dw);
  if (stream->Write(header) &&
      WriteTensor<v1::BackwardRequest>(*stream, "dy", dy, impl_->options.chunk_bytes) &&
      WriteTensor<v1::BackwardRequest>(*stream, "x", x, impl_->options.chunk_bytes)) {
    stream->WritesDone();
  }

  v1::BackwardResult result;
  ResponseTensors tensors;
  absl::Status s = ReceiveResponse<v1::BackwardResponse>(*stream, context, &result, &tensors,
                                                         [](const v1::BackwardResult& r) {
                                                           std::vector<const v1::TensorSpec*> specs;
                                                           if (r.has_dx()) specs.push_back(&r.dx());
                                                           if (r.has_dw()) specs.push_back(&r.dw());
                                                           return specs;
                                                         });
  if (!s.ok()) return s;

  BackwardResult out;
  out.timing = FromProto(result.timing());
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
}

absl::StatusOr<GradientResult> Client::FetchGradient(const std::string& handle,
                                                     bool zero_after_fetch) {
  grpc::ClientContext context;
  impl_->Prepare(context);
  v1::FetchGradientRequest request;
  request.set_weight_handle(handle);
  request.set_zero_after_fetch(zero_after_fetch);
  std::unique_ptr<grpc::ClientReader<v1::FetchGradientResponse>> stream =
      impl_->stub->FetchGradient(&context, request);

  v1::FetchGradientResult result;
  ResponseTensors tensors;
  absl::Status s = ReceiveResponse<v1::FetchGradientResponse>(
      *stream, context, &result, &tensors,
      [](const v1::FetchGradientResult& r) { return std::vector<const v1::TensorSpec*>{&r.dw()}; });
  if (!s.ok()) return s;
  absl::StatusOr<Tensor> dw = tensors.Take(result.dw());
  if (!dw.ok()) return dw.status();
  GradientResult out;
  out.dw = std::move(*dw);
  out.accumulated_calls = result.accumulated_calls();
  return out;
}

absl::Status Client::ZeroGradient(const std::string& handle) {
  grpc::ClientContext context;
  impl_->Prepare(context);
  v1::ZeroGradientRequest request;
  request.set_weight_handle(handle);
  v1::ZeroGradientResponse response;
  return FromGrpc(impl_->stub->ZeroGradient(&context, request, &response));
}

absl::StatusOr<Tensor> Client::CastToBf16(const Tensor& input) {
  if (absl::Status s = CheckNotEmpty("input", input); !s.ok()) return s;
  grpc::ClientContext context;
  impl_->Prepare(context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::CastRequest, v1::CastResponse>> stream =
      impl_->stub->Cast(&context);

  v1::CastRequest header;
  *header.mutable_header()->mutable_input() = wire::MakeSpec("input", input);
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
  grpc::ClientContext context;
  impl_->Prepare(context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::CrossEntropyRequest, v1::CrossEntropyResponse>>
      stream = impl_->stub->CrossEntropy(&context);

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
}

}  // namespace logitd::client
