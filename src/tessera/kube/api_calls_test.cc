#include "tessera/kube/api_calls.h"

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include <yaml-cpp/yaml.h>

namespace tessera::kube {
namespace {

// (kind, group, resource, verb) granted by the documents' rules.
using Grant = std::tuple<std::string, std::string, std::string, std::string>;

std::set<Grant> Grants(const std::vector<YAML::Node>& docs) {
  std::set<Grant> out;
  for (const YAML::Node& doc : docs) {
    const std::string kind = doc["kind"].as<std::string>();
    if (kind != "ClusterRole" && kind != "Role") {
      continue;
    }
    for (const YAML::Node& rule : doc["rules"]) {
      for (const YAML::Node& g : rule["apiGroups"]) {
        for (const YAML::Node& r : rule["resources"]) {
          for (const YAML::Node& v : rule["verbs"]) {
            out.insert({kind, g.as<std::string>(), r.as<std::string>(), v.as<std::string>()});
          }
        }
      }
    }
  }
  return out;
}

TEST(ApiCallsTest, RbacGrantsEveryCallAndNothingMore) {
  std::vector<YAML::Node> docs = YAML::LoadAll(RbacYaml(RbacNames{}));
  std::set<Grant> want;
  for (const ApiCall& call : ApiCalls()) {
    want.insert({call.scope == ApiScope::kCluster ? "ClusterRole" : "Role", std::string(call.group),
                 RbacResource(call), std::string(call.verb)});
  }
  EXPECT_EQ(Grants(docs), want);
}

TEST(ApiCallsTest, RowsAreUniqueAndUseRbacVerbs) {
  std::set<std::string> seen;
  const std::set<std::string> verbs = {"get", "list", "watch", "create", "update", "patch"};
  for (const ApiCall& call : ApiCalls()) {
    EXPECT_TRUE(verbs.contains(std::string(call.verb))) << call.verb;
    EXPECT_FALSE(call.why.empty());
    EXPECT_TRUE(seen.insert(std::string(call.verb) + " " + RbacResource(call)).second)
        << call.verb << " " << RbacResource(call);
  }
  // What the extender cannot work without.
  EXPECT_TRUE(seen.contains("create pods/binding"));
  EXPECT_TRUE(seen.contains("patch nodes"));
  EXPECT_TRUE(seen.contains("get leases"));
  // --debug-auth=kubernetes: the delegated authentication and authorization of /debug.
  EXPECT_TRUE(seen.contains("create tokenreviews"));
  EXPECT_TRUE(seen.contains("create subjectaccessreviews"));
  // Never more than it needs: no deletes, no secrets.
  for (const std::string& s : seen) {
    EXPECT_EQ(s.find("delete"), std::string::npos) << s;
    EXPECT_EQ(s.find("secrets"), std::string::npos) << s;
  }
}

TEST(ApiCallsTest, BindingsNameTheServiceAccountAndNamespace) {
  RbacNames names{.name = "gpu-sched", .ns = "infra", .service_account = "sa"};
  std::vector<YAML::Node> docs = YAML::LoadAll(RbacYaml(names));
  ASSERT_EQ(docs.size(), 4u);
  for (const YAML::Node& doc : docs) {
    const std::string kind = doc["kind"].as<std::string>();
    EXPECT_EQ(doc["metadata"]["name"].as<std::string>(), "gpu-sched") << kind;
    if (kind == "Role" || kind == "RoleBinding") {
      EXPECT_EQ(doc["metadata"]["namespace"].as<std::string>(), "infra");
    }
    if (kind.ends_with("Binding")) {
      EXPECT_EQ(doc["subjects"][0]["name"].as<std::string>(), "sa");
      EXPECT_EQ(doc["subjects"][0]["namespace"].as<std::string>(), "infra");
      EXPECT_EQ(doc["roleRef"]["kind"].as<std::string>(),
                kind == "RoleBinding" ? "Role" : "ClusterRole");
    }
  }
}

}  // namespace
}  // namespace tessera::kube
