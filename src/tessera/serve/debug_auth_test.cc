#include "tessera/serve/debug_auth.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <nlohmann/json.hpp>

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/testing/fake_transport.h"

namespace tessera::serve {
namespace {

using ::testing::HasSubstr;

// Knows the tokens "alice" (allowed) and "bob" (denied); "down" cannot be asked.
class FakeReviewer : public DebugReviewer {
 public:
  absl::StatusOr<DebugUser> Authenticate(std::string_view token) override {
    MutexLock l(&mu_);
    ++authentications_;
    if (token == "down") {
      return absl::UnavailableError("connection refused");
    }
    if (token != "alice" && token != "bob") {
      return absl::UnauthenticatedError("token not known");
    }
    DebugUser user;
    user.name = std::string(token);
    user.groups = {"system:authenticated"};
    return user;
  }
  absl::StatusOr<bool> Authorize(const DebugUser& user, std::string_view path,
                                 std::string_view verb, std::string* reason) override {
    MutexLock l(&mu_);
    asked_.push_back(user.name + " " + std::string(verb) + " " + std::string(path));
    *reason = user.name == "alice" ? "" : "no RBAC rule";
    return user.name == "alice";
  }
  int authentications() {
    MutexLock l(&mu_);
    return authentications_;
  }
  std::vector<std::string> asked() {
    MutexLock l(&mu_);
    return asked_;
  }

 private:
  Mutex mu_;
  int authentications_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> asked_ ABSL_GUARDED_BY(mu_);
};

extender::DebugCaller Remote(std::string_view token, std::string_view path = "/debug/ledger") {
  extender::DebugCaller c;
  c.remote_ip = "10.0.0.7";
  c.loopback = false;
  c.token = token;
  c.path = path;
  c.verb = "get";
  return c;
}

TEST(DebugAuthMode, Parses) {
  EXPECT_EQ(*ParseDebugAuthMode("loopback"), DebugAuthMode::kLoopback);
  EXPECT_EQ(*ParseDebugAuthMode("kubernetes"), DebugAuthMode::kKubernetes);
  absl::StatusOr<DebugAuthMode> bad = ParseDebugAuthMode("none");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("want loopback"));
}

// The default mode: a remote caller never reads /debug, token or not, and nobody is asked.
TEST(DebugGate, LoopbackModeRefusesEveryRemoteCaller) {
  FakeReviewer reviewer;
  FakeClock clock;
  DebugGate gate(DebugAuthMode::kLoopback, &reviewer, &clock);
  for (std::string_view token : {"", "alice"}) {
    extender::DebugAccess a = gate.Check(Remote(token));
    EXPECT_EQ(a.status, 403) << token;
    EXPECT_THAT(a.message, HasSubstr("loopback callers only"));
  }
  extender::DebugCaller local = Remote("");
  local.remote_ip = "127.0.0.1";
  local.loopback = true;
  EXPECT_EQ(gate.Check(local).status, 0);
  EXPECT_EQ(reviewer.authentications(), 0);
}

TEST(DebugGate, KubernetesModeAsksTheApiServerAndCachesItsAnswers) {
  FakeReviewer reviewer;
  FakeClock clock;
  DebugGate gate(DebugAuthMode::kKubernetes, &reviewer, &clock);
  extender::DebugAccess a = gate.Check(Remote(""));
  EXPECT_EQ(a.status, 401);
  EXPECT_THAT(a.message, HasSubstr("needs a bearer token"));
  a = gate.Check(Remote("mallory"));
  EXPECT_EQ(a.status, 401);
  EXPECT_THAT(a.message, HasSubstr("token not known"));
  a = gate.Check(Remote("bob"));
  EXPECT_EQ(a.status, 403);
  EXPECT_EQ(a.message, "forbidden: user \"bob\" may not get /debug/ledger: no RBAC rule");
  EXPECT_EQ(gate.Check(Remote("alice")).status, 0);
  EXPECT_EQ(gate.Check(Remote("alice", "/debug/audit")).status, 0);
  EXPECT_THAT(reviewer.asked(),
              ::testing::ElementsAre("bob get /debug/ledger", "alice get /debug/ledger",
                                     "alice get /debug/audit"));
  EXPECT_EQ(reviewer.authentications(), 4);
  // Within 10 s every answer, allowed or not, is reused.
  clock.Advance(absl::Seconds(9));
  EXPECT_EQ(gate.Check(Remote("alice")).status, 0);
  EXPECT_EQ(gate.Check(Remote("bob")).status, 403);
  EXPECT_EQ(gate.Check(Remote("mallory")).status, 401);
  EXPECT_EQ(reviewer.authentications(), 4);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(gate.Check(Remote("alice")).status, 0);
  EXPECT_EQ(reviewer.authentications(), 5);
  // An API server that cannot be asked: 503, not cached.
  a = gate.Check(Remote("down"));
  EXPECT_EQ(a.status, 503);
  EXPECT_THAT(a.message, HasSubstr("connection refused"));
  EXPECT_EQ(gate.Check(Remote("down")).status, 503);
  EXPECT_EQ(reviewer.authentications(), 7);
  // What cannot be a bearer token is refused without asking.
  EXPECT_EQ(gate.Check(Remote("a b")).status, 401);
  EXPECT_EQ(gate.Check(Remote(std::string(DebugGate::kMaxTokenBytes + 1, 'x'))).status, 401);
  EXPECT_EQ(gate.Check(Remote("caf\xc3\xa9")).status, 401);
  EXPECT_EQ(reviewer.authentications(), 7);
  // Loopback peers (port-forward) need no token in this mode either.
  extender::DebugCaller local = Remote("");
  local.loopback = true;
  EXPECT_EQ(gate.Check(local).status, 0);
}

// The kube reviewer's requests and its reading of the API server's answers, over a fake
// transport answering as kube-apiserver does.
TEST(KubeDebugReviewer, PostsTokenAndAccessReviews) {
  kube::FakeTransport transport;
  transport.SetHandler([](const kube::Request& r) -> absl::StatusOr<kube::Response> {
    kube::Response res;
    res.status_code = 201;
    const nlohmann::json in = nlohmann::json::parse(r.body);
    if (r.path == "/apis/authentication.k8s.io/v1/tokenreviews") {
      const bool ok = in["spec"]["token"] == "t0k3n";
      res.body = ok ? R"({"kind":"TokenReview","status":{"authenticated":true,"user":{
                           "username":"alice","uid":"u-1","groups":["ops","system:authenticated"],
                           "extra":{"scopes":["a","b"]}}}})"
                    : R"({"kind":"TokenReview","status":{"error":"token expired"}})";
    } else if (r.path == "/apis/authorization.k8s.io/v1/subjectaccessreviews") {
      const bool ok = in["spec"]["nonResourceAttributes"]["path"] == "/debug/ledger";
      res.body =
          ok ? R"({"status":{"allowed":true,"reason":"RBAC: allowed by ClusterRoleBinding"}})"
             : R"({"status":{"allowed":false}})";
    } else {
      res.status_code = 404;
    }
    return res;
  });
  std::unique_ptr<DebugReviewer> reviewer = NewKubeDebugReviewer(&transport);
  absl::StatusOr<DebugUser> user = reviewer->Authenticate("t0k3n");
  ASSERT_TRUE(user.ok()) << user.status();
  EXPECT_EQ(user->name, "alice");
  EXPECT_EQ(user->uid, "u-1");
  EXPECT_THAT(user->groups, ::testing::ElementsAre("ops", "system:authenticated"));
  EXPECT_THAT(user->extra["scopes"], ::testing::ElementsAre("a", "b"));
  absl::StatusOr<DebugUser> expired = reviewer->Authenticate("old");
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(std::string(expired.status().message()), "token expired");
  std::string reason;
  EXPECT_TRUE(*reviewer->Authorize(*user, "/debug/ledger", "get", &reason));
  EXPECT_EQ(reason, "RBAC: allowed by ClusterRoleBinding");
  EXPECT_FALSE(*reviewer->Authorize(*user, "/debug/audit", "get", &reason));

  const std::vector<kube::Request> sent = transport.requests();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(sent[0].method, "POST");
  EXPECT_EQ(sent[0].content_type, "application/json");
  EXPECT_EQ(nlohmann::json::parse(sent[0].body),
            nlohmann::json::parse(R"({"apiVersion":"authentication.k8s.io/v1",
                                      "kind":"TokenReview","spec":{"token":"t0k3n"}})"));
  EXPECT_EQ(nlohmann::json::parse(sent[2].body),
            nlohmann::json::parse(R"({"apiVersion":"authorization.k8s.io/v1",
              "kind":"SubjectAccessReview","spec":{"user":"alice","uid":"u-1",
              "groups":["ops","system:authenticated"],"extra":{"scopes":["a","b"]},
              "nonResourceAttributes":{"path":"/debug/ledger","verb":"get"}}})"));

  // An API server that refuses the review itself (serve lacks the RBAC): an error, not a "no".
  transport.SetHandler([](const kube::Request&) -> absl::StatusOr<kube::Response> {
    kube::Response res;
    res.status_code = 403;
    res.body = R"({"kind":"Status","code":403,"message":"tokenreviews is forbidden"})";
    return res;
  });
  absl::StatusOr<DebugUser> refused = reviewer->Authenticate("t0k3n");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
}

// The decoders take whatever the API server (or anything in its place) answers, and only an
// explicit "authenticated": true / "allowed": true admits.
TEST(KubeDebugReviewer, DecodersAdmitOnlyExplicitYes) {
  for (const char* body :
       {"", "[]", "null", R"({"status":1})", R"({"status":{"authenticated":"true"}})",
        R"({"status":{"authenticated":true}})", R"({"status":{"authenticated":true,"user":7}})",
        R"({"status":{"authenticated":true,"user":{"username":5}}})"}) {
    EXPECT_FALSE(DecodeTokenReview(body).ok()) << body;
  }
  absl::StatusOr<DebugUser> odd = DecodeTokenReview(
      R"({"status":{"authenticated":true,"user":{"username":"u","groups":[1,"g"],"extra":[]}}})");
  ASSERT_TRUE(odd.ok());
  EXPECT_THAT(odd->groups, ::testing::ElementsAre("g"));
  std::string reason;
  for (const char* body :
       {R"({"status":{"allowed":"yes"}})", R"({"status":{"allowed":true,"denied":true}})",
        R"({"status":[]})", R"({})"}) {
    absl::StatusOr<bool> a = DecodeAccessReview(body, &reason);
    EXPECT_TRUE(a.ok() && !*a) << body;
  }
  EXPECT_FALSE(DecodeAccessReview("{", &reason).ok());
  // A token that is not UTF-8 still makes a request body (the gate refuses it before, anyway).
  EXPECT_THAT(TokenReviewBody("\xff"), HasSubstr("TokenReview"));
}

}  // namespace
}  // namespace tessera::serve
