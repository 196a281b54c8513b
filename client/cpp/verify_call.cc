// Client::Verify: the candidates and inputs named and streamed (or pointed
// at in shared memory) through the same machinery as the tensor calls, and
// the one VerifyResponse read back.
#include "absl/strings/str_cat.h"
#include "client/cpp/call_tensors.h"
#include "client/cpp/client_impl.h"
#include "logitd/client.h"

namespace logitd::client {
namespace {

PrecisionClass PrecisionClassOf(const v1::PrecisionClass& p) {
  PrecisionClass out;
  out.tested = p.tested();
  out.reason = p.reason();
  out.outside = p.outside();
  out.alpha = p.alpha();
  out.effective_bits = p.effective_bits();
  out.class_bits = p.class_bits();
  out.rms_ratio = p.rms_ratio();
  out.threshold = p.threshold();
  out.elements = p.elements();
  out.rows = p.rows();
  out.rows_outside = p.rows_outside();
  out.elements_outside = p.elements_outside();
  out.drawn_from = p.drawn_from();
  for (const v1::RowPrecision& r : p.worst_rows()) {
    RowPrecision row;
    row.row = r.row();
    row.elements = r.elements();
    row.effective_bits = r.effective_bits();
    row.class_bits = r.class_bits();
    row.rms_ratio = r.rms_ratio();
    row.threshold = r.threshold();
    row.outside = r.outside();
    out.worst_rows.push_back(row);
  }
  out.envelope = p.envelope();
  return out;
}

CandidateVerdict VerdictOf(const v1::CandidateVerdict& c) {
  CandidateVerdict out;
  out.name = c.name();
  absl::StatusOr<DType> dtype = wire::FromProto(c.dtype());
  out.dtype = dtype.ok() ? *dtype : DType::kFp32;
  out.shape.assign(c.shape().begin(), c.shape().end());
  out.xxh3 = c.xxh3();
  out.elements = c.elements();
  out.outside_bound = c.outside_bound();
  out.worst_bound_fraction = c.worst_bound_fraction();
  out.outside_probabilistic_bound = c.outside_probabilistic_bound();
  out.worst_probabilistic_fraction = c.worst_probabilistic_fraction();
  out.logitd_outside_probabilistic_bound = c.logitd_outside_probabilistic_bound();
  for (const v1::VerifyElement& e : c.first_outside()) {
    VerifyElement element;
    element.index.assign(e.index().begin(), e.index().end());
    element.candidate = e.candidate();
    element.reference = e.reference();
    element.bound = e.bound();
    element.probabilistic_bound = e.probabilistic_bound();
    element.logitd = e.logitd();
    element.outside_bound = e.outside_bound();
    element.class_threshold = e.class_threshold();
    out.first_outside.push_back(std::move(element));
  }
  out.nan_inf_mismatches = c.nan_inf_mismatches();
  out.bitwise_equal_fraction = c.bitwise_equal_fraction();
  out.max_ulp = c.max_ulp();
  out.p99_ulp = c.p99_ulp();
  out.p50_ulp = c.p50_ulp();
  // Servers before these figures send no precision class either, and leave
  // them 0, which would read as exact.
  const bool has_exact = c.has_precision_class();
  out.max_ulp_exact = has_exact ? c.max_ulp_exact() : -1;
  out.p99_ulp_exact = has_exact ? c.p99_ulp_exact() : -1;
  out.p50_ulp_exact = has_exact ? c.p50_ulp_exact() : -1;
  out.precision_class = PrecisionClassOf(c.precision_class());
  out.error_histogram.assign(c.error_histogram().begin(), c.error_histogram().end());
  out.verdict = c.verdict();
  return out;
}

v1::VerifyOperation OperationOf(VerifyOperation operation) {
  switch (operation) {
    case VerifyOperation::kLogits:
      return v1::VERIFY_LOGITS;
    case VerifyOperation::kBackward:
      return v1::VERIFY_BACKWARD;
    case VerifyOperation::kCrossEntropy:
      return v1::VERIFY_CROSS_ENTROPY;
    case VerifyOperation::kLogProbs:
      return v1::VERIFY_LOGPROBS;
  }
  return v1::VERIFY_OPERATION_UNSPECIFIED;
}

// The call's tensors: x and w as bf16, dy, targets, then the candidates
// (which may not take an input's name).
absl::Status VerifySlots(const VerifyArgs& args, CallTensors* slots) {
  TensorInput x = args.x;
  x.dtype = DType::kBf16;
  if (absl::Status s = slots->Input("x", x); !s.ok()) return s;
  if (args.w.given()) {
    TensorInput w = args.w;
    w.dtype = DType::kBf16;
    if (absl::Status s = slots->Input("w", w); !s.ok()) return s;
  }
  if (args.dy.given()) {
    if (absl::Status s = slots->Input("dy", args.dy); !s.ok()) return s;
  }
  if (args.targets.given()) {
    if (absl::Status s = slots->Input("targets", args.targets); !s.ok()) return s;
  }
  for (const auto& [name, candidate] : args.candidates) {
    if (name == "x" || name == "w" || name == "dy" || name == "targets") {
      return absl::InvalidArgumentError(
          absl::StrCat("candidates: '", name,
                       "' is an input's name; candidates are named as the operation "
                       "names its outputs (y; dx, dw; loss, lse; logprob, lse, entropy)"));
    }
    if (absl::Status s = slots->Input(name, candidate); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The header's history fields: the labels to record the run under and the
// run to compare with.
void SetHistory(const VerifyArgs& args, v1::VerifyHeader* h) {
  if (args.record.has_value()) {
    v1::RunLabels* r = h->mutable_record();
    r->set_project(args.record->project);
    r->set_case_name(args.record->case_name);
    r->set_branch(args.record->branch);
    r->set_ref(args.record->ref);
  }
  if (args.compare.has_value()) SetBaselineSelector(*args.compare, h->mutable_compare());
}

}  // namespace

void SetBaselineSelector(const BaselineSelector& b, v1::BaselineSelector* c) {
  if (!b.branch.empty()) c->set_branch(b.branch);
  if (!b.ref.empty()) c->set_ref(b.ref);
  if (b.run_id != 0) c->set_run_id(b.run_id);
  if (!b.name.empty()) c->set_name(b.name);
  c->set_if_present(b.if_present);
}

RunComparison ComparisonOf(const v1::RunComparison& rc) {
  RunComparison c;
  c.baseline_run_id = rc.baseline_run_id();
  c.baseline_labels = RunLabels{rc.baseline_labels().project(), rc.baseline_labels().case_name(),
                                rc.baseline_labels().branch(), rc.baseline_labels().ref()};
  c.baseline_verdict = rc.baseline_verdict();
  c.platform_difference = rc.platform_difference();
  c.same_inputs = rc.same_inputs();
  for (const v1::CandidateComparison& cc : rc.candidates()) {
    c.candidates.push_back(CandidateComparison{
        cc.name(), cc.bits(), cc.baseline_verdict(), cc.worst_bound_fraction_delta(),
        cc.max_ulp_delta(), cc.effective_bits_delta(), cc.block_rows(),
        std::vector<std::int64_t>(cc.changed_blocks().begin(), cc.changed_blocks().end()),
        cc.rows()});
  }
  return c;
}

absl::StatusOr<VerifyResult> Client::Verify(const VerifyArgs& args) {
  const bool logits = args.operation == VerifyOperation::kLogits;
  if (logits && args.alpha == 0.0f) {
    return absl::InvalidArgumentError(
        "alpha: expected a non-zero scale (0 on the wire means the default 1), got 0");
  }
  CallTensors slots(impl_->options.digest_after_bytes);
  if (absl::Status s = VerifySlots(args, &slots); !s.ok()) return s;
  v1::VerifyRequest request;
  v1::VerifyHeader* h = request.mutable_header();
  h->set_operation(OperationOf(args.operation));
  h->set_weight_handle(args.weight_handle);
  if (args.operation == VerifyOperation::kCrossEntropy) {
    SetCrossEntropyOptions(args.cross_entropy, h->mutable_cross_entropy());
  }
  if (args.operation == VerifyOperation::kLogProbs) {
    SetLogProbsOptions(args.logprobs, h->mutable_logprobs());
  }
  if (logits) h->set_alpha(args.alpha);
  h->set_sample_rows(static_cast<std::uint32_t>(std::max<std::int64_t>(0, args.sample_rows)));
  h->set_sample_seed(args.sample_seed);
  SetHistory(args, h);
  slots.ForEachInput(
      [&](const std::string& name, const v1::TensorSpec& spec, const v1::ShmRef* ref) {
        if (name == "x") {
          *h->mutable_x() = spec;
        } else if (name == "w") {
          *h->mutable_w() = spec;
        } else if (name == "dy") {
          *h->mutable_dy() = spec;
        } else if (name == "targets") {
          *h->mutable_targets() = spec;
        } else {
          *h->add_candidates() = spec;
        }
        if (ref != nullptr) (*h->mutable_shm())[name] = *ref;
      });

  // Idempotent unless it records a run: a retry would record it twice.
  return impl_->Call(
      !args.record.has_value(), [&](grpc::ClientContext& context) -> absl::StatusOr<VerifyResult> {
        v1::VerifyResult result;
        // One attempt: the header, the streamed tensors, then exactly one
        // result, which is all a Verify response carries.
        ResponseTensors no_outputs;
        if (absl::Status s = RunTensorCall<v1::VerifyRequest, v1::VerifyResponse>(
                *impl_->generic, "Verify", context, impl_->options.chunk_bytes, request, slots,
                &result, &no_outputs);
            !s.ok()) {
          return s;
        }
        VerifyResult out;
        for (const v1::CandidateVerdict& c : result.candidates()) {
          out.candidates.push_back(VerdictOf(c));
        }
        out.verdict = result.verdict();
        out.rows_checked.assign(result.rows_checked().begin(), result.rows_checked().end());
        out.rows_total = result.rows_total();
        out.sample_seed = result.sample_seed();
        out.inputs_xxh3 = result.inputs_xxh3();
        out.timing = TimingOf(result.timing(), context);
        out.reference_us = result.reference_us();
        out.reference_engine = result.reference_engine();
        out.run_id = result.run_id();
        if (result.has_comparison()) out.comparison = ComparisonOf(result.comparison());
        out.alerts = AlertsOf(result.alerts());
        out.record_error = result.record_error();
        return out;
      });
}

}  // namespace logitd::client
