#include "tessera/extender/http_server.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"

#include "tessera/apisim/tls.h"
#include "tessera/base/clock.h"
#include "tessera/base/logging.h"
#include "tessera/base/mutex.h"
#include "tessera/http/server.h"
#include "tessera/testing/wait.h"

namespace tessera::extender {
namespace {

using ::tessera::testing::Eventually;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kPod[] = R"({"metadata":{"name":"p","namespace":"ns","uid":"u"},"spec":{}})";

// Passes the first candidate, fails the others; binds unless the node is "bad".
class FakeBackend : public Backend {
 public:
  FilterResult Filter(const FilterArgs& args) override {
    const int running = ++filtering_;
    for (int seen = max_filtering_.load(); running > seen;) {
      max_filtering_.compare_exchange_weak(seen, running);
    }
    if (args.CandidateNames().size() > 1000) {
      // A real wait, kept: HttpServerMemory checks that no third large filter runs while two
      // do, which only holding each open for a while can show (nothing signals a request that
      // waits at the limit).
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    --filtering_;
    {
      MutexLock l(&mu_);
      ++filters_;
      last_pod_ = args.pod.Key();
    }
    FilterResult result;
    std::vector<std::string> names = args.CandidateNames();
    result.node_names = std::vector<std::string>();
    for (size_t i = 0; i < names.size(); ++i) {
      if (i == 0) {
        result.node_names->push_back(names[i]);
      } else {
        result.failed_nodes[names[i]] = "node not fit pod";
      }
    }
    return result;
  }
  BindResult Bind(const BindArgs& args) override {
    if (hold_binds_ != nullptr) {
      ++held_binds_;
      hold_binds_->WaitForNotificationWithTimeout(absl::Seconds(30));
    }
    MutexLock l(&mu_);
    last_bind_ = args.pod_namespace + "/" + args.pod_name + "@" + args.node + "#" + args.pod_uid;
    return BindResult{args.node == "bad" ? "node bad is gone" : ""};
  }
  RefitResponse Refit(const RefitRequest& request) override {
    MutexLock l(&mu_);
    last_refit_ = request;
    RefitResponse r;
    r.succeeded = request.pod_name == "p";
    r.container_devices = r.succeeded ? "GPU-b,NVIDIA,3000,30:" : "";
    r.failure_reason = r.succeeded ? "" : "pod " + request.pod_uid + " is not tracked";
    return r;
  }
  // Echoes the offer with "u-extra" added on n1; the pod's name picks a failure: "busy"
  // Unavailable, "bad" InvalidArgument, "odd" Internal, "unserved" the default (Unimplemented).
  absl::StatusOr<PreemptResult> Preempt(const PreemptArgs& args) override {
    const std::string& name = args.pod.meta.name;
    if (name == "busy") {
      return absl::UnavailableError("tessera is not ready: pods not synced");
    }
    if (name == "bad") {
      return absl::InvalidArgumentError("pod ns/bad: nvidia.com/gpu: not a number");
    }
    if (name == "odd") {
      return absl::InternalError("no");
    }
    if (name == "unserved") {
      return Backend::Preempt(args);
    }
    PreemptResult result;
    result.victims = args.victims;
    if (auto it = result.victims.find("n1"); it != result.victims.end()) {
      it->second.pod_uids.push_back("u-extra");
    }
    return result;
  }
  RefitRequest last_refit() {
    MutexLock l(&mu_);
    return last_refit_;
  }
  bool Ready(std::string* why) override {
    if (!ready_.load()) {
      *why = "waiting for the pod informer to sync";
    } else if (describe_.load()) {
      *why = "ok\nrole: leader\n";
    }
    return ready_.load();
  }
  std::string DebugLedgerJson() override { return R"({"devices":[]})"; }

  void SetReady(bool ready) { ready_.store(ready); }
  // Binds wait for `hold` (at most 30 s), as they would for a slow API server; set before
  // the server starts.
  void HoldBinds(absl::Notification* hold) { hold_binds_ = hold; }
  int held_binds() const { return held_binds_.load(); }
  // The most Filter calls that ran at once.
  int max_filtering() const { return max_filtering_.load(); }
  void SetDescribe(bool describe) { describe_.store(describe); }
  int filters() {
    MutexLock l(&mu_);
    return filters_;
  }
  std::string last_pod() {
    MutexLock l(&mu_);
    return last_pod_;
  }
  std::string last_bind() {
    MutexLock l(&mu_);
    return last_bind_;
  }

 private:
  std::atomic<bool> ready_{false};
  std::atomic<bool> describe_{false};
  absl::Notification* hold_binds_ = nullptr;
  std::atomic<int> held_binds_{0};
  std::atomic<int> filtering_{0};
  std::atomic<int> max_filtering_{0};
  Mutex mu_;
  int filters_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_pod_ ABSL_GUARDED_BY(mu_);
  std::string last_bind_ ABSL_GUARDED_BY(mu_);
  RefitRequest last_refit_ ABSL_GUARDED_BY(mu_);
};

HttpServerOptions LocalOptions() {
  HttpServerOptions options;
  options.bind_address = "127.0.0.1:0";
  options.metrics_bind_address = "";
  options.keep_alive_timeout = absl::Seconds(1);
  options.read_timeout = absl::Seconds(10);
  return options;
}

// The number of complete responses (headers and Content-Length bytes of body) at the start of
// `data`.
int CompleteResponses(const std::string& data) {
  int complete = 0;
  size_t at = 0;
  while (true) {
    const size_t end = data.find("\r\n\r\n", at);
    if (end == std::string::npos) {
      return complete;
    }
    const std::string headers = data.substr(at, end - at);
    size_t length = 0;
    const size_t cl = headers.find("Content-Length: ");
    if (cl != std::string::npos) {
      length = std::stoul(headers.substr(cl + 16));
    }
    if (data.size() < end + 4 + length) {
      return complete;
    }
    ++complete;
    at = end + 4 + length;
  }
}

// A connection to 127.0.0.1:`port` (-1 on failure).
int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` on a fresh connection and returns everything read until the server closes
// the connection, `want_responses` complete responses have arrived, or `timeout_s` seconds pass
// without a byte. The writer runs on its own thread, so a server that stops reading cannot
// block it.
std::string RawExchange(int port, const std::string& request, int want_responses = 1,
                        int timeout_s = 10) {
  const int fd = ConnectTo(port);
  if (fd < 0) {
    return "connect failed";
  }
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::thread writer([fd, &request] {
    size_t off = 0;
    while (off < request.size()) {
      const ssize_t n = send(fd, request.data() + off, request.size() - off, MSG_NOSIGNAL);
      if (n <= 0) {
        return;
      }
      off += static_cast<size_t>(n);
    }
  });
  std::string got;
  char buf[65536];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      break;
    }
    got.append(buf, static_cast<size_t>(n));
    if (CompleteResponses(got) >= want_responses) {
      break;
    }
  }
  shutdown(fd, SHUT_RDWR);
  writer.join();
  close(fd);
  return got;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = LocalOptions()) {
    server_ = std::make_unique<HttpServer>(&backend_, std::move(options));
    absl::Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_GT(server_->port(), 0);
  }
  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_connection_timeout(5);
    c.set_read_timeout(10);
    return c;
  }

  FakeBackend backend_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, FilterAndBindRoundTrip) {
  StartServer();
  httplib::Client c = Client();
  const std::string pascal =
      std::string(R"({"Pod":)") + kPod + R"(,"Nodes":null,"NodeNames":["node-a","node-b"]})";
  const std::string lower =
      std::string(R"({"pod":)") + kPod + R"(,"nodes":null,"nodenames":["node-a","node-b"]})";
  for (const std::string& body : {pascal, lower}) {
    httplib::Result r = c.Post("/filter", body, "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    EXPECT_EQ(r->body,
              R"({"Nodes":null,"NodeNames":["node-a"],"FailedNodes":{"node-b":"node not fit pod"},)"
              R"("FailedAndUnresolvableNodes":{},"Error":""})");
  }
  EXPECT_EQ(backend_.filters(), 2);
  EXPECT_EQ(backend_.last_pod(), "ns/p");

  httplib::Result r =
      c.Post("/bind", R"({"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"node-a"})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, R"({"Error":""})");
  EXPECT_EQ(backend_.last_bind(), "ns/p@node-a#u");

  r = c.Post("/bind", R"({"podName":"q","podNamespace":"ns","podUID":"v","node":"bad"})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);  // HAMi answers a failed bind with 200 and the error
  EXPECT_EQ(r->body, R"({"Error":"node bad is gone"})");
  EXPECT_EQ(backend_.last_bind(), "ns/q@bad#v");
}

// POST /refit (HAMi refs/pull/2731 pkg/scheduler/routes/route.go:NumaRefit and its
// numa_refit_route_test.go): always 200 with the in-band outcome, a body that does not decode
// included; the same body limit as every route.
TEST_F(HttpServerTest, RefitRouteAnswersInBand) {
  StartServer();
  httplib::Client c = Client();
  httplib::Result r = c.Post(
      "/refit",
      R"({"podUID":"u1","podNamespace":"ml","podName":"p","nodeName":"n1","containerIndex":1,)"
      R"("containerName":"main","deviceType":"NVIDIA","allowedDeviceUUIDs":["GPU-b","GPU-c"]})",
      "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, R"({"succeeded":true,"containerDevices":"GPU-b,NVIDIA,3000,30:"})");
  const RefitRequest seen = backend_.last_refit();
  EXPECT_EQ(seen.pod_uid, "u1");
  EXPECT_EQ(seen.container_index, 1);
  EXPECT_EQ(seen.allowed_device_uuids, (std::vector<std::string>{"GPU-b", "GPU-c"}));

  r = c.Post("/refit", R"({"podUID":"u2","podName":"q"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, R"({"succeeded":false,"failureReason":"pod u2 is not tracked"})");

  // TestNumaRefitRoute_DecodeError: in band, and the backend is not called.
  for (const std::string body : {"{not-json", "", R"({"podUID":7})"}) {
    SCOPED_TRACE(body);
    r = c.Post("/refit", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_THAT(r->body, StartsWith(R"({"succeeded":false,"failureReason":"refit request: )"));
    EXPECT_EQ(backend_.last_refit().pod_uid, "u2");
  }
  r = c.Get("/refit");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  const std::string got = RawExchange(
      server_->port(), "POST /refit HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n{");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 413"));
}

TEST_F(HttpServerTest, PreemptRoute) {
  StartServer();
  httplib::Client c = Client();
  // The meta form, with a node kube-scheduler found no victim on (Kubernetes 1.38).
  httplib::Result r =
      c.Post("/preempt",
             std::string(R"({"Pod":)") + kPod +
                 R"(,"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"u-a"}],"NumPDBViolations":1},)"
                 R"("n2":{"Pods":null,"NumPDBViolations":0}}})",
             "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, R"({"NodeNameToMetaVictims":{"n1":{"Pods":[{"UID":"u-a"},{"UID":"u-extra"}],)"
                     R"("NumPDBViolations":1},"n2":{"Pods":[],"NumPDBViolations":0}}})");

  const auto pod_named = [](const std::string& name) {
    return R"({"Pod":{"metadata":{"name":")" + name +
           R"(","namespace":"ns","uid":"u"}},"NodeNameToMetaVictims":{"n1":null}})";
  };
  struct Case {
    std::string body;
    int status;
    std::string text;
  };
  for (const Case& k : std::vector<Case>{
           {pod_named("busy"), 503, "tessera is not ready: pods not synced"},
           {pod_named("bad"), 400, "pod ns/bad: nvidia.com/gpu: not a number"},
           {pod_named("odd"), 500, "no"},
           {pod_named("unserved"), 404, "the preempt verb is not served by this extender"},
           {"", 400, "Please send a request body"},
           {R"({"NodeNameToMetaVictims":{}})", 400, kMissingPodMessage},
       }) {
    SCOPED_TRACE(k.body);
    r = c.Post("/preempt", k.body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, k.status);
    EXPECT_THAT(r->body, HasSubstr(k.text));
  }
  r = c.Post("/preempt", "{not json", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  r = c.Get("/preempt");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
}

// Go's client always sends Accept-Encoding: gzip; the replies stay uncompressed, as HAMi's are.
TEST_F(HttpServerTest, RepliesAreNotCompressed) {
  StartServer();
  const std::string body =
      std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["node-a","node-b"]})";
  const std::string got =
      RawExchange(server_->port(),
                  "POST /filter HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
                  "Content-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(got.find("Content-Encoding"), std::string::npos) << got;
  EXPECT_THAT(got, HasSubstr(R"({"Nodes":null,"NodeNames":["node-a"],)"));
}

TEST_F(HttpServerTest, BadRequests) {
  StartServer();
  httplib::Client c = Client();
  for (const char* path : {"/filter", "/bind"}) {
    httplib::Result r = c.Post(path, "", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path;
    EXPECT_EQ(r->body, "Please send a request body") << path;

    r = c.Post(path, R"({"Pod":)", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path;
    EXPECT_THAT(r->body, HasSubstr("extender")) << path;

    r = c.Post(path, "[1,2]", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << path;
    EXPECT_THAT(r->body, HasSubstr("expected a JSON object")) << path;
  }
  // A bind without a pod or node name never reaches the backend (it would have become a LIST of
  // every pod in the namespace).
  for (const char* body : {R"({"PodName":"","PodNamespace":"ns","PodUID":"u","Node":"n"})",
                           R"({"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":""})",
                           R"({"PodName":"p","PodNamespace":"","PodUID":"u","Node":"n"})"}) {
    httplib::Result r = c.Post("/bind", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body;
    EXPECT_THAT(r->body, HasSubstr("is required")) << body;
  }
  EXPECT_EQ(backend_.last_bind(), "");
  // A filter request without a pod: HAMi's 200 with the error in the reply.
  httplib::Result r = c.Post("/filter", R"({"NodeNames":["a"]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr(R"("Error":"extender args missing pod")"));
  EXPECT_EQ(backend_.filters(), 0);

  // Wrong methods and unknown paths.
  r = c.Get("/filter");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  r = c.Delete("/bind");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = c.Post("/healthz", "x", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD");
  r = c.Get("/nope");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = c.Post("/prioritize", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = c.Get("/metrics");  // only on the metrics listener
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);

  // The connection survived all of that (keep-alive), and still serves.
  r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, HealthReadyAndLedger) {
  StartServer();
  httplib::Client c = Client();
  httplib::Result r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok");

  r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->body, "waiting for the pod informer to sync");
  backend_.SetReady(true);
  r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok");
  // What Ready writes when ready (the service: the replica's role) is the body.
  backend_.SetDescribe(true);
  r = c.Get("/readyz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok\nrole: leader\n");
}

// /debug/* is for operators: the metrics listener serves it, the extender port (reachable by
// kube-scheduler and the API server) does not.
// /debug/why is open to anyone who reaches the metrics port: every field is checked before the
// Backend sees it, and an error names the field.
TEST(WhyQuery, OnlyValidNamesAndBoundsReachTheBackend) {
  absl::StatusOr<WhyRequest> ok =
      ParseWhyQuery("namespace=ml&name=train-7&if-deleted=other&node=gpu-3&gpumem=8000");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->ns, "ml");
  EXPECT_EQ(ok->name, "train-7");
  EXPECT_EQ(ok->if_deleted_ns, "ml");  // NAME: the pod's namespace
  EXPECT_EQ(ok->if_deleted_name, "other");
  EXPECT_EQ(ok->node, "gpu-3");
  EXPECT_EQ(ok->gpumem, 8000);
  ok = ParseWhyQuery("namespace=ml&name=a&if-deleted=team%2Fb");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->if_deleted_ns, "team");
  EXPECT_EQ(ok->if_deleted_name, "b");
  for (const auto& [query, field] : std::vector<std::pair<std::string, std::string>>{
           {"", "namespace"},
           {"namespace=ml", "name"},
           {"namespace=ML&name=a", "namespace"},
           {"namespace=ml&name=a%2Fb", "name"},
           {"namespace=ml&name=a&gpumem=-1", "gpumem"},
           {"namespace=ml&name=a&gpumem=1048577", "gpumem"},
           {"namespace=ml&name=a&node=a..b", "node"},
           {"namespace=ml&name=a&if-deleted=", "if-deleted"},
           {"namespace=ml&name=a&limit=5", "limit"},
       }) {
    absl::StatusOr<WhyRequest> bad = ParseWhyQuery(query);
    EXPECT_FALSE(bad.ok()) << query;
    EXPECT_THAT(bad.status().message(), HasSubstr(field)) << query;
  }
}

TEST_F(HttpServerTest, DebugRoutesAreOnTheMetricsListenerOnly) {
  HttpServerOptions options = LocalOptions();
  options.metrics_bind_address = "127.0.0.1:0";
  StartServer(options);
  httplib::Client c = Client();
  for (const char* path : {"/debug/ledger", "/debug/audit"}) {
    httplib::Result r = c.Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << path;
  }
  httplib::Client m("127.0.0.1", server_->metrics_port());
  httplib::Result r = m.Get("/debug/ledger");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, R"({"devices":[]})");
  r = m.Get("/debug/audit");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(r->body, R"({"audit":null,"resync":null})"
                     "\n");
  r = m.Post("/debug/audit", "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  r = m.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// Who may read /debug: without debug_access only loopback peers (every test connection is
// one); with it, the hook decides from the caller's address and bearer token, and its refusal
// is the answer. /metrics and /healthz are never checked.
TEST(DebugAccess, LoopbackAddresses) {
  for (const char* ip : {"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(http::IsLoopbackIp(ip)) << ip;
  }
  for (const char* ip : {"", "10.0.0.7", "0.0.0.0", "::", "::ffff:10.0.0.7", "fe80::1", "128.0.0.1",
                         "localhost", "127.0.0.1 "}) {
    EXPECT_FALSE(http::IsLoopbackIp(ip)) << ip;
  }
}

// The default: a remote caller never reads /debug, whatever token it sends.
TEST(DebugAccess, ByDefaultOnlyLoopbackPeers) {
  DebugCaller remote{.remote_ip = "10.0.0.7",
                     .loopback = false,
                     .token = "any",
                     .path = "/debug/ledger",
                     .verb = "get"};
  const DebugAccess refused = LoopbackOnlyDebugAccess(remote);
  EXPECT_EQ(refused.status, 403);
  EXPECT_THAT(refused.message, HasSubstr("/debug/ledger is served to loopback callers only"));
  DebugCaller local = remote;
  local.remote_ip = "127.0.0.1";
  local.loopback = true;
  EXPECT_EQ(LoopbackOnlyDebugAccess(local).status, 0);
}

TEST_F(HttpServerTest, DebugAccessDecidesWhoReadsDebug) {
  HttpServerOptions options = LocalOptions();
  options.metrics_bind_address = "127.0.0.1:0";
  options.metrics = [] { return std::string("m 1\n"); };
  Mutex mu;
  std::vector<std::string> seen;
  // Admits the token "good", says 401 without a token and 403 for any other.
  options.debug_access = [&](const DebugCaller& caller) {
    {
      MutexLock l(&mu);
      seen.push_back(std::string(caller.remote_ip) + (caller.loopback ? " loopback " : " ") +
                     std::string(caller.verb) + " " + std::string(caller.path) + " [" +
                     std::string(caller.token) + "]");
    }
    if (caller.token.empty()) {
      return DebugAccess{401, "Unauthorized: a bearer token is required"};
    }
    return caller.token == "good" ? DebugAccess{} : DebugAccess{403, "forbidden: no"};
  };
  StartServer(options);
  httplib::Client m("127.0.0.1", server_->metrics_port());
  httplib::Result r = m.Get("/debug/ledger");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(r->body, "Unauthorized: a bearer token is required\n");
  r = m.Get("/debug/audit", {{"Authorization", "Bearer bad"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_EQ(r->body, "forbidden: no\n");
  r = m.Get("/debug/ledger", {{"Authorization", "bearer  good"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, R"({"devices":[]})");
  // Through the API server's service proxy, which strips Authorization.
  r = m.Get("/debug/why?namespace=a&name=b", {{"X-Tessera-Authorization", "Bearer good"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);  // the backend's answer: not served
  r = m.Get("/debug/why?namespace=a&name=b", {{"Authorization", "Basic Z29vZA=="}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  // /metrics and /healthz ask nobody.
  r = m.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = m.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  MutexLock l(&mu);
  EXPECT_THAT(seen, ::testing::ElementsAre("127.0.0.1 loopback get /debug/ledger []",
                                           "127.0.0.1 loopback get /debug/audit [bad]",
                                           "127.0.0.1 loopback get /debug/ledger [good]",
                                           "127.0.0.1 loopback get /debug/why [good]",
                                           "127.0.0.1 loopback get /debug/why []"));
}

// Two requests on one connection get two answers on it (httplib does not pipeline, and neither
// does Go's client: the second request goes out after the first answer).
TEST_F(HttpServerTest, KeepAlive) {
  StartServer();
  const std::string body = R"({"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"})";
  const std::string request =
      "POST /bind HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    std::string got;
    char buf[4096];
    while (got.empty() || got.back() != '}') {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      ASSERT_GT(n, 0) << "connection closed after " << i << " answers: " << got;
      got.append(buf, static_cast<size_t>(n));
    }
    EXPECT_THAT(got, StartsWith("HTTP/1.1 200"));
    EXPECT_THAT(got, HasSubstr("Keep-Alive:"));
  }
  close(fd);
}

TEST_F(HttpServerTest, BodyLimit) {
  StartServer();
  // Refused from the header alone: the body is never sent, and the answer comes at once.
  std::string got =
      RawExchange(server_->port(),
                  "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n{\"Pod\":");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(got, HasSubstr("Connection: close"));

  // Likewise when the client waits for 100-continue.
  got = RawExchange(server_->port(),
                    "POST /filter HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                    "Content-Length: 2000000\r\n\r\n");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(got, HasSubstr("Connection: close"));

  // A chunked body is cut off once it passes the limit.
  std::string chunked = "POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string piece(64 * 1024, ' ');
  for (int i = 0; i < 20; ++i) {  // 1.25 MiB
    chunked += "10000\r\n" + piece + "\r\n";
  }
  chunked += "0\r\n\r\n";
  got = RawExchange(server_->port(), chunked);
  EXPECT_THAT(got, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(got, HasSubstr("Connection: close"));

  // Exactly the limit is accepted.
  std::string body = std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["n"]})";
  body.resize(kMaxRequestBytes, ' ');
  httplib::Client c = Client();
  httplib::Result r = c.Post("/filter", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr(R"("NodeNames":["n"])"));
  // One byte more is not.
  body.push_back(' ');
  r = c.Post("/filter", body, "application/json");
  if (r) {  // the server may close before the client has written everything
    EXPECT_EQ(r->status, 413);
  }
}

TEST_F(HttpServerTest, ConcurrentClients) {
  StartServer();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      httplib::Client c("127.0.0.1", server_->port());
      for (int i = 0; i < 25; ++i) {
        const std::string body =
            std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["n)" + std::to_string(t) + R"("]})";
        httplib::Result r = c.Post("/filter", body, "application/json");
        if (r && r->status == 200 &&
            r->body.find("\"NodeNames\":[\"n" + std::to_string(t) + "\"]") != std::string::npos) {
          ok.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(ok.load(), 100);
  EXPECT_EQ(backend_.filters(), 100);
}

TEST_F(HttpServerTest, MetricsListener) {
  HttpServerOptions options = LocalOptions();
  options.metrics_bind_address = "127.0.0.1:0";
  std::atomic<int> scrapes{0};
  options.metrics = [&scrapes] {
    scrapes.fetch_add(1);
    return std::string("# TYPE up gauge\nup 1\n");
  };
  StartServer(options);
  ASSERT_GT(server_->metrics_port(), 0);
  EXPECT_NE(server_->metrics_port(), server_->port());
  httplib::Client m("127.0.0.1", server_->metrics_port());
  httplib::Result r = m.Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r->body, "# TYPE up gauge\nup 1\n");
  EXPECT_EQ(scrapes.load(), 1);
  r = m.Get("/filter");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  r = m.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD");
}

// Prometheus asks for gzip; a scrape of 1 KiB or more goes out compressed, a smaller one plain.
TEST_F(HttpServerTest, LargeScrapesAreGzippedForScrapersThatAcceptGzip) {
  HttpServerOptions options = LocalOptions();
  options.metrics_bind_address = "127.0.0.1:0";
  std::string large = "# TYPE up gauge\n";
  for (int i = 0; i < 200; ++i) {
    large += "up{instance=\"node-" + std::to_string(i) + "\"} 1\n";
  }
  std::atomic<bool> small{false};
  options.metrics = [&] { return small.load() ? std::string("up 1\n") : large; };
  StartServer(options);
  const httplib::Headers gzip = {{"Accept-Encoding", "gzip"}};
  httplib::Client raw("127.0.0.1", server_->metrics_port());
  raw.set_decompress(false);
  httplib::Result r = raw.Get("/metrics", gzip);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Encoding"), "gzip");
  EXPECT_LT(r->body.size(), large.size() / 2);
  httplib::Client inflating("127.0.0.1", server_->metrics_port());  // decompresses
  r = inflating.Get("/metrics", gzip);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, large);
  r = raw.Get("/metrics");  // no Accept-Encoding
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_header("Content-Encoding"));
  EXPECT_EQ(r->body, large);
  small.store(true);
  r = raw.Get("/metrics", gzip);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_header("Content-Encoding"));
  EXPECT_EQ(r->body, "up 1\n");
  server_->Stop();  // joins the threads that read `large` before it goes
}

TEST_F(HttpServerTest, AccessLogAtVerbosity2) {
  Mutex mu;
  std::vector<std::string> lines;
  LogSink previous = SetLogSink([&](LogSeverity, std::string_view line) {
    MutexLock l(&mu);
    lines.emplace_back(line);
  });
  const int verbosity = LogVerbosity();
  SetLogVerbosity(2);
  StartServer();
  {
    httplib::Client c = Client();
    httplib::Result r = c.Get("/nope");
    ASSERT_TRUE(r);
  }
  const bool found = Eventually([&] {
    MutexLock l(&mu);
    for (const std::string& line : lines) {
      if (line.find("http GET /nope 404 ") != std::string::npos) {
        return true;
      }
    }
    return false;
  });
  server_->Stop();
  SetLogVerbosity(verbosity);
  SetLogSink(previous);
  EXPECT_TRUE(found);
}

// Stop() does not wait for a client that keeps its connection open (the keep-alive timeout is
// a minute here), and the server is gone afterwards.
TEST_F(HttpServerTest, StopWithIdleKeepAliveConnection) {
  HttpServerOptions options = LocalOptions();
  options.keep_alive_timeout = absl::Seconds(60);
  StartServer(options);
  httplib::Client c = Client();
  httplib::Result r = c.Get("/healthz");
  ASSERT_TRUE(r);
  const absl::Time start = absl::Now();
  server_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  r = c.Get("/healthz");
  EXPECT_FALSE(r);
}

// Seconds a request on a fresh connection takes to be answered with `status`; 99 when it is
// not answered so within 10 s.
double SecondsToAnswer(int port, const std::string& request, int status) {
  const auto start = std::chrono::steady_clock::now();
  const std::string reply = RawExchange(port, request);
  if (!reply.starts_with("HTTP/1.1 " + std::to_string(status) + " ")) {
    return 99;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The issue's hostile clients at once: idle and trickling connections on both listeners and
// binds waiting for a slow API server; health, filter and metrics still answer at once.
TEST_F(HttpServerTest, HostileClientsDoNotDelayHealthFilterOrMetrics) {
  absl::Notification release;
  backend_.HoldBinds(&release);
  HttpServerOptions options = LocalOptions();
  options.metrics_bind_address = "127.0.0.1:0";
  options.keep_alive_timeout = absl::Seconds(60);
  options.metrics = [] { return std::string("up 1\n"); };
  StartServer(options);
  std::vector<int> fds;
  for (int i = 0; i < 1000; ++i) {
    const int fd = ConnectTo(i % 4 == 3 ? server_->metrics_port() : server_->port());
    ASSERT_GE(fd, 0) << i;
    fds.push_back(fd);
    if (i % 2 == 0) {
      send(fd, "GET /healthz HTTP/1.1\r\nX-", 26, MSG_NOSIGNAL);  // a head never finished
    }
  }
  const std::string bind_body = R"({"PodName":"p","PodNamespace":"ns","Node":"n"})";
  const std::string bind =
      "POST /bind HTTP/1.1\r\nContent-Length: " + std::to_string(bind_body.size()) + "\r\n\r\n" +
      bind_body;
  std::vector<std::thread> binds;
  for (int i = 0; i < 20; ++i) {
    binds.emplace_back([&] { RawExchange(server_->port(), bind); });
  }
  // Sixteen clients ask for a multi-MB reply (a /filter of 60,000 names fails 59,999 of them)
  // and never read it: each holds its thread in a write for up to the write timeout.
  std::string names;
  for (int i = 0; i < 60000; ++i) {
    names += (i == 0 ? "\"node-" : ",\"node-") + std::to_string(i) + "\"";
  }
  const std::string big_body =
      std::string(R"({"Pod":)") + kPod + R"(,"Nodes":null,"NodeNames":[)" + names + "]}";
  const std::string big_filter =
      "POST /filter HTTP/1.1\r\nContent-Length: " + std::to_string(big_body.size()) + "\r\n\r\n" +
      big_body;
  std::vector<std::thread> senders;
  for (int i = 0; i < 16; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    fds.push_back(fd);
    senders.emplace_back([fd, &big_filter] {
      send(fd, big_filter.data(), big_filter.size(), MSG_NOSIGNAL);  // and never read
    });
  }
  for (std::thread& t : senders) {
    t.join();
  }
  // Set-up, not a measurement: under ASan on a shared 2-core machine the 16 large filters took
  // 10–13 s (the limit was 10 s, and the test failed there for the tree before this change too).
  Eventually([&] { return backend_.filters() >= 16; }, absl::Seconds(60));
  EXPECT_EQ(backend_.filters(), 16);
  Eventually([&] { return backend_.held_binds() >= 20; }, absl::Seconds(30));
  EXPECT_EQ(backend_.held_binds(), 20);
  const std::string filter_body =
      std::string(R"({"Pod":)") + kPod + R"(,"Nodes":null,"NodeNames":["a"]})";
  // Generous limits for a loaded test machine; the 100 ms target is measured by test/hostile.
  EXPECT_LT(SecondsToAnswer(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n", 200), 2.0);
  EXPECT_LT(SecondsToAnswer(server_->port(),
                            "POST /filter HTTP/1.1\r\nContent-Length: " +
                                std::to_string(filter_body.size()) + "\r\n\r\n" + filter_body,
                            200),
            2.0);
  EXPECT_LT(SecondsToAnswer(server_->metrics_port(), "GET /metrics HTTP/1.1\r\n\r\n", 200), 2.0);
  release.Notify();
  for (std::thread& t : binds) {
    t.join();
  }
  for (int fd : fds) {
    close(fd);
  }
}

TEST(HttpServerTls, IdleTlsConnectionsDoNotDelayHealth) {
  absl::StatusOr<apisim::PemPair> pair = apisim::GenerateSelfSignedCert();
  ASSERT_TRUE(pair.ok());
  const std::string dir = ::testing::TempDir();
  const std::string cert = dir + "/idle_tls.crt";
  const std::string key = dir + "/idle_tls.key";
  std::ofstream(cert) << pair->cert_pem;
  std::ofstream(key) << pair->key_pem;
  FakeBackend backend;
  HttpServerOptions options = LocalOptions();
  options.cert_file = cert;
  options.key_file = key;
  options.keep_alive_timeout = absl::Seconds(60);
  HttpServer server(&backend, options);
  ASSERT_TRUE(server.Start().ok());
  // Connections that never start the handshake.
  std::vector<int> fds;
  for (int i = 0; i < 500; ++i) {
    const int fd = ConnectTo(server.port());
    ASSERT_GE(fd, 0) << i;
    fds.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  httplib::SSLClient c("127.0.0.1", server.port());
  c.enable_server_certificate_verification(false);
  c.set_connection_timeout(10);
  c.set_read_timeout(10);
  httplib::Result r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  for (int fd : fds) {
    close(fd);
  }
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizerAllocator = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr bool kSanitizerAllocator = true;
#else
constexpr bool kSanitizerAllocator = false;
#endif
#else
constexpr bool kSanitizerAllocator = false;
#endif

// The resident memory of this process, in MiB.
double ResidentMiB() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0;
  long resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// A 60,000-name /filter decodes into tens of MB that the allocator used to keep in the serving
// thread's arena (issue 21: twenty such requests held 618 MB). After large requests the server
// hands free memory back, so what a burst of them leaves behind is small.
TEST(HttpServerMemory, LargeFiltersLeaveLittleBehind) {
  FakeBackend backend;
  HttpServerOptions options = LocalOptions();
  HttpServer server(&backend, options);
  ASSERT_TRUE(server.Start().ok());
  std::string names;
  for (int i = 0; i < 60000; ++i) {
    names += (i == 0 ? "\"node-" : ",\"node-") + std::to_string(i) + "\"";
  }
  const std::string body =
      std::string(R"({"Pod":)") + kPod + R"(,"Nodes":null,"NodeNames":[)" + names + "]}";
  ASSERT_LT(body.size(), kMaxRequestBytes);
  const std::string request =
      "POST /filter HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\nConnection: close\r\n\r\n" + body;
  ASSERT_THAT(RawExchange(server.port(), request), StartsWith("HTTP/1.1 200 "));
  const double before = ResidentMiB();
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&] {
      for (int j = 0; j < 2; ++j) {
        // Two at a time: under a sanitizer the last of 32 waits well over 10 s for its turn.
        EXPECT_THAT(RawExchange(server.port(), request, 1, /*timeout_s=*/120),
                    StartsWith("HTTP/1.1 200 "));
      }
    });
  }
  for (std::thread& t : clients) {
    t.join();
  }
  const double after = ResidentMiB();
  EXPECT_EQ(backend.filters(), 33);
  // Large bodies are decoded and answered two at a time (the peak is bounded too).
  EXPECT_LE(backend.max_filtering(), 2);
  // 32 requests; each left tens of MB behind before the fix. A sanitizer's allocator keeps
  // freed memory in quarantine and ignores malloc_trim, so there only the bound above counts.
  if (!kSanitizerAllocator) {
    EXPECT_LT(after - before, 64.0) << "before " << before << " MiB, after " << after << " MiB";
  }
  std::printf("resident memory before %.1f MiB, after %.1f MiB\n", before, after);
  server.Stop();
}

TEST(ParseListenAddress, GoForms) {
  EXPECT_EQ(*ParseListenAddress("127.0.0.1:8080"), (ListenAddress{"127.0.0.1", 8080}));
  EXPECT_EQ(*ParseListenAddress(":9395"), (ListenAddress{"", 9395}));
  EXPECT_EQ(*ParseListenAddress("[::1]:443"), (ListenAddress{"::1", 443}));
  EXPECT_EQ(*ParseListenAddress("[::]:0"), (ListenAddress{"::", 0}));
  EXPECT_EQ(*ParseListenAddress("localhost:65535"), (ListenAddress{"localhost", 65535}));
  for (const char* bad : {"127.0.0.1", "", "::1:80", "[::1]", "[::1]x:80", "host:", "host:http",
                          "host:65536", "host:-1", "host:+80", "a]:80", "[a:80"}) {
    absl::StatusOr<ListenAddress> a = ParseListenAddress(bad);
    EXPECT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ParseListenAddress("127.0.0.1").status().message()),
              HasSubstr("missing port in address"));
  EXPECT_THAT(std::string(ParseListenAddress("::1:80").status().message()),
              HasSubstr("too many colons"));
}

TEST(HttpServerStart, Errors) {
  FakeBackend backend;
  HttpServerOptions options = LocalOptions();
  options.bind_address = "127.0.0.1";
  EXPECT_EQ(HttpServer(&backend, options).Start().code(), absl::StatusCode::kInvalidArgument);

  options = LocalOptions();
  options.metrics_bind_address = "nope";
  EXPECT_EQ(HttpServer(&backend, options).Start().code(), absl::StatusCode::kInvalidArgument);

  // A port in use, on the main and on the metrics listener.
  HttpServer first(&backend, LocalOptions());
  ASSERT_TRUE(first.Start().ok());
  options = LocalOptions();
  options.bind_address = "127.0.0.1:" + std::to_string(first.port());
  absl::Status s = HttpServer(&backend, options).Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(options.bind_address));
  options = LocalOptions();
  options.metrics_bind_address = "127.0.0.1:" + std::to_string(first.port());
  s = HttpServer(&backend, options).Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // The first server still serves.
  httplib::Client c("127.0.0.1", first.port());
  httplib::Result r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);

  // TLS needs both files, and readable, matching ones.
  options = LocalOptions();
  options.cert_file = "/nonexistent/tls.crt";
  EXPECT_EQ(HttpServer(&backend, options).Start().code(), absl::StatusCode::kInvalidArgument);
  options.key_file = "/nonexistent/tls.key";
  EXPECT_EQ(HttpServer(&backend, options).Start().code(), absl::StatusCode::kInvalidArgument);
}

// ":port" listens on every interface, so 127.0.0.1 reaches it; Stop() twice is fine.
TEST(HttpServerStart, AllInterfacesAndIpv6Loopback) {
  FakeBackend backend;
  HttpServerOptions options = LocalOptions();
  options.bind_address = ":0";
  HttpServer server(&backend, options);
  ASSERT_TRUE(server.Start().ok());
  {
    httplib::Client c("127.0.0.1", server.port());
    httplib::Result r = c.Get("/healthz");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  server.Stop();
  server.Stop();

  options.bind_address = "[::1]:0";
  HttpServer v6(&backend, options);
  if (!v6.Start().ok()) {
    GTEST_SKIP() << "no IPv6 loopback here";
  }
  httplib::Client c("::1", v6.port());
  httplib::Result r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// The default debug_access on the listeners serve really binds: ":9395" is IPv6 with IPv4
// mapped where the host has IPv6, so 127.0.0.1 arrives as ::ffff:127.0.0.1 and is still a
// loopback peer; so is ::1.
TEST(HttpServerStart, DebugIsServedToLoopbackPeersOfEveryAddressFamily) {
  FakeBackend backend;
  HttpServerOptions options = LocalOptions();
  options.metrics_bind_address = ":0";
  HttpServer server(&backend, options);
  ASSERT_TRUE(server.Start().ok());
  httplib::Client v4("127.0.0.1", server.metrics_port());
  httplib::Result r = v4.Get("/debug/ledger");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  server.Stop();

  options.metrics_bind_address = "[::1]:0";
  HttpServer v6(&backend, options);
  if (!v6.Start().ok()) {
    GTEST_SKIP() << "no IPv6 loopback here";
  }
  httplib::Client c("::1", v6.metrics_port());
  r = c.Get("/debug/audit");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// ---- TLS -----------------------------------------------------------------------------------

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "extender_tls_XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

  // Replaces a file atomically, as a Secret volume update does.
  void Write(const std::string& name, const std::string& content) const {
    const std::string tmp = File(name + ".tmp");
    std::ofstream(tmp, std::ios::binary) << content;
    std::rename(tmp.c_str(), File(name).c_str());
  }

 private:
  std::string path_;
};

// Whether a fresh client that trusts only `ca_file` completes a handshake and a request.
bool TrustedBy(int port, const std::string& ca_file) {
  httplib::SSLClient c("127.0.0.1", port);
  c.set_ca_cert_path(ca_file.c_str());
  c.enable_server_certificate_verification(true);
  c.set_connection_timeout(5);
  c.set_read_timeout(10);
  httplib::Result r = c.Get("/healthz");
  return r && r->status == 200 && r->body == "ok";
}

TEST(HttpServerTls, ServesAndReloadsCertificate) {
  absl::StatusOr<apisim::PemPair> a = apisim::GenerateSelfSignedCert();
  absl::StatusOr<apisim::PemPair> b = apisim::GenerateSelfSignedCert();
  ASSERT_TRUE(a.ok() && b.ok());
  TempDir dir;
  dir.Write("tls.crt", a->cert_pem);
  dir.Write("tls.key", a->key_pem);
  dir.Write("a.pem", a->cert_pem);
  dir.Write("b.pem", b->cert_pem);

  FakeClock clock;
  FakeBackend backend;
  HttpServerOptions options = LocalOptions();
  options.cert_file = dir.File("tls.crt");
  options.key_file = dir.File("tls.key");
  options.cert_check_interval = absl::Seconds(5);
  options.clock = &clock;
  HttpServer server(&backend, options);
  absl::Status s = server.Start();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(server.tls());

  EXPECT_TRUE(TrustedBy(server.port(), dir.File("a.pem")));
  EXPECT_FALSE(TrustedBy(server.port(), dir.File("b.pem")));
  {
    // The extender routes over TLS.
    httplib::SSLClient c("127.0.0.1", server.port());
    c.enable_server_certificate_verification(false);
    httplib::Result r =
        c.Post("/bind", R"({"PodName":"p","PodNamespace":"ns","Node":"n"})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, R"({"Error":""})");
  }

  // New files are not looked at before the interval has passed...
  dir.Write("tls.crt", b->cert_pem);
  dir.Write("tls.key", b->key_pem);
  clock.Advance(absl::Seconds(4));
  EXPECT_TRUE(TrustedBy(server.port(), dir.File("a.pem")));
  // ...and are served once it has, without a restart.
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(TrustedBy(server.port(), dir.File("b.pem")));
  EXPECT_FALSE(TrustedBy(server.port(), dir.File("a.pem")));

  // A half-replaced pair (certificate A with key B) is refused; B stays in service.
  dir.Write("tls.crt", a->cert_pem);
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(TrustedBy(server.port(), dir.File("b.pem")));
  // So is garbage.
  dir.Write("tls.crt", "not a certificate");
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(TrustedBy(server.port(), dir.File("b.pem")));
  // Completing the replacement brings A back.
  dir.Write("tls.crt", a->cert_pem);
  dir.Write("tls.key", a->key_pem);
  clock.Advance(absl::Seconds(5));
  EXPECT_TRUE(TrustedBy(server.port(), dir.File("a.pem")));
  server.Stop();
}

}  // namespace
}  // namespace tessera::extender
