// The history's rules: Client::SetRules and ListRules, and the alerts a
// recorded run raised under them (history_types.h).
#include <utility>

#include "client/cpp/call_tensors.h"
#include "client/cpp/client_impl.h"
#include "logitd/client.h"

namespace logitd::client {

std::vector<Alert> AlertsOf(const google::protobuf::RepeatedPtrField<v1::Alert>& alerts) {
  std::vector<Alert> out;
  for (const v1::Alert& a : alerts) out.push_back(Alert{a.rule(), a.candidate(), a.message()});
  return out;
}

namespace {

void FillRule(const HistoryRule& r, v1::HistoryRule* out) {
  out->set_case_name(r.case_name);
  out->set_branch(r.branch);
  out->set_candidate(r.candidate);
  switch (r.check) {
    case HistoryRule::Check::kBitsUnchanged:
      out->set_bits_unchanged(true);
      break;
    case HistoryRule::Check::kMaxWorstFractionGrowth:
      out->set_max_worst_fraction_growth(r.limit);
      break;
    case HistoryRule::Check::kMaxP99Ulp:
      out->set_max_p99_ulp(static_cast<std::int64_t>(r.limit));
      break;
  }
}

HistoryRule RuleOf(const v1::HistoryRule& r) {
  HistoryRule out;
  out.case_name = r.case_name();
  out.branch = r.branch();
  out.candidate = r.candidate();
  if (r.has_max_worst_fraction_growth()) {
    out.check = HistoryRule::Check::kMaxWorstFractionGrowth;
    out.limit = r.max_worst_fraction_growth();
  } else if (r.has_max_p99_ulp()) {
    out.check = HistoryRule::Check::kMaxP99Ulp;
    out.limit = static_cast<double>(r.max_p99_ulp());
  }
  return out;
}

}  // namespace

absl::Status Client::SetRules(const std::string& project, const std::vector<HistoryRule>& rules) {
  absl::StatusOr<bool> done =
      impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<bool> {
        v1::SetRulesRequest request;
        request.set_project(project);
        for (const HistoryRule& r : rules) FillRule(r, request.add_rules());
        v1::SetRulesResponse response;
        if (absl::Status s = FromGrpc(impl_->stub->SetRules(&context, request, &response));
            !s.ok()) {
          return s;
        }
        return true;
      });
  return done.status();
}

absl::StatusOr<std::vector<HistoryRule>> Client::ListRules(const std::string& project) {
  return impl_->Call(
      true, [&](grpc::ClientContext& context) -> absl::StatusOr<std::vector<HistoryRule>> {
        v1::ListRulesRequest request;
        request.set_project(project);
        v1::ListRulesResponse response;
        if (absl::Status s = FromGrpc(impl_->stub->ListRules(&context, request, &response));
            !s.ok()) {
          return s;
        }
        std::vector<HistoryRule> out;
        for (const v1::HistoryRule& r : response.rules()) out.push_back(RuleOf(r));
        return out;
      });
}

absl::StatusOr<std::int64_t> Client::DeleteProject(const std::string& project) {
  return impl_->Call(true, [&](grpc::ClientContext& context) -> absl::StatusOr<std::int64_t> {
    v1::DeleteProjectRequest request;
    request.set_project(project);
    v1::DeleteProjectResponse response;
    if (absl::Status s = FromGrpc(impl_->stub->DeleteProject(&context, request, &response));
        !s.ok()) {
      return s;
    }
    return response.runs_deleted();
  });
}

absl::StatusOr<std::vector<ProjectSummary>> Client::ListProjects() {
  return impl_->Call(
      true, [&](grpc::ClientContext& context) -> absl::StatusOr<std::vector<ProjectSummary>> {
        v1::ListProjectsResponse response;
        if (absl::Status s =
                FromGrpc(impl_->stub->ListProjects(&context, v1::ListProjectsRequest(), &response));
            !s.ok()) {
          return s;
        }
        std::vector<ProjectSummary> out;
        for (const v1::ProjectSummary& p : response.projects()) {
          out.push_back(
              ProjectSummary{p.project(), p.cases(), p.runs(), p.alerts(), p.latest_unix_micros()});
        }
        return out;
      });
}

absl::StatusOr<std::vector<CaseSummary>> Client::ListCases(const std::string& project) {
  return impl_->Call(
      true, [&](grpc::ClientContext& context) -> absl::StatusOr<std::vector<CaseSummary>> {
        v1::ListCasesRequest request;
        request.set_project(project);
        v1::ListCasesResponse response;
        if (absl::Status s = FromGrpc(impl_->stub->ListCases(&context, request, &response));
            !s.ok()) {
          return s;
        }
        std::vector<CaseSummary> out;
        for (const v1::CaseSummary& c : response.cases()) {
          out.push_back(CaseSummary{c.case_name(), c.runs(), c.alerts(), c.latest_run_id(),
                                    c.latest_unix_micros(), c.latest_verdict(), c.latest_branch(),
                                    c.latest_ref()});
        }
        return out;
      });
}

absl::StatusOr<std::vector<RecordedCase>> Client::RecordValidation(
    const RecordValidationArgs& args) {
  v1::RecordValidationRequest request;
  v1::RunLabels* labels = request.mutable_labels();
  labels->set_project(args.labels.project);
  labels->set_branch(args.labels.branch);
  labels->set_ref(args.labels.ref);
  if (args.compare.has_value()) SetBaselineSelector(*args.compare, request.mutable_compare());
  for (const ValidatedCase& c : args.cases) {
    v1::ValidatedCase* out = request.add_cases();
    out->set_case_name(c.case_name);
    out->set_inputs_xxh3(c.inputs_xxh3);
    out->set_verdict(c.within_bounds ? "within_bounds" : "outside_bounds");
    for (const ValidatedOutput& o : c.outputs) {
      v1::CandidateVerdict* v = out->add_outputs();
      v->set_name(o.name);
      v->set_xxh3(o.xxh3);
      for (std::int64_t d : o.shape) v->add_shape(d);
      v->set_elements(o.elements);
      v->set_passed(o.within_bounds);
      v->set_verdict(o.within_bounds ? "within_bounds" : "outside_bounds");
      v->set_worst_bound_fraction(o.worst_bound_fraction);
      v->set_block_rows(o.block_rows);
      for (std::uint64_t d : o.block_xxh3) v->add_block_xxh3(d);
    }
  }
  // Not idempotent: an attempt that reached the store before its answer was
  // lost would record the cases twice.
  return impl_->Call(
      false, [&](grpc::ClientContext& context) -> absl::StatusOr<std::vector<RecordedCase>> {
        v1::RecordValidationResponse response;
        if (absl::Status s = FromGrpc(impl_->stub->RecordValidation(&context, request, &response));
            !s.ok()) {
          return s;
        }
        std::vector<RecordedCase> out;
        for (int i = 0; i < response.cases_size(); ++i) {
          const v1::VerifyResult& r = response.cases(i);
          RecordedCase c;
          c.case_name = i < request.cases_size() ? request.cases(i).case_name() : "";
          c.run_id = r.run_id();
          if (r.has_comparison()) c.comparison = ComparisonOf(r.comparison());
          c.alerts = AlertsOf(r.alerts());
          c.record_error = r.record_error();
          out.push_back(std::move(c));
        }
        return out;
      });
}

}  // namespace logitd::client
