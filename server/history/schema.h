// The history's schema, one step per version: step i takes a database from
// version i to i + 1. Steps are only ever appended.
#pragma once

#include <string>
#include <vector>

#include "server/history/sql.h"

namespace logitd::history {

// 1: runs and candidates; 2: named baselines; 3: rules and alerts; 4:
// candidates' block digests; 5: each run's bytes; 6: the run it was
// compared with; 7: each candidate's rows; 8: the run's libraries.
inline constexpr int kSchemaVersion = 8;

// The steps in the dialect's SQL (PostgreSQL's derived from SQLite's).
std::vector<std::string> Migrations(sql::Dialect dialect);

}  // namespace logitd::history
