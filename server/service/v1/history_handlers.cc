// logitd.v1's history: Verify's runs recorded when its header asks
// (VerifyHeader.record), compared with a baseline and checked against the
// project's rules; ListRuns, the tenant's runs newest first; PromoteRun;
// SetRules and ListRules. The store is the server's (--history,
// server/history/history_store.h).
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "logitd/status_macros.h"
#include "server/history/history_store.h"
#include "server/history/rules.h"
#include "server/service/state/build_info.h"
#include "server/service/state/logging.h"
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

// A candidate's rows as its block digests count them: its first dimension
// (a scalar, or a shape not given: one).
std::int64_t RowsOf(const v1::CandidateVerdict& c) {
  return c.shape_size() == 0 || c.shape(0) <= 0 ? 1 : c.shape(0);
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
  f.block_rows = c.block_rows();
  f.block_digests.assign(c.block_xxh3().begin(), c.block_xxh3().end());
  f.rows = f.block_digests.empty() ? 0 : RowsOf(c);
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
  out->set_libraries(r.libraries);
  out->set_recorded_unix_micros(r.recorded_unix_us);
  out->set_baseline_run_id(r.baseline_run_id);
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
  for (const history::Alert& a : r.alerts) {
    v1::Alert* alert = out->add_alerts();
    alert->set_rule(a.rule);
    alert->set_candidate(a.candidate);
    alert->set_message(a.message);
  }
}

// The baseline's figures as the rules read them.
history::RunBaseline BaselineOf(const history::RunRecord& base,
                                const v1::RunComparison& comparison) {
  history::RunBaseline out;
  out.run_id = base.id;
  out.ref = base.labels.ref;
  for (const v1::CandidateComparison& c : comparison.candidates()) {
    for (const history::CandidateFigures& b : base.candidates) {
      if (b.name == c.name()) out.candidates[c.name()] = {c.bits(), b.worst_bound_fraction};
    }
  }
  return out;
}

absl::Status CheckProject(const std::string& project) {
  if (project.empty() || project.size() > history::kMaxLabelBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "project: expected 1 to ", history::kMaxLabelBytes, " bytes, got ", project.size()));
  }
  return absl::OkStatus();
}

// A rule as the store keeps it, or INVALID_ARGUMENT naming what is wrong
// with rules[i].
absl::StatusOr<history::Rule> RuleOf(const v1::HistoryRule& r, int i) {
  const std::string at = absl::StrCat("rules[", i, "]");
  history::Rule rule;
  for (const auto& [name, value, out] :
       {std::tuple{"case_name", &r.case_name(), &rule.case_name},
        std::tuple{"branch", &r.branch(), &rule.branch},
        std::tuple{"candidate", &r.candidate(), &rule.candidate}}) {
    if (value->size() > history::kMaxLabelBytes) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".", name, ": ", value->size(),
                                                     " bytes, more than the ",
                                                     history::kMaxLabelBytes, " a label may hold"));
    }
    *out = *value;
  }
  switch (r.check_case()) {
    case v1::HistoryRule::kBitsUnchanged:
      if (!r.bits_unchanged()) break;
      rule.check = history::Rule::Check::kBitsUnchanged;
      return rule;
    case v1::HistoryRule::kMaxWorstFractionGrowth:
      if (!std::isfinite(r.max_worst_fraction_growth()) || r.max_worst_fraction_growth() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(at,
                         ".max_worst_fraction_growth: expected a finite factor of at least 1, "
                         "got ",
                         r.max_worst_fraction_growth()));
      }
      rule.check = history::Rule::Check::kMaxWorstFractionGrowth;
      rule.limit = r.max_worst_fraction_growth();
      return rule;
    case v1::HistoryRule::kMaxP99Ulp:
      if (r.max_p99_ulp() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ".max_p99_ulp: expected 0 or more, got ", r.max_p99_ulp()));
      }
      rule.check = history::Rule::Check::kMaxP99Ulp;
      rule.limit = static_cast<double>(r.max_p99_ulp());
      return rule;
    case v1::HistoryRule::CHECK_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      at, ": expected a check: bits_unchanged (true), max_worst_fraction_growth or max_p99_ulp"));
}

void FillRule(const history::Rule& r, v1::HistoryRule* out) {
  out->set_case_name(r.case_name);
  out->set_branch(r.branch);
  out->set_candidate(r.candidate);
  switch (r.check) {
    case history::Rule::Check::kBitsUnchanged:
      out->set_bits_unchanged(true);
      break;
    case history::Rule::Check::kMaxWorstFractionGrowth:
      out->set_max_worst_fraction_growth(r.limit);
      break;
    case history::Rule::Check::kMaxP99Ulp:
      out->set_max_p99_ulp(static_cast<std::int64_t>(r.limit));
      break;
  }
}

// What differs between this server's platform and the run's ("" for none).
// The libraries of a platform, as a run keeps them: what decides the bits
// besides the backend and device.
std::string LibrariesOf(const kernels::BackendInfo& info) {
  if (info.backend == "cuda") {
    return absl::StrCat("driver ", info.driver_version, ", CUDA ", info.cuda_runtime_version,
                        ", cuBLASLt ", info.cublaslt_version, ", ", info.multiprocessor_count,
                        " SMs, split_k ", info.split_k);
  }
  return absl::StrCat(info.blas_version, ", ", info.multiprocessor_count, " threads");
}

std::string PlatformDifference(const history::RunRecord& base, const kernels::BackendInfo& info,
                               const std::string& version) {
  std::string out;
  const std::string libraries = LibrariesOf(info);
  for (const auto& [what, was, is] : {std::tuple{"backend", &base.backend, &info.backend},
                                      std::tuple{"device", &base.device, &info.device_name},
                                      std::tuple{"logitd version", &base.logitd_version, &version},
                                      std::tuple{"libraries", &base.libraries, &libraries}}) {
    // A run recorded before its libraries were kept is not said to differ.
    if (*was != *is && !(was->empty() && std::string(what) == "libraries")) {
      absl::StrAppend(&out, out.empty() ? "" : "; ", what, " ", *was, " then, ", *is, " now");
    }
  }
  return out;
}

bool Passing(const std::string& verdict) {
  return verdict.rfind("within_bounds", 0) == 0 || verdict.rfind("bitwise_equal", 0) == 0;
}

// This run's candidates against the baseline's, into *out.
void Compare(const history::RunRecord& base, const v1::VerifyResult& result,
             const std::string& platform_difference, v1::RunComparison* out) {
  out->set_baseline_run_id(base.id);
  v1::RunLabels* labels = out->mutable_baseline_labels();
  labels->set_project(base.labels.project);
  labels->set_case_name(base.labels.case_name);
  labels->set_branch(base.labels.branch);
  labels->set_ref(base.labels.ref);
  out->set_baseline_verdict(base.verdict);
  out->set_platform_difference(platform_difference);
  out->set_same_inputs(base.inputs_xxh3 == result.inputs_xxh3());
  for (const v1::CandidateVerdict& c : result.candidates()) {
    v1::CandidateComparison* cc = out->add_candidates();
    cc->set_name(c.name());
    const history::CandidateFigures* was = nullptr;
    for (const history::CandidateFigures& b : base.candidates) {
      if (b.name == c.name()) was = &b;
    }
    if (was == nullptr) {
      cc->set_bits("new");
      continue;
    }
    cc->set_baseline_verdict(was->verdict);
    cc->set_bits(was->xxh3 == c.xxh3()                           ? "identical"
                 : Passing(was->verdict) && Passing(c.verdict()) ? "different_within_bounds"
                                                                 : "different_outside_bounds");
    if (was->xxh3 != c.xxh3() && was->block_rows == c.block_rows() &&
        static_cast<int>(was->block_digests.size()) == c.block_xxh3_size()) {
      cc->set_block_rows(c.block_rows());
      cc->set_rows(RowsOf(c));
      for (int b = 0; b < c.block_xxh3_size(); ++b) {
        if (was->block_digests[b] != c.block_xxh3(b)) cc->add_changed_blocks(b);
      }
    }
    cc->set_worst_bound_fraction_delta(c.worst_bound_fraction() - was->worst_bound_fraction);
    cc->set_max_ulp_delta(c.max_ulp() - was->max_ulp);
    const double bits = c.precision_class().tested() ? c.precision_class().effective_bits() : 0;
    cc->set_effective_bits_delta(bits - was->effective_bits);
  }
}

// The latest run of the header's project and case that its `compare`
// selects, the tenant's; NOT_FOUND when there is none.
absl::StatusOr<history::RunRecord> FindBaseline(history::HistoryStore& store,
                                                const v1::VerifyHeader& header,
                                                const Tenant& tenant) {
  const v1::BaselineSelector& sel = header.compare();
  history::RunFilter f;
  f.tenant = tenant.id;
  f.project = header.record().project();
  f.case_name = header.record().case_name();
  f.branch = sel.has_branch() ? sel.branch() : "";
  f.ref = sel.has_ref() ? sel.ref() : "";
  f.run_id = sel.has_run_id() ? sel.run_id() : 0;
  f.baseline = sel.has_name() ? sel.name() : "";
  f.limit = 1;
  LOGITD_ASSIGN_OR_RETURN(std::vector<history::RunRecord> base, store.List(f));
  if (base.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "compare: no recorded run of project '", f.project, "', case '", f.case_name, "' ",
        sel.has_branch() ? absl::StrCat("on branch '", f.branch, "'")
        : sel.has_ref()  ? absl::StrCat("at ref '", f.ref, "'")
        : sel.has_name() ? absl::StrCat("promoted as '", f.baseline, "'")
                         : absl::StrCat("with id ", f.run_id),
        " for this caller"));
  }
  return std::move(base.front());
}

}  // namespace

absl::Status LogitdService::CheckRecord(const v1::VerifyHeader& header) const {
  if (!header.has_record()) return absl::OkStatus();
  if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
  return history::CheckLabels(LabelsOf(header.record()));
}

absl::Status LogitdService::CheckCompare(const v1::VerifyHeader& header,
                                         const Tenant& tenant) const {
  if (!header.has_compare()) return absl::OkStatus();
  if (!header.has_record()) {
    return absl::InvalidArgumentError(
        "compare: needs record, whose project and case_name name the runs it compares with");
  }
  if (header.compare().baseline_case() == v1::BaselineSelector::BASELINE_NOT_SET) {
    return absl::InvalidArgumentError("compare: expected one of branch, ref, run_id and name");
  }
  // Before the work: a baseline that is not there now is refused at once
  // (unless the caller records without one then).
  absl::Status found = FindBaseline(*options_.history, header, tenant).status();
  if (absl::IsNotFound(found) && header.compare().if_present()) return absl::OkStatus();
  return found;
}

absl::Status LogitdService::Record(const v1::VerifyHeader& header, const Tenant& tenant,
                                   v1::VerifyResult* result, absl::string_view operation) const {
  if (!header.has_record() || options_.history == nullptr) return absl::OkStatus();
  // The verdict is formed: a store that fails now leaves the run unrecorded,
  // said in the result, and the call answers.
  const std::string op =
      operation.empty() ? v1::VerifyOperation_Name(header.operation()) : std::string(operation);
  if (absl::Status s = RecordRun(header, tenant, op, result); !s.ok()) {
    result->clear_comparison();
    result->clear_alerts();
    result->set_run_id(0);
    result->set_record_error(
        absl::StrCat("the run was not recorded in the server's history: ", s.message()));
    LogWarning(absl::StrCat(op, ": ", result->record_error()));
  }
  return absl::OkStatus();
}

absl::Status LogitdService::RecordRun(const v1::VerifyHeader& header, const Tenant& tenant,
                                      absl::string_view operation, v1::VerifyResult* result) const {
  const kernels::BackendInfo info = backend_->Info();
  std::optional<history::RunBaseline> baseline;
  std::int64_t baseline_run_id = 0;
  if (header.has_compare()) {
    // The baseline before this run is recorded (a branch's latest is
    // another run than this one).
    absl::StatusOr<history::RunRecord> base = FindBaseline(*options_.history, header, tenant);
    if (base.ok()) {
      Compare(*base, *result, PlatformDifference(*base, info, std::string(Version())),
              result->mutable_comparison());
      baseline = BaselineOf(*base, result->comparison());
      baseline_run_id = base->id;
    } else if (!absl::IsNotFound(base.status()) || !header.compare().if_present()) {
      return base.status();
    }
  }
  history::RunRecord run;
  run.tenant = tenant.id;
  run.labels = LabelsOf(header.record());
  run.operation = std::string(operation);
  run.inputs_xxh3 = result->inputs_xxh3();
  run.verdict = result->verdict();
  run.backend = info.backend;
  run.device = info.device_name;
  run.logitd_version = std::string(Version());
  run.libraries = LibrariesOf(info);
  run.baseline_run_id = baseline_run_id;
  for (const v1::CandidateVerdict& c : result->candidates()) {
    run.candidates.push_back(FiguresOf(c));
  }
  LOGITD_ASSIGN_OR_RETURN(const std::vector<history::Rule> rules,
                          options_.history->Rules(run.tenant, run.labels.project));
  run.alerts = history::Evaluate(rules, run, baseline ? &*baseline : nullptr);
  LOGITD_RETURN_IF_ERROR(
      options_.history->Record(&run, options_.history_max_runs, options_.history_max_bytes));
  result->set_run_id(run.id);
  for (const history::Alert& a : run.alerts) {
    v1::Alert* alert = result->add_alerts();
    alert->set_rule(a.rule);
    alert->set_candidate(a.candidate);
    alert->set_message(a.message);
  }
  if (options_.metrics != nullptr) {
    std::vector<std::string> bits;
    for (const v1::CandidateComparison& c : result->comparison().candidates()) {
      bits.push_back(c.bits());
    }
    std::vector<std::string> checks;
    for (const history::Alert& a : run.alerts) {
      checks.push_back(a.rule.substr(0, a.rule.find_first_of("= ")));
    }
    options_.metrics->RecordRun(result->verdict(), bits, checks);
  }
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
    if (request->recorded_after_unix_micros() < 0 || request->recorded_before_unix_micros() < 0) {
      return absl::InvalidArgumentError(
          "recorded_after_unix_micros, recorded_before_unix_micros: expected 0 (unbounded) or a "
          "time in microseconds since 1970");
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
    filter.run_id = request->run_id();
    filter.backend = request->backend();
    filter.device = request->device();
    filter.after_unix_us = request->recorded_after_unix_micros();
    filter.before_unix_us = request->recorded_before_unix_micros();
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

grpc::Status LogitdService::ListProjects(grpc::ServerContext* context,
                                         const v1::ListProjectsRequest* request,
                                         v1::ListProjectsResponse* response) {
  return runner_.Run("ListProjects", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    LOGITD_ASSIGN_OR_RETURN(const std::vector<history::ProjectSummary> projects,
                            options_.history->Projects(stats->tenant.id));
    for (const history::ProjectSummary& p : projects) {
      v1::ProjectSummary* out = response->add_projects();
      out->set_project(p.project);
      out->set_cases(p.cases);
      out->set_runs(p.runs);
      out->set_alerts(p.alerts);
      out->set_latest_unix_micros(p.latest_unix_us);
    }
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::ListCases(grpc::ServerContext* context,
                                      const v1::ListCasesRequest* request,
                                      v1::ListCasesResponse* response) {
  return runner_.Run("ListCases", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    LOGITD_RETURN_IF_ERROR(CheckProject(request->project()));
    LOGITD_ASSIGN_OR_RETURN(const std::vector<history::CaseSummary> cases,
                            options_.history->Cases(stats->tenant.id, request->project()));
    for (const history::CaseSummary& c : cases) {
      v1::CaseSummary* out = response->add_cases();
      out->set_case_name(c.case_name);
      out->set_runs(c.runs);
      out->set_alerts(c.alerts);
      out->set_latest_run_id(c.latest_run_id);
      out->set_latest_unix_micros(c.latest_unix_us);
      out->set_latest_verdict(c.latest_verdict);
      out->set_latest_branch(c.latest_branch);
      out->set_latest_ref(c.latest_ref);
    }
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::PromoteRun(grpc::ServerContext* context,
                                       const v1::PromoteRunRequest* request,
                                       v1::PromoteRunResponse* /*response*/) {
  return runner_.Run("PromoteRun", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    if (request->name().empty() || request->name().size() > history::kMaxLabelBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "name: expected 1 to ", history::kMaxLabelBytes, " bytes, got ", request->name().size()));
    }
    return options_.history->Promote(stats->tenant.id, request->run_id(), request->name());
  });
}

grpc::Status LogitdService::SetRules(grpc::ServerContext* context,
                                     const v1::SetRulesRequest* request,
                                     v1::SetRulesResponse* /*response*/) {
  return runner_.Run("SetRules", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    LOGITD_RETURN_IF_ERROR(CheckProject(request->project()));
    if (request->rules_size() > history::kMaxRules) {
      return absl::InvalidArgumentError(absl::StrCat("rules: at most ", history::kMaxRules,
                                                     " a project, got ", request->rules_size()));
    }
    std::vector<history::Rule> rules;
    for (int i = 0; i < request->rules_size(); ++i) {
      LOGITD_ASSIGN_OR_RETURN(history::Rule rule, RuleOf(request->rules(i), i));
      rules.push_back(std::move(rule));
    }
    return options_.history->SetRules(stats->tenant.id, request->project(), rules);
  });
}

grpc::Status LogitdService::ListRules(grpc::ServerContext* context,
                                      const v1::ListRulesRequest* request,
                                      v1::ListRulesResponse* response) {
  return runner_.Run("ListRules", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    LOGITD_RETURN_IF_ERROR(CheckProject(request->project()));
    LOGITD_ASSIGN_OR_RETURN(const std::vector<history::Rule> rules,
                            options_.history->Rules(stats->tenant.id, request->project()));
    for (const history::Rule& r : rules) FillRule(r, response->add_rules());
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

grpc::Status LogitdService::DeleteProject(grpc::ServerContext* context,
                                          const v1::DeleteProjectRequest* request,
                                          v1::DeleteProjectResponse* response) {
  return runner_.Run("DeleteProject", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    LOGITD_RETURN_IF_ERROR(CheckProject(request->project()));
    LOGITD_ASSIGN_OR_RETURN(const std::int64_t runs,
                            options_.history->DeleteProject(stats->tenant.id, request->project()));
    response->set_runs_deleted(runs);
    return absl::OkStatus();
  });
}

namespace {

constexpr int kMaxValidatedCases = 1000;
constexpr int kMaxValidatedOutputs = 64;

// A validated case's own checks (its labels are checked as a run's).
absl::Status CheckValidatedCase(const v1::ValidatedCase& c) {
  const auto judged = [](const std::string& v) {
    return v == "within_bounds" || v == "outside_bounds";
  };
  if (!judged(c.verdict())) {
    return absl::InvalidArgumentError(
        absl::StrCat("verdict: expected within_bounds or outside_bounds, got '", c.verdict(), "'"));
  }
  if (c.outputs_size() == 0 || c.outputs_size() > kMaxValidatedOutputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("outputs: expected 1 to ", kMaxValidatedOutputs, ", got ", c.outputs_size()));
  }
  std::set<std::string> names;
  for (const v1::CandidateVerdict& o : c.outputs()) {
    if (o.name().empty() || o.name().size() > history::kMaxLabelBytes ||
        !names.insert(o.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("outputs: each needs a name of 1 to ",
                                                     history::kMaxLabelBytes, " bytes, once; got '",
                                                     o.name().substr(0, 64), "'"));
    }
    if (!judged(o.verdict())) {
      return absl::InvalidArgumentError(absl::StrCat("outputs '", o.name(),
                                                     "': verdict: expected within_bounds or "
                                                     "outside_bounds, got '",
                                                     o.verdict(), "'"));
    }
    if (o.block_xxh3_size() > 64 || o.block_rows() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs '", o.name(), "': expected at most 64 block digests of block_rows >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status LogitdService::RecordValidation(grpc::ServerContext* context,
                                             const v1::RecordValidationRequest* request,
                                             v1::RecordValidationResponse* response) {
  return runner_.Run("RecordValidation", context, [&](CallStats* stats) -> absl::Status {
    stats->bytes_in = request->ByteSizeLong();
    if (options_.history == nullptr) return absl::FailedPreconditionError(kNoHistory);
    if (request->cases_size() == 0 || request->cases_size() > kMaxValidatedCases) {
      return absl::InvalidArgumentError(absl::StrCat("cases: expected 1 to ", kMaxValidatedCases,
                                                     ", got ", request->cases_size()));
    }
    // Every case checked, and its baseline found, before any is recorded.
    std::vector<v1::VerifyHeader> headers(static_cast<std::size_t>(request->cases_size()));
    for (int i = 0; i < request->cases_size(); ++i) {
      const v1::ValidatedCase& c = request->cases(i);
      v1::VerifyHeader& h = headers[static_cast<std::size_t>(i)];
      *h.mutable_record() = request->labels();
      h.mutable_record()->set_case_name(c.case_name());
      if (request->has_compare()) *h.mutable_compare() = request->compare();
      absl::Status s = CheckRecord(h);
      if (s.ok()) s = CheckValidatedCase(c);
      if (s.ok()) s = CheckCompare(h, stats->tenant);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("cases[", i, "] ('", c.case_name().substr(0, 64),
                                                   "'): ", s.message()));
      }
    }
    for (int i = 0; i < request->cases_size(); ++i) {
      const v1::ValidatedCase& c = request->cases(i);
      v1::VerifyResult* r = response->add_cases();
      r->set_inputs_xxh3(c.inputs_xxh3());
      r->set_verdict(c.verdict());
      *r->mutable_candidates() = c.outputs();
      LOGITD_RETURN_IF_ERROR(Record(headers[static_cast<std::size_t>(i)], stats->tenant, r,
                                    v1::VerifyOperation_Name(v1::VERIFY_VALIDATION)));
    }
    stats->bytes_out = response->ByteSizeLong();
    return absl::OkStatus();
  });
}

}  // namespace logitd::service
