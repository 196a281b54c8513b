#include "server/service/call/operations.h"

#include <algorithm>
#include <vector>

#include "absl/base/call_once.h"

namespace logitd::service {
namespace {

constexpr absl::string_view kWeight[] = {"weight"};
constexpr absl::string_view kDw[] = {"dw"};
constexpr absl::string_view kVerifyInputs[] = {"w", "x", "dy", "targets"};

// A span of no tensors.
constexpr absl::Span<const absl::string_view> Empty() { return {}; }

// The methods a front door serves itself; the tensor operations register
// theirs from their own files.
const OperationInfo kListed[] = {
    {"GetServerInfo", false, Empty(), Empty(), std::nullopt},
    {"RegisterWeight", true, kWeight, Empty(), std::nullopt},
    {"LoadWeight", true, Empty(), Empty(), std::nullopt},
    {"ListWeights", false, Empty(), Empty(), std::nullopt},
    {"ReleaseWeight", false, Empty(), Empty(), std::nullopt},
    {"FetchGradient", true, Empty(), kDw, std::nullopt},
    {"ZeroGradient", true, Empty(), Empty(), std::nullopt},
    {"Verify", true, kVerifyInputs, Empty(), std::nullopt},
    {"ListRuns", false, Empty(), Empty(), std::nullopt},
    {"ListProjects", false, Empty(), Empty(), std::nullopt},
    {"ListCases", false, Empty(), Empty(), std::nullopt},
    {"PromoteRun", false, Empty(), Empty(), std::nullopt},
    {"SetRules", false, Empty(), Empty(), std::nullopt},
    {"ListRules", false, Empty(), Empty(), std::nullopt},
    {"DeleteProject", false, Empty(), Empty(), std::nullopt},
    {"RecordValidation", false, Empty(), Empty(), std::nullopt},
    {"Probe", false, Empty(), Empty(), std::nullopt},
    {"RegisterShm", false, Empty(), Empty(), std::nullopt},
    {"ReleaseShm", false, Empty(), Empty(), std::nullopt},
};

// The rows registered before main, and once anything reads the table, the
// whole of it. Registration ends before main begins (static initialisers),
// so the first read sees every row.
std::vector<OperationInfo>& Registered() {
  static auto* const rows = new std::vector<OperationInfo>();
  return *rows;
}

const std::vector<OperationInfo>& Table() {
  static absl::once_flag once;
  static std::vector<OperationInfo>* table = nullptr;
  absl::call_once(once, [] {
    std::vector<OperationInfo> registered = Registered();
    std::sort(registered.begin(), registered.end(),
              [](const OperationInfo& a, const OperationInfo& b) { return a.method < b.method; });
    table = new std::vector<OperationInfo>(std::begin(kListed), std::end(kListed));
    table->insert(table->end(), registered.begin(), registered.end());
  });
  return *table;
}

}  // namespace

bool RegisterOperation(const OperationInfo& row) {
  Registered().push_back(row);
  return true;
}

absl::Span<const OperationInfo> Operations() { return Table(); }

const OperationInfo* FindOperation(absl::string_view method) {
  for (const OperationInfo& op : Table()) {
    if (op.method == method) return &op;
  }
  return nullptr;
}

const OperationInfo* FindVerifiable(VerifyOperation operation) {
  for (const OperationInfo& op : Table()) {
    if (op.verify == operation) return &op;
  }
  return nullptr;
}

}  // namespace logitd::service
