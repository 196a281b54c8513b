// The history's pages, served on the metrics port under /history: a
// tenant's projects, a project's cases, a case's runs with a plot of each
// figure over them (a line per candidate and branch), and one run with its
// candidates, alerts and the rules of its project. Server-rendered HTML and
// inline SVG, no script; every name a caller chose is escaped.
#pragma once

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "server/history/history_store.h"

namespace logitd::history {

struct DashboardPage {
  int status = 200;  // 200, 400, 404 or 500
  std::string content_type = "text/html; charset=utf-8";
  std::string body;
};

// The most runs a case page reads (newest first), and its table lists.
inline constexpr int kCasePageRuns = 1000;
inline constexpr int kCaseTableRuns = 200;

// The page at `path` ("/history", "/history/project", "/history/case",
// "/history/run") with its query parameters (project, case, branch, run),
// of `tenant`'s history ("" for the default tenant).
DashboardPage RenderDashboard(HistoryStore& store, const std::string& tenant,
                              absl::string_view path,
                              const std::map<std::string, std::string>& query);

}  // namespace logitd::history
