#include "server/history/sql.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace logitd::history::sql {

void Statement::Bind(int i, std::uint64_t v) {
  std::int64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  Bind(i, bits);
}

std::uint64_t Statement::Uint(int i) const {
  const std::int64_t bits = Int(i);
  std::uint64_t v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

absl::Status Statement::Run() {
  absl::StatusOr<bool> row = Next();
  return row.ok() ? absl::OkStatus() : row.status();
}

bool IsPostgresUri(absl::string_view spec) {
  return absl::StartsWith(spec, "postgresql://") || absl::StartsWith(spec, "postgres://");
}

std::string RedactUri(absl::string_view uri) {
  // scheme://user:password@host… → scheme://user:***@host…
  const std::size_t scheme = uri.find("://");
  if (scheme == absl::string_view::npos) return std::string(uri);
  const std::size_t start = scheme + 3;
  const std::size_t at = uri.find('@', start);
  if (at == absl::string_view::npos) return std::string(uri);
  const std::size_t colon = uri.substr(start, at - start).find(':');
  if (colon == absl::string_view::npos) return std::string(uri);
  return absl::StrCat(uri.substr(0, start + colon + 1), "***", uri.substr(at));
}

}  // namespace logitd::history::sql
