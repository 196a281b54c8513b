#include "server/service/state/auth.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/service/state/logging.h"

namespace logitd::service {
namespace {

constexpr std::size_t kMaxTenantLength = 128;

bool ValidToken(absl::string_view token) {
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) return false;  // visible ASCII, as a header value allows
  }
  return !token.empty();
}

bool ValidTenant(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > kMaxTenantLength) return false;
  for (char c : tenant) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' &&
        c != '@') {
      return false;
    }
  }
  return true;
}

// Compares every byte whatever the contents, so that the time taken does not
// tell a caller how much of a token it guessed right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

// "%5B" and "%5D" (brackets of an IPv6 peer, as some gRPC versions write them).
std::string DecodeBrackets(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const absl::string_view code = s.substr(i + 1, 2);
      if (absl::EqualsIgnoreCase(code, "5B")) {
        out.push_back('[');
        i += 2;
        continue;
      }
      if (absl::EqualsIgnoreCase(code, "5D")) {
        out.push_back(']');
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

absl::StatusOr<TokenTable> ParseTokenTable(absl::string_view contents, absl::string_view source,
                                           std::uint64_t default_quota_bytes) {
  TokenTable table;
  // Tenant -> quota given in its third column, and the line that gave it.
  std::map<std::string, std::pair<std::uint64_t, int>> explicit_quota;
  std::set<std::string> tenants;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat(source, ":", line_number, ": ");
    if (fields.size() < 2 || fields.size() > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected 'TOKEN TENANT [QUOTA_BYTES]', got ", fields.size(),
                       fields.size() == 1 ? " field" : " fields"));
    }
    if (!ValidToken(fields[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "the token may hold only visible ASCII characters"));
    }
    if (!ValidTenant(fields[1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected a tenant name of 1 to ", kMaxTenantLength,
                       " letters, digits, '.', '_', '-' or '@', got '", fields[1], "'"));
    }
    const std::string tenant(fields[1]);
    if (fields.size() == 3) {
      std::uint64_t quota = 0;
      if (!absl::SimpleAtoi(fields[2], &quota) || !absl::ascii_isdigit(fields[2].front())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "expected the quota as a non-negative integer number of bytes, got '", fields[2],
            "'"));
      }
      auto [it, inserted] = explicit_quota.emplace(tenant, std::make_pair(quota, line_number));
      if (!inserted && it->second.first != quota) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "tenant '", tenant, "' has quota ", quota, " here but ", it->second.first,
            " on line ", it->second.second, "; give one quota per tenant"));
      }
    }
    if (table.tenants_by_token.count(fields[0]) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "this token is listed twice; every token must name exactly one tenant"));
    }
    table.tenants_by_token.emplace(std::string(fields[0]), Tenant{tenant, 0});
    tenants.insert(tenant);
  }
  if (table.tenants_by_token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": no tokens (expected lines of 'TOKEN TENANT [QUOTA_BYTES]'); an "
                     "empty tokens file would refuse every call"));
  }
  // A tenant's quota applies to all its tokens, wherever it was given.
  for (auto& [token, tenant] : table.tenants_by_token) {
    auto it = explicit_quota.find(tenant.id);
    tenant.quota_bytes = it == explicit_quota.end() ? default_quota_bytes : it->second.first;
  }
  table.tenant_count = tenants.size();
  return table;
}

absl::StatusOr<TokenTable> LoadTokenTable(const std::string& path,
                                          std::uint64_t default_quota_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens: cannot read '", path, "': ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_tokens: error reading '", path, "'"));
  }
  struct stat st = {};
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) != 0) {
    LogWarning(absl::StrCat("--auth_tokens: '", path,
                            "' is readable by every user of this machine; chmod o-r it"));
  }
  return ParseTokenTable(ss.str(), absl::StrCat("--auth_tokens '", path, "' line"),
                         default_quota_bytes);
}

bool IsLoopbackPeer(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) return true;
  if (peer == "inproc") return true;  // an in-process channel: this very process
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    return absl::StartsWith(peer, "127.");
  }
  if (absl::ConsumePrefix(&peer, "ipv6:")) {
    const std::string host = absl::AsciiStrToLower(DecodeBrackets(peer));
    return absl::StartsWith(host, "[::1]") || absl::StartsWith(host, "[::ffff:127.");
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(AuthOptions options) {
  std::unique_ptr<Authenticator> auth(new Authenticator(std::move(options)));
  if (auth->tokens_enabled()) {
    absl::StatusOr<TokenTable> table =
        LoadTokenTable(auth->options_.tokens_path, auth->options_.default_quota_bytes);
    if (!table.ok()) return table.status();
    absl::MutexLock lock(&auth->mu_);
    auth->table_ = std::make_shared<const TokenTable>(*std::move(table));
  }
  return auth;
}

absl::StatusOr<Tenant> Authenticator::Authenticate(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  std::optional<absl::string_view> authorization;
  if (it != metadata.end()) authorization = absl::string_view(it->second.data(), it->second.size());
  return AuthenticateBearer(authorization, context.peer());
}

absl::StatusOr<Tenant> Authenticator::AuthenticateBearer(
    std::optional<absl::string_view> authorization, absl::string_view peer) const {
  if (!tokens_enabled()) {
    if (!options_.allow_remote && !IsLoopbackPeer(peer)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "this server accepts calls only from its own machine because it runs without "
          "authentication (peer ",
          peer,
          "); its operator must start logitd with --auth_tokens=FILE (bearer tokens per "
          "tenant), or with --insecure_allow_remote to serve any caller without one"));
    }
    return Tenant{"", options_.default_quota_bytes};
  }
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "this server requires a bearer token: send the metadata 'authorization: Bearer TOKEN' "
        "(logitctl --token or $LOGITD_TOKEN, Python Client(token=...), C++ "
        "ClientOptions::auth_token); ask the server's operator for a token");
  }
  absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError(
        "the 'authorization' metadata must be 'Bearer TOKEN' (another scheme or no token was "
        "sent)");
  }
  const absl::string_view token = absl::StripLeadingAsciiWhitespace(value.substr(kScheme.size()));
  std::shared_ptr<const TokenTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  // Every entry is compared, in constant time, so that timing reveals nothing.
  const Tenant* found = nullptr;
  for (const auto& [known, tenant] : table->tenants_by_token) {
    if (ConstantTimeEquals(known, token)) found = &tenant;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError(
        "the bearer token is not known to this server (mistyped, revoked, or meant for another "
        "server); check the token you pass, or ask the server's operator for a valid one");
  }
  return *found;
}

absl::StatusOr<std::string> Authenticator::Reload() {
  if (!tokens_enabled()) {
    return absl::FailedPreconditionError("no --auth_tokens file: nothing to reload");
  }
  absl::StatusOr<TokenTable> table =
      LoadTokenTable(options_.tokens_path, options_.default_quota_bytes);
  if (!table.ok()) return table.status();
  const std::string summary =
      absl::StrCat(table->tenants_by_token.size(), " tokens for ", table->tenant_count,
                   " tenants from '", options_.tokens_path, "'");
  auto shared = std::make_shared<const TokenTable>(*std::move(table));
  absl::MutexLock lock(&mu_);
  table_ = std::move(shared);
  return summary;
}

}  // namespace logitd::service
