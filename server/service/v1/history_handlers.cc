// logitd.v1's history: Verify's runs recorded when its header asks
// (VerifyHeader.record), and ListRuns, the tenant's runs newest first. The
// store is the server's (--history, server/history/history_store.h).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/history/history_store.h"
#include "server/service/state/build_info.h"
#include "server/service/v1/service.h"

namespace logitd::service {
namespace {

constexpr char kNoHistory[] =
    "this server keeps no history (it runs with --history=none, or its state directory could "
    "not hold one: see its log); leave `record` unset, or ask the server's operator for "
    "--history=auto or --history=FILE";

history::RunLabels LabelsOf(const v1::RunLabels& l) {
  return history::RunLabels{l.project(), l.case_name(), l.branch(), l.ref()};
}

history::CandidateFigures FiguresOf(const v1::CandidateVerdict& c) {
  history::CandidateFigures f;
  f.name = c.name();
  f.verdict = c.verdict();
  f.xxh3 = c.xxh3();
  f.elements = c.elements();
  f.outside_bound = c.outside_bound();
  f.worst_bound_fraction = c.worst_bound_fraction();
  f.bitwise_equal_fraction = c.bitwise_equal_fraction();
  f.max_ulp = c.max_ulp();
  f.p99_ulp = c.p99_ulp();
  if (c.precision_class().tested()) {
    f.rms_ratio = c.precision_class().rms_ratio();
    f.effective_bits = c.precision_class().effective_bits();
  }
  return f;
}

void FillRun(const history::RunRecord& r, v1::RunSummary* out) {
  out->set_run_id(r.id);
  v1::RunLabels* labels = out->mutable_labels();
  labels->set_project(r.labels.project);
  labels->set_case_name(r.labels.case_name);
  labels->set_branch(r.labels.branch);
  labels->set_ref(r.labels.ref);
  v1::VerifyOperation op = v1::VERIFY_OPERATION_UNSPECIFIED;
  v1::VerifyOperation_Parse(r.operation, &op);
  out->set_operation(op);
  out->set_inputs_xxh3(r.inputs_xxh3);
  out->set_verdict(r.verdict);
  out->set_backend(r.backend);
  out->set_device(r.device);
  out->set_logitd_version(r.logitd_version);
  out->set_recorded_unix_micros(r.recorded_unix_us);
  for (const history::CandidateFigures& c : r.candidates) {
    v1::CandidateSummary* s = out->add_candidates();
    s->set_name(c.name);
    s->set_verdict(c.verdict);
    s->set_xxh3(c.xxh3);
    s->set_elements(c.elements);
    s->set_outside_bound(c.outside_bound);
    s->set_worst_bound_fraction(c.worst_bound_fraction);
    s->set_bitwise_equal_fraction(c.bitwise_equal_fraction);
    s->set_max_ulp(c.max_ulp);
    s->set_p99_ulp(c.p99_ulp);
    s->set_rms_ratio(c.rms_ratio);
    s->set_effective_bits(c.effective_bits);
  }
}

}  // namespace

absl::Status LogitdService::CheckRecord(const v1::VerifyHeader& header) const {
  if (!header.has_record()) return absl::OkStatus();
  if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
  return history::CheckLabels(LabelsOf(header.record()));
}

absl::Status LogitdService::Record(const v1::VerifyHeader& header, const Tenant& tenant,
                                   v1::VerifyResult* result) const {
  if (!header.has_record() || options_.history == nullptr) return absl::OkStatus();
  history::RunRecord run;
  run.tenant = tenant.id;
  run.labels = LabelsOf(header.record());
  run.operation = v1::VerifyOperation_Name(header.operation());
  run.inputs_xxh3 = result->inputs_xxh3();
  run.verdict = result->verdict();
  const kernels::BackendInfo info = backend_->Info();
  run.backend = info.backend;
  run.device = info.device_name;
  run.logitd_version = std::string(Version());
  for (const v1::CandidateVerdict& c : result->candidates()) {
    run.candidates.push_back(FiguresOf(c));
  }
  if (absl::Status s = options_.history->Record(&run); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the verdict was formed but could not be recorded "
                                               "in the server's history: ",
                                               s.message()));
  }
  result->set_run_id(run.id);
  return absl::OkStatus();
}

grpc::Status LogitdService::ListRuns(grpc::ServerContext* context,
                                     const v1::ListRunsRequest* request,
                                     v1::ListRunsResponse* response) {
  return runner_.Run("ListRuns", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    if (request->page_size() < 0 || request->page_size() > history::kMaxListedRuns) {
      return absl::InvalidArgumentError(absl::StrCat("page_size: expected 0 (100) to ",
                                                     history::kMaxListedRuns, ", got ",
                                                     request->page_size()));
    }
    if (request->before_run_id() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "before_run_id: expected 0 (the newest) or a run's id, got ", request->before_run_id()));
    }
    const int page = request->page_size() == 0 ? 100 : request->page_size();
    history::RunFilter filter;
    filter.tenant = stats->tenant.id;
    filter.project = request->project();
    filter.case_name = request->case_name();
    filter.branch = request->branch();
    filter.before_id = request->before_run_id();
    filter.limit = page + 1;  // one more: is there a next page?
    absl::StatusOr<std::vector<history::RunRecord>> runs = options_.history->List(filter);
    if (!runs.ok()) return runs.status();
    const bool more = static_cast<int>(runs->size()) > page;
    if (more) runs->pop_back();
    for (const history::RunRecord& r : *runs) FillRun(r, response->add_runs());
    if (more) response->set_next_before_run_id(runs->back().id);
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

}  // namespace logitd::service
