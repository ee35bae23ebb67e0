#include "tessera/explain/live.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tessera/testing/fake_transport.h"

namespace tessera::explain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

kube::Response Http(int code, std::string body) {
  kube::Response r;
  r.status_code = code;
  r.body = std::move(body);
  return r;
}

std::string NodePage(const std::vector<std::string>& names, const std::string& next) {
  std::string items;
  for (const std::string& n : names) {
    items += (items.empty() ? "" : ",") + std::string(R"({"metadata":{"name":")") + n + "\"}}";
  }
  return R"({"kind":"NodeList","metadata":{"resourceVersion":"9","continue":")" + next +
         R"("},"items":[)" + items + "]}";
}

class LiveTest : public ::testing::Test {
 protected:
  std::vector<std::string> Paths() {
    std::vector<std::string> out;
    for (const kube::Request& r : fake_.requests()) {
      out.push_back(r.path);
    }
    return out;
  }

  kube::FakeTransport fake_;
  kube::ApiClient client_{&fake_,
                          kube::ApiClient::Options{kube::RetryPolicy{.max_attempts = 1}, nullptr}};
};

TEST_F(LiveTest, FollowsContinueTokensAndKeepsServerOrder) {
  fake_.SetHandler([](const kube::Request& r) -> absl::StatusOr<kube::Response> {
    if (r.path == "/api/v1/nodes?limit=2") {
      return Http(200, NodePage({"a", "b"}, "t1"));
    }
    if (r.path == "/api/v1/nodes?continue=t1&limit=2") {
      return Http(200, NodePage({"c"}, ""));
    }
    if (r.path == "/api/v1/pods?limit=2") {
      return Http(200, R"({"kind":"PodList","metadata":{},"items":[)"
                       R"({"metadata":{"name":"p","namespace":"ml"},"spec":{"nodeName":"a"}}]})");
    }
    if (r.path == "/api/v1/resourcequotas?limit=2") {
      return Http(200, R"({"kind":"ResourceQuotaList","metadata":{},"items":[)"
                       R"({"metadata":{"name":"gpu","namespace":"ml"},)"
                       R"("spec":{"hard":{"limits.nvidia.com/gpumem":"40000"}}}]})");
    }
    return Http(404, "");
  });
  absl::StatusOr<LiveCluster> live = ListCluster(client_, {.page_size = 2});
  ASSERT_TRUE(live.ok()) << live.status();
  std::vector<std::string> names;
  for (const kube::Node& n : live->nodes) {
    names.push_back(n.meta.name);
  }
  EXPECT_THAT(names, ElementsAre("a", "b", "c"));
  ASSERT_EQ(live->pods.size(), 1u);
  EXPECT_EQ(live->pods[0].meta.ns, "ml");
  EXPECT_EQ(live->pods[0].node_name, "a");
  ASSERT_EQ(live->quotas.size(), 1u);
  EXPECT_EQ(live->quotas[0].hard.Get("limits.nvidia.com/gpumem"), "40000");
  EXPECT_EQ(live->quota_error, "");
  EXPECT_THAT(Paths(), ElementsAre("/api/v1/nodes?limit=2", "/api/v1/nodes?continue=t1&limit=2",
                                   "/api/v1/pods?limit=2", "/api/v1/resourcequotas?limit=2"));
}

TEST_F(LiveTest, ResourceQuotasThatCannotBeListedAreAWarningNotAnError) {
  fake_.SetHandler([](const kube::Request& r) -> absl::StatusOr<kube::Response> {
    if (r.path.starts_with("/api/v1/resourcequotas")) {
      return Http(403, R"({"kind":"Status","reason":"Forbidden","code":403,)"
                       R"("message":"resourcequotas is forbidden"})");
    }
    if (r.path.starts_with("/api/v1/nodes")) {
      return Http(200, NodePage({"a"}, ""));
    }
    return Http(200, R"({"kind":"PodList","metadata":{},"items":[]})");
  });
  absl::StatusOr<LiveCluster> live = ListCluster(client_);
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_TRUE(live->quotas.empty());
  EXPECT_THAT(live->quota_error, HasSubstr("listing resourcequotas: resourcequotas is forbidden"));
}

TEST_F(LiveTest, StartsOverWhenTheContinueTokenExpires) {
  int calls = 0;
  fake_.SetHandler([&calls](const kube::Request& r) -> absl::StatusOr<kube::Response> {
    ++calls;
    if (r.path == "/api/v1/nodes?limit=1") {
      return Http(200, NodePage({calls == 1 ? "old" : "a"}, "t"));
    }
    if (calls == 2) {  // the first continue expires
      return Http(410, R"({"kind":"Status","status":"Failure","reason":"Expired",)"
                       R"("message":"too old","code":410})");
    }
    return Http(200, NodePage({"b"}, ""));
  });
  absl::StatusOr<std::vector<kube::Node>> nodes = ListAllNodes(client_, {.page_size = 1});
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);  // nothing of the abandoned snapshot is kept
  EXPECT_EQ((*nodes)[0].meta.name, "a");
  EXPECT_EQ((*nodes)[1].meta.name, "b");
}

TEST_F(LiveTest, GivesUpAfterMaxRestarts) {
  fake_.SetHandler([](const kube::Request& r) -> absl::StatusOr<kube::Response> {
    if (r.path == "/api/v1/nodes?limit=1") {
      return Http(200, NodePage({"a"}, "t"));
    }
    return Http(410, R"({"kind":"Status","reason":"Expired","message":"too old","code":410})");
  });
  absl::StatusOr<std::vector<kube::Node>> nodes =
      ListAllNodes(client_, {.page_size = 1, .max_restarts = 1});
  EXPECT_EQ(nodes.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fake_.requests().size(), 4u);  // two attempts of two pages
}

TEST_F(LiveTest, ErrorsKeepTheirCodeAndNameTheKind) {
  fake_.SetHandler([](const kube::Request& r) -> absl::StatusOr<kube::Response> {
    if (r.path.rfind("/api/v1/nodes", 0) == 0) {
      return Http(200, NodePage({"a"}, ""));
    }
    return Http(403, R"({"kind":"Status","reason":"Forbidden","code":403,)"
                     R"("message":"pods is forbidden: User \"u\" cannot list pods"})");
  });
  absl::StatusOr<LiveCluster> live = ListCluster(client_);
  EXPECT_EQ(live.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(live.status().message(), HasSubstr("listing pods: pods is forbidden"));
  // A first page that fails is not restarted, even with 410.
  fake_.SetHandler([](const kube::Request&) -> absl::StatusOr<kube::Response> {
    return Http(410, R"({"kind":"Status","reason":"Expired","message":"gone","code":410})");
  });
  const size_t before = fake_.requests().size();
  EXPECT_EQ(ListAllNodes(client_).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(fake_.requests().size(), before + 1);
}

}  // namespace
}  // namespace tessera::explain
