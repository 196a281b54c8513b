// The tokens file parser and the loopback test used when a server runs
// without tokens.
#include "server/service/state/auth.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace logitd::service {
namespace {

using ::testing::HasSubstr;

TEST(TokenTableTest, ParsesTokensTenantsAndQuotas) {
  absl::StatusOr<TokenTable> t = ParseTokenTable(
      "# tokens of the shared server\n"
      "\n"
      "tok-a1 team-a\n"
      "  tok-a2\tteam-a   \n"
      "tok-b team-b 1000  # a comment is not allowed here, so this line is refused\n",
      "tokens", 77);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("tokens:5:"));

  t = ParseTokenTable(
      "# tokens of the shared server\n"
      "\n"
      "tok-a1 team-a\n"
      "  tok-a2\tteam-a   \n"
      "tok-b team-b 1000\n"
      "tok-c team-c 0\n",
      "tokens", 77);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tenants_by_token.size(), 4u);
  EXPECT_EQ(t->tenant_count, 3u);
  EXPECT_EQ(t->tenants_by_token.at("tok-a1").id, "team-a");
  EXPECT_EQ(t->tenants_by_token.at("tok-a2").id, "team-a");
  EXPECT_EQ(t->tenants_by_token.at("tok-a1").quota_bytes, 77u);
  EXPECT_EQ(t->tenants_by_token.at("tok-b").quota_bytes, 1000u);
  EXPECT_EQ(t->tenants_by_token.at("tok-c").quota_bytes, 0u);
}

TEST(TokenTableTest, AQuotaOnOneLineAppliesToAllTheTenantsTokens) {
  absl::StatusOr<TokenTable> t = ParseTokenTable("t1 a\nt2 a 500\n", "f", 0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tenants_by_token.at("t1").quota_bytes, 500u);
}

TEST(TokenTableTest, RefusesMalformedFiles) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {
           Case{"lonely\n", "f:1: expected 'TOKEN TENANT [QUOTA_BYTES]', got 1 field"},
           Case{"a b c d\n", "got 4 fields"},
           Case{"tok team 12x\n", "quota as a non-negative integer"},
           Case{"tok team -1\n", "quota as a non-negative integer"},
           Case{"tok te/am\n", "tenant name"},
           Case{"tok a\ntok b\n", "f:2: this token is listed twice"},
           Case{"t1 a 1\nt2 a 2\n", "f:2: tenant 'a' has quota 2 here but 1 on line 1"},
           Case{"# only comments\n\n", "no tokens"},
           Case{"", "no tokens"},
       }) {
    absl::StatusOr<TokenTable> t = ParseTokenTable(c.text, "f", 0);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(t.status().message(), HasSubstr(c.says)) << c.text;
  }
}

TEST(LoopbackPeerTest, KnowsLoopbackFromRemote) {
  EXPECT_TRUE(IsLoopbackPeer("ipv4:127.0.0.1:35882"));
  EXPECT_TRUE(IsLoopbackPeer("ipv4:127.3.2.1:1"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:[::1]:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:%5B::1%5D:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:[::ffff:127.0.0.1]:5000"));
  EXPECT_TRUE(IsLoopbackPeer("unix:/run/logitd.sock"));
  EXPECT_TRUE(IsLoopbackPeer("unix:"));
  EXPECT_TRUE(IsLoopbackPeer("inproc"));
  EXPECT_FALSE(IsLoopbackPeer("ipv4:10.0.0.7:4000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv4:128.0.0.1:4000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv6:[::2]:4000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv6:[::ffff:10.0.0.1]:4000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv6:[fe80::1]:4000"));
  EXPECT_FALSE(IsLoopbackPeer(""));
  EXPECT_FALSE(IsLoopbackPeer("127.0.0.1:5"));
}

}  // namespace
}  // namespace logitd::service
