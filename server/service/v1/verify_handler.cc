// logitd.v1's Verify: the header translated (v1/requests.h), the call every
// front door would run (call/verify.h), and its outcome as one
// VerifyResponse. (Its dispatch by name, beside the tensor methods' rows, is
// in tensor_handlers.cc.)
#include <cmath>
#include <limits>

#include "logitd/reference/numerics.h"
#include "logitd/status_macros.h"
#include "logitd/wire/wire.h"
#include "server/service/call/verify.h"
#include "server/service/v1/requests.h"
#include "server/service/v1/service.h"

namespace logitd::service {
namespace {

// The index of flat element `flat` of `shape`, one per dimension.
void SetIndex(std::int64_t flat, const std::vector<std::int64_t>& shape,
              google::protobuf::RepeatedField<std::int64_t>* out) {
  std::vector<std::int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  out->Add(index.begin(), index.end());
}

void FillPrecisionClass(const PrecisionClassFigures& p, v1::PrecisionClass* out) {
  out->set_tested(p.tested);
  out->set_reason(p.reason);
  if (!p.tested) return;
  out->set_outside(p.outside);
  out->set_alpha(p.alpha);
  out->set_effective_bits(p.effective_bits);
  out->set_class_bits(p.class_bits);
  out->set_rms_ratio(p.rms_ratio);
  out->set_threshold(p.threshold);
  out->set_elements(p.elements);
  out->set_rows(p.rows);
  out->set_rows_outside(p.rows_outside);
  out->set_elements_outside(p.elements_outside);
  out->set_drawn_from(p.drawn_from);
  for (const RowPrecisionFigures& r : p.worst_rows) {
    v1::RowPrecision* row = out->add_worst_rows();
    row->set_row(r.row);
    row->set_elements(r.elements);
    row->set_effective_bits(r.effective_bits);
    row->set_class_bits(r.class_bits);
    row->set_rms_ratio(r.rms_ratio);
    row->set_threshold(r.threshold);
    row->set_outside(r.outside);
  }
  out->set_envelope(p.envelope.empty() ? ClassEnvelopeName() : p.envelope);
}

void FillCandidate(const VerifiedCandidate& c, v1::CandidateVerdict* out) {
  const CandidateCheck& check = c.check;
  out->set_name(c.name);
  out->set_dtype(wire::ToProto(c.dtype));
  out->mutable_shape()->Add(c.shape.begin(), c.shape.end());
  out->set_xxh3(c.xxh3);
  out->set_elements(check.elements());
  out->set_outside_bound(check.outside());
  out->set_worst_bound_fraction(check.worst_fraction());
  out->set_outside_probabilistic_bound(check.outside_probabilistic());
  out->set_worst_probabilistic_fraction(check.worst_probabilistic_fraction());
  out->set_logitd_outside_probabilistic_bound(check.own_outside_probabilistic());
  for (const CheckedElement& e : check.ReportedElements()) {
    v1::VerifyElement* element = out->add_first_outside();
    SetIndex(e.index, c.shape, element->mutable_index());
    element->set_candidate(e.candidate);
    element->set_reference(e.reference);
    element->set_bound(e.bound);
    element->set_probabilistic_bound(e.probabilistic_bound);
    element->set_logitd(e.logitd);
    element->set_outside_bound(e.outside_bound);
    element->set_class_threshold(e.class_threshold);
  }
  FillPrecisionClass(check.precision_class(), out->mutable_precision_class());
  out->set_nan_inf_mismatches(check.nan_inf_mismatches());
  out->set_bitwise_equal_fraction(check.elements() == 0
                                      ? 1.0
                                      : static_cast<double>(check.bitwise_equal()) /
                                            static_cast<double>(check.elements()));
  out->set_max_ulp(check.max_ulp());
  out->set_p99_ulp(check.UlpPercentile(0.99));
  out->set_p50_ulp(check.UlpPercentile(0.5));
  out->set_max_ulp_exact(check.max_ulp_exact());
  out->set_p99_ulp_exact(check.UlpExactPercentile(0.99));
  out->set_p50_ulp_exact(check.UlpExactPercentile(0.5));
  out->mutable_error_histogram()->Add(check.histogram().begin(), check.histogram().end());
  out->set_verdict(c.Verdict());
  out->set_passed(c.passed());
  out->set_block_rows(c.block_rows);
  out->mutable_block_xxh3()->Add(c.block_xxh3.begin(), c.block_xxh3.end());
}

}  // namespace

absl::Status LogitdService::DoVerify(VerifyCall* call) {
  LOGITD_RETURN_IF_ERROR(call->ReadHeader());
  LOGITD_RETURN_IF_ERROR(CheckRecord(call->header()));
  LOGITD_RETURN_IF_ERROR(CheckCompare(call->header(), call->tenant()));
  LOGITD_ASSIGN_OR_RETURN(const VerifyRequest request,
                          VerifyRequestOf(call->header(), V1Shm{&shm_, call->tenant()}));
  LOGITD_ASSIGN_OR_RETURN(
      const VerifyOutcome outcome,
      RunVerify(op_env(), request, &call->call(), *call, [call] { return call->cancelled(); }));
  v1::VerifyResponse head;
  v1::VerifyResult* result = head.mutable_result();
  for (const VerifiedCandidate& c : outcome.candidates) FillCandidate(c, result->add_candidates());
  result->set_verdict(outcome.Verdict());
  result->mutable_rows_checked()->Add(outcome.rows.begin(), outcome.rows.end());
  result->set_rows_total(outcome.rows_total);
  result->set_sample_seed(outcome.sample_seed);
  result->set_inputs_xxh3(outcome.inputs_xxh3);
  result->set_reference_us(outcome.reference_us);
  result->set_reference_engine(outcome.reference_engine);
  call->Timed(outcome.timing, result->mutable_timing());
  LOGITD_RETURN_IF_ERROR(Record(call->header(), call->tenant(), result));
  return call->SendHead(head);
}

}  // namespace logitd::service
