// The history's schema, one step per version in each dialect: step i takes
// a database from version i to i + 1. Steps are only ever appended, in both
// lists at once.
#pragma once

#include "absl/types/span.h"
#include "server/history/sql.h"

namespace logitd::history {

// 1: runs and candidates; 2: named baselines; 3: rules and alerts; 4:
// candidates' block digests; 5: each run's bytes; 6: the run it was
// compared with; 7: each candidate's rows.
inline constexpr int kSchemaVersion = 7;

absl::Span<const char* const> Migrations(sql::Dialect dialect);

}  // namespace logitd::history
