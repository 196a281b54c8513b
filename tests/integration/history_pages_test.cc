// The history's pages on the metrics port, through the real binary: with
// tokens a page needs the caller's (401 and WWW-Authenticate without it) and
// shows only its tenant's projects; names a caller chose are escaped; a
// case's page plots its figures and lists its runs; a run's page shows its
// candidates and alerts; bad pages are 400 or 404 and other methods 405; a
// server without history answers 404. And DeleteProject: a project removed
// is gone from the pages and from ListRuns, and removing it again is
// NOT_FOUND (logitctl exit 2).
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "logitd/client.h"
#include "tests/common/loopback_exchange.h"
#include "tests/common/seeded_tensors.h"
#include "tests/integration/integration_util.h"
#include "tests/support/run_logitctl.h"

namespace logitd::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kMarkupCase[] = "<b>bold</b>&'\"";

struct Answer {
  int status = 0;
  std::string head;
  std::string body;
};

Answer Get(int port, const std::string& target, const std::string& token = "",
           const std::string& method = "GET") {
  std::string request = absl::StrCat(method, " ", target, " HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  if (!token.empty()) absl::StrAppend(&request, "Authorization: Bearer ", token, "\r\n");
  absl::StrAppend(&request, "Connection: close\r\n\r\n");
  absl::StatusOr<std::string> got = LoopbackExchange(port, request);
  EXPECT_TRUE(got.ok()) << got.status();
  Answer a;
  if (!got.ok()) return a;
  const std::size_t split = got->find("\r\n\r\n");
  a.head = got->substr(0, split);
  a.body = split == std::string::npos ? "" : got->substr(split + 4);
  (void)absl::SimpleAtoi(a.head.substr(9, 3), &a.status);
  return a;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct PagesServer {
  TempDir dir;
  std::unique_ptr<ServerProcess> process;
  int http = 0;

  static std::unique_ptr<PagesServer> Start(const std::string& history) {
    auto s = std::make_unique<PagesServer>();
    std::ofstream(s->dir / "tokens") << "tok-a team-a\ntok-b team-b\n";
    absl::StatusOr<ServerProcess> p = ServerProcess::Start(
        ServerBinary(),
        {"--backend=cpu", "--metrics_address=127.0.0.1:0",
         "--metrics_port_file=" + (s->dir / "mport"), "--auth_tokens=" + (s->dir / "tokens"),
         "--history=" + (history == "none" ? history : s->dir / history)});
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    s->process = std::make_unique<ServerProcess>(*std::move(p));
    std::ifstream in(s->dir / "mport");
    in >> s->http;
    return s;
  }
  std::unique_ptr<client::Client> Connect(const std::string& token) const {
    client::ClientOptions o;
    o.auth_token = token;
    absl::StatusOr<std::unique_ptr<client::Client>> c =
        client::Client::Create(process->address(), o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
};

// Records `runs` logits Verify runs of `case_name` for the client's tenant;
// the last run's id.
std::int64_t Record(client::Client& c, const std::string& case_name, int runs, bool flip_last) {
  const Tensor w = NormalBf16({40, 24}, 3), x = NormalBf16({4, 24}, 4);
  absl::StatusOr<client::WeightInfo> info = c.RegisterWeight(w, "pages");
  EXPECT_TRUE(info.ok()) << info.status();
  absl::StatusOr<Tensor> y = c.Logits(x, info->handle);
  EXPECT_TRUE(y.ok()) << y.status();
  std::int64_t last = 0;
  for (int i = 0; i < runs; ++i) {
    if (flip_last && i == runs - 1) y->data<float>()[2] = std::nextafter(y->data<float>()[2], 1e9f);
    client::VerifyArgs args;
    args.operation = client::VerifyOperation::kLogits;
    args.weight_handle = info->handle;
    args.x = x;
    args.candidates["y"] = *y;
    args.record = client::RunLabels{"lm", case_name, i % 2 ? "main" : "dev", absl::StrCat("r", i)};
    if (i > 0) args.compare = client::BaselineSelector{"", "", last, "", false};
    absl::StatusOr<client::VerifyResult> v = c.Verify(args);
    EXPECT_TRUE(v.ok()) << v.status();
    if (v.ok()) last = v->run_id;
  }
  return last;
}

TEST(HistoryPagesTest, PagesShowTheCallersTenantEscapedPlottedAndRefuseTheRest) {
  std::unique_ptr<PagesServer> s = PagesServer::Start("h.sqlite3");
  ASSERT_NE(s, nullptr);
  std::unique_ptr<client::Client> a = s->Connect("tok-a");
  client::HistoryRule rule;
  rule.check = client::HistoryRule::Check::kBitsUnchanged;
  ASSERT_TRUE(a->SetRules("lm", {rule}).ok());
  Record(*a, "plain", 3, false);
  const std::int64_t alerted = Record(*a, kMarkupCase, 5, true);

  Answer none = Get(s->http, "/history");
  EXPECT_EQ(none.status, 401);
  EXPECT_THAT(none.head, HasSubstr("WWW-Authenticate: Bearer"));
  EXPECT_THAT(none.body, HasSubstr("requires a bearer token"));
  EXPECT_EQ(Get(s->http, "/history", "tok-nope").status, 401);

  Answer projects = Get(s->http, "/history", "tok-a");
  ASSERT_EQ(projects.status, 200) << projects.body;
  EXPECT_THAT(projects.head, HasSubstr("Content-Type: text/html; charset=utf-8"));
  EXPECT_THAT(projects.body, HasSubstr("/history/project?project=lm"));
  EXPECT_THAT(projects.body, HasSubstr(">8<"));  // runs
  Answer other = Get(s->http, "/history", "tok-b");
  ASSERT_EQ(other.status, 200);
  EXPECT_THAT(other.body, HasSubstr("No recorded runs yet"));
  EXPECT_EQ(Get(s->http, "/history/project?project=lm", "tok-b").status, 404);

  Answer project = Get(s->http, "/history/project?project=lm", "tok-a");
  ASSERT_EQ(project.status, 200) << project.body;
  EXPECT_THAT(project.body, HasSubstr("&lt;b&gt;bold&lt;/b&gt;&amp;&apos;&quot;"));
  EXPECT_THAT(project.body, Not(HasSubstr(kMarkupCase)));
  EXPECT_THAT(project.body, HasSubstr("<code>bits_unchanged</code>"));

  const std::string markup_case = "%3Cb%3Ebold%3C%2Fb%3E%26%27%22";
  Answer page = Get(s->http, "/history/case?project=lm&case=" + markup_case, "tok-a");
  ASSERT_EQ(page.status, 200) << page.body;
  EXPECT_EQ(Count(page.body, "<svg"), 4);
  EXPECT_THAT(page.body, Not(HasSubstr("<b>")));
  EXPECT_EQ(Count(page.body, "/history/run?run="), 5);
  EXPECT_EQ(Count(page.body, "<circle"), 4);  // the alerted run, on each plot
  Answer main_only =
      Get(s->http, "/history/case?project=lm&case=" + markup_case + "&branch=main", "tok-a");
  EXPECT_EQ(Count(main_only.body, "/history/run?run="), 2);

  Answer run = Get(s->http, absl::StrCat("/history/run?run=", alerted), "tok-a");
  ASSERT_EQ(run.status, 200) << run.body;
  EXPECT_THAT(run.body, HasSubstr("y&apos;s bits changed against run"));
  EXPECT_THAT(run.body, HasSubstr("<code>bits_unchanged</code>"));
  // Against the run it was compared with: y's bits differ in row 0 (its
  // element 2 of [4, 40]).
  EXPECT_THAT(run.body,
              HasSubstr(absl::StrCat("Against <a href=\"/history/run?run=", alerted - 1)));
  EXPECT_THAT(run.body, HasSubstr(">different<"));
  EXPECT_THAT(run.body, HasSubstr("<td class=\"n\">0</td>"));
  EXPECT_EQ(Get(s->http, absl::StrCat("/history/run?run=", alerted), "tok-b").status, 404);
  EXPECT_EQ(Get(s->http, "/history/run?run=abc", "tok-a").status, 400);
  EXPECT_EQ(Get(s->http, "/history/case?project=lm", "tok-a").status, 400);
  Answer missing = Get(s->http, "/history/elsewhere", "tok-a");
  EXPECT_EQ(missing.status, 404);
  EXPECT_THAT(missing.body, HasSubstr("/history/project"));
  EXPECT_EQ(Get(s->http, "/history", "tok-a", "POST").status, 405);
  EXPECT_EQ(Get(s->http, "/metricsx", "tok-a").status, 404);
}

TEST(HistoryPagesTest, AServerWithoutHistoryAnswers404) {
  std::unique_ptr<PagesServer> s = PagesServer::Start("none");
  ASSERT_NE(s, nullptr);
  Answer a = Get(s->http, "/history", "tok-a");
  EXPECT_EQ(a.status, 404);
  EXPECT_THAT(a.body, HasSubstr("keeps no history"));
}

TEST(HistoryPagesTest, DeleteProjectRemovesItsRunsBaselinesAndRulesForItsTenantOnly) {
  std::unique_ptr<PagesServer> s = PagesServer::Start("h.sqlite3");
  ASSERT_NE(s, nullptr);
  std::unique_ptr<client::Client> a = s->Connect("tok-a");
  std::unique_ptr<client::Client> b = s->Connect("tok-b");
  const std::int64_t last = Record(*a, "c", 3, false);
  Record(*b, "c", 2, false);
  ASSERT_TRUE(a->PromoteRun(last, "golden").ok());
  client::HistoryRule rule;
  rule.check = client::HistoryRule::Check::kMaxP99Ulp;
  rule.limit = 3;
  ASSERT_TRUE(a->SetRules("lm", {rule}).ok());

  const std::vector<std::string> at = {"--server=" + s->process->address(), "--token=tok-a"};
  std::vector<std::string> args = at;
  args.insert(args.end(), {"runs", "delete-project", "lm"});
  LogitctlRun r = RunLogitctl(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("project lm removed: 3 runs, its baselines and rules"));
  client::ListRunsArgs list;
  EXPECT_TRUE(a->ListRuns(list)->runs.empty());
  EXPECT_TRUE(a->ListRules("lm")->empty());
  EXPECT_EQ(b->ListRuns(list)->runs.size(), 2u);  // the other tenant's "lm" stays
  EXPECT_EQ(Get(s->http, "/history/project?project=lm", "tok-a").status, 404);
  r = RunLogitctl(args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no runs, baselines or rules of project 'lm'"));
  EXPECT_EQ(a->DeleteProject("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace logitd::testing
