#include "server/flags_help.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace logitd {
namespace {

constexpr std::size_t kWidth = 80;
constexpr absl::string_view kIndent = "      ";

// Words of `text` in lines of at most kWidth columns, each indented.
void AppendWrapped(std::string* out, absl::string_view text) {
  std::string line(kIndent);
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (line.size() > kIndent.size() && line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(out, line, "\n");
      line = std::string(kIndent);
    }
    if (line.size() > kIndent.size()) line += ' ';
    absl::StrAppend(&line, word);
  }
  if (line.size() > kIndent.size()) absl::StrAppend(out, line, "\n");
}

void AppendFlag(std::string* out, const absl::CommandLineFlag& flag) {
  const std::string def = flag.DefaultValue();
  absl::StrAppend(out, "  --", flag.Name(), "  (default: ", def.empty() ? "none" : def, ")\n");
  AppendWrapped(out, flag.Help());
}

bool DefinedByLogitd(const absl::CommandLineFlag& flag) {
  return absl::EndsWith(flag.Filename(), "server/flags.cc");
}

}  // namespace

const std::vector<FlagGroup>& FlagGroups() {
  static const std::vector<FlagGroup> groups = {
      {"Network",
       {"address", "port_file", "chunk_bytes", "oip", "allow_shm", "shm_max_region_bytes",
        "shm_in_place"}},
      {"Backend",
       {"backend", "device", "split_k", "algo_cache", "cpu_threads", "ce_workspace_bytes",
        "pinned_cache_bytes", "device_timeout"}},
      {"Limits",
       {"weight_budget_bytes", "max_request_bytes", "request_memory_bytes",
        "max_concurrent_requests", "admission_wait", "weights_dir"}},
      {"History", {"history", "history_max_runs", "history_max_bytes"}},
      {"Security",
       {"auth_tokens", "tenant_quota_bytes", "insecure_allow_remote", "tls_cert", "tls_key",
        "tls_client_ca"}},
      {"Observability", {"log_level", "metrics_address", "metrics_port_file"}},
      {"Testing", {"test_fault"}},
  };
  return groups;
}

std::string FlagsHelp() {
  std::string out = absl::StrCat(absl::ProgramUsageMessage(), "\n");
  std::set<std::string> listed;
  for (const FlagGroup& group : FlagGroups()) {
    absl::StrAppend(&out, "\n", group.title, ":\n");
    for (const char* name : group.flags) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag == nullptr) continue;
      AppendFlag(&out, *flag);
      listed.insert(name);
    }
  }
  std::vector<const absl::CommandLineFlag*> others;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (DefinedByLogitd(*flag) && listed.count(std::string(name)) == 0) others.push_back(flag);
  }
  if (!others.empty()) {
    std::sort(others.begin(), others.end(),
              [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
    absl::StrAppend(&out, "\nOther:\n");
    for (const absl::CommandLineFlag* flag : others) AppendFlag(&out, *flag);
  }
  absl::StrAppend(&out,
                  "\n--version prints the version and build; --helpfull lists every flag, the "
                  "libraries' included.\nFlags and defaults: docs/OPERATIONS.md.\n");
  return out;
}

}  // namespace logitd
