// In-process tests of the simulator against the conformance checklist in
// docs/k8s-protocol.md §10, through real HTTP on 127.0.0.1 port 0.
#include "tessera/apisim/server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

#include "tessera/testing/reading_clock.h"
#include "tessera/testing/wait.h"

namespace tessera::apisim {
namespace {

using Json = nlohmann::json;
using ::tessera::testing::Eventually;
using ::tessera::testing::ReadingClock;
using ::testing::HasSubstr;

std::string PodJson(const std::string& name, const std::string& node = "",
                    const std::string& labels = "{}") {
  std::string spec = R"("containers":[{"name":"c","image":"busybox"}])";
  if (!node.empty()) {
    spec += R"(,"nodeName":")" + node + "\"";
  }
  return R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":")" + name + R"(","labels":)" +
         labels + R"(},"spec":{)" + spec + "}}";
}

// Reads a watch stream on its own thread and collects its lines.
class WatchReader {
 public:
  WatchReader(int port, std::string path, httplib::Headers headers = {}) : cli_("127.0.0.1", port) {
    cli_.set_read_timeout(30, 0);
    thread_ = std::thread([this, path, headers] {
      auto res = cli_.Get(
          path, headers,
          [this](const httplib::Response& r) {
            std::lock_guard<std::mutex> l(mu_);
            status_ = r.status;
            content_type_ = r.get_header_value("Content-Type");
            chunked_ = r.get_header_value("Transfer-Encoding") == "chunked";
            return true;
          },
          [this](const char* data, size_t n) {
            std::lock_guard<std::mutex> l(mu_);
            buf_.append(data, n);
            size_t nl;
            while ((nl = buf_.find('\n')) != std::string::npos) {
              std::string line = buf_.substr(0, nl);
              buf_.erase(0, nl + 1);
              if (!line.empty()) {
                lines_.push_back(line);
              }
            }
            cv_.notify_all();
            return !stop_;
          });
      std::lock_guard<std::mutex> l(mu_);
      done_ = true;
      clean_ = static_cast<bool>(res);
      if (res && status_ == 0) {
        status_ = res->status;
        body_ = res->body;
      }
      cv_.notify_all();
    });
  }
  ~WatchReader() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cli_.stop();
    thread_.join();
  }
  // Waits until `n` lines arrived (or the stream ended); returns the lines so far.
  std::vector<Json> WaitLines(size_t n, int timeout_ms = 5000) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, std::chrono::milliseconds(timeout_ms),
                 [&] { return lines_.size() >= n || done_; });
    std::vector<Json> out;
    for (const std::string& s : lines_) {
      out.push_back(Json::parse(s, nullptr, false));
    }
    return out;
  }
  bool WaitDone(int timeout_ms = 5000) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return done_; });
  }
  std::vector<std::string> RawLines() {
    std::lock_guard<std::mutex> l(mu_);
    return std::vector<std::string>(lines_.begin(), lines_.end());
  }
  int status() {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }
  bool clean() {
    std::lock_guard<std::mutex> l(mu_);
    return clean_;
  }
  bool chunked() {
    std::lock_guard<std::mutex> l(mu_);
    return chunked_;
  }
  std::string content_type() {
    std::lock_guard<std::mutex> l(mu_);
    return content_type_;
  }

 private:
  httplib::Client cli_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buf_;
  std::deque<std::string> lines_;
  bool stop_ = false;
  bool done_ = false;
  bool clean_ = false;
  bool chunked_ = false;
  int status_ = 0;
  std::string body_;
  std::string content_type_;
};

class ApisimTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(ServerOptions{}); }

  void StartServer(ServerOptions o) {
    server_.reset();
    o.bookmark_interval = absl::Milliseconds(300);
    o.reap_interval = absl::Milliseconds(20);
    if (o.watch_history == 10000) {
      o.watch_history = 1000;
    }
    auto s = Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    cli_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    cli_->set_read_timeout(10, 0);
  }

  httplib::Result Post(const std::string& path, const std::string& body,
                       const std::string& ct = "application/json") {
    return cli_->Post(path.c_str(), body, ct.c_str());
  }
  httplib::Result Patch(const std::string& path, const std::string& body, const std::string& ct) {
    return cli_->Patch(path.c_str(), body, ct.c_str());
  }
  Json GetJson(const std::string& path, int want = 200) {
    auto r = cli_->Get(path.c_str());
    EXPECT_TRUE(r);
    if (!r) {
      return Json();
    }
    EXPECT_EQ(r->status, want) << path << " " << r->body;
    return Json::parse(r->body, nullptr, false);
  }
  Json CreatePod(const std::string& name, const std::string& node = "",
                 const std::string& labels = "{}") {
    auto r = Post("/api/v1/namespaces/default/pods", PodJson(name, node, labels));
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 201) << r->body;
    return Json::parse(r->body);
  }
  uint64_t Rv() { return server_->store().CurrentRevision(); }
  // Waits until the server has `n` open watches.
  void WaitWatches(int n) {
    EXPECT_TRUE(Eventually([&] { return GetJson("/simulator/v1/stats")["watchesOpen"] == n; }))
        << "never saw " << n << " open watches";
  }
  // Expects a Status body with this code and reason, and that the store did not change.
  void ExpectStatus(const httplib::Result& r, int code, const std::string& reason) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, code) << r->body;
    Json s = Json::parse(r->body, nullptr, false);
    ASSERT_TRUE(s.is_object()) << r->body;
    EXPECT_EQ(s["kind"], "Status");
    EXPECT_EQ(s["status"], "Failure");
    EXPECT_EQ(s["code"], code);
    EXPECT_EQ(s["reason"], reason) << r->body;
    EXPECT_FALSE(s["message"].get<std::string>().empty());
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<httplib::Client> cli_;
};

// §10.1: one global revision; list RV = current revision; item RV = its last write.
TEST_F(ApisimTest, OneMonotonicResourceVersion) {
  uint64_t before = Rv();
  Json a = CreatePod("a");
  auto node = Post("/api/v1/nodes", R"({"metadata":{"name":"n1"}})");
  ASSERT_EQ(node->status, 201);
  Json b = CreatePod("b");
  EXPECT_EQ(std::stoull(a["metadata"]["resourceVersion"].get<std::string>()), before + 1);
  EXPECT_EQ(std::stoull(b["metadata"]["resourceVersion"].get<std::string>()), before + 3);
  EXPECT_FALSE(a["metadata"]["uid"].get<std::string>().empty());
  EXPECT_FALSE(a["metadata"]["creationTimestamp"].get<std::string>().empty());
  EXPECT_EQ(a["metadata"]["generation"], 1);
  EXPECT_EQ(a["status"]["phase"], "Pending");
  Json list = GetJson("/api/v1/namespaces/default/pods");
  EXPECT_EQ(list["kind"], "PodList");
  EXPECT_EQ(list["metadata"]["resourceVersion"], std::to_string(Rv()));
  ASSERT_EQ(list["items"].size(), 2u);
  EXPECT_EQ(list["items"][0]["metadata"]["resourceVersion"], a["metadata"]["resourceVersion"]);
  Json all = GetJson("/api/v1/pods");
  EXPECT_EQ(all["items"].size(), 2u);
  Json empty = GetJson("/api/v1/namespaces/kube-system/pods");
  EXPECT_TRUE(empty["items"].is_array());
  EXPECT_EQ(empty["items"].size(), 0u);
}

// §10.2–10.5: resume from RV; 410 ERROR when too old; synthetic ADDED; framing; timeout.
TEST_F(ApisimTest, WatchResumeFramingAndExpiry) {
  CreatePod("a");
  uint64_t rv = Rv();
  CreatePod("b");
  cli_->Delete("/api/v1/namespaces/default/pods/a");
  {
    WatchReader w(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                       std::to_string(rv) + "&timeoutSeconds=1");
    auto lines = w.WaitLines(3);
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[0]["type"], "ADDED");
    EXPECT_EQ(lines[0]["object"]["metadata"]["name"], "b");
    EXPECT_EQ(lines[0]["object"]["kind"], "Pod");
    EXPECT_EQ(lines[1]["type"], "MODIFIED");  // deletionTimestamp, then
    EXPECT_EQ(lines[2]["type"], "DELETED");
    EXPECT_EQ(lines[2]["object"]["metadata"]["resourceVersion"], std::to_string(Rv()));
    EXPECT_TRUE(w.WaitDone(3000));  // timeoutSeconds=1 ends the body cleanly
    EXPECT_TRUE(w.clean());
    EXPECT_TRUE(w.chunked());
    EXPECT_THAT(w.content_type(), HasSubstr("application/json"));
    for (const std::string& raw : w.RawLines()) {
      EXPECT_EQ(raw.find(": "), std::string::npos) << "not compact: " << raw;
    }
  }
  {
    WatchReader w(server_->port(), "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1");
    auto lines = w.WaitLines(1);
    ASSERT_EQ(lines.size(), 1u);  // synthetic ADDED for the current state (pod b)
    EXPECT_EQ(lines[0]["type"], "ADDED");
    EXPECT_EQ(lines[0]["object"]["metadata"]["name"], "b");
  }
  auto compact = Post("/simulator/v1/compact", "");
  ASSERT_EQ(compact->status, 200);
  {
    WatchReader w(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                       std::to_string(rv));
    auto lines = w.WaitLines(1);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(w.status(), 200);
    EXPECT_EQ(lines[0]["type"], "ERROR");
    EXPECT_EQ(lines[0]["object"]["code"], 410);
    EXPECT_EQ(lines[0]["object"]["reason"], "Expired");
    EXPECT_THAT(lines[0]["object"]["message"].get<std::string>(),
                HasSubstr("too old resource version"));
    EXPECT_TRUE(w.WaitDone());  // the stream ends after the ERROR
  }
}

// The history is shared by every resource, but a watch expires only when an event of its own
// resource that it had not sent leaves it (kube-apiserver keeps a watch cache per resource):
// Events flooding the history, or a compaction, do not end a pod watch that has sent every pod
// event, nor a resume from the last pod revision; a pod watch that missed pod events does end
// with 410. A pod watch's bookmarks carry the store's revision, Events included.
TEST_F(ApisimTest, AWatchExpiresOnlyForItsOwnResource) {
  ServerOptions o;
  o.watch_history = 5;
  StartServer(o);
  CreatePod("a");
  const uint64_t after_a = Rv();
  const std::string events = "/api/v1/namespaces/default/events";
  auto event_json = [](int i) {
    return Json{{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"name", "e" + std::to_string(i)}}},
                {"involvedObject", {{"kind", "Pod"}, {"name", "a"}}},
                {"reason", "Flood"}}
        .dump();
  };
  const uint64_t behind = Rv() - 1;  // before pod a: its ADDED is the watch's first event
  WatchReader w(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                     std::to_string(Rv()) + "&timeoutSeconds=5");
  Eventually([&] { return w.status() != 0; });  // the stream is open once its head is in
  ASSERT_EQ(w.status(), 200);
  // Held while the Events pass through the history, so the watch cannot keep up with them.
  Faults pause;
  pause.pause_watches = true;
  server_->store().SetFaults(pause);
  for (int i = 0; i < 20; ++i) {
    auto r = Post(events, event_json(i));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 201) << r->body;
  }
  ASSERT_EQ(Post("/simulator/v1/compact", "")->status, 200);
  for (int i = 20; i < 30; ++i) {
    ASSERT_EQ(Post(events, event_json(i))->status, 201);
  }
  server_->store().SetFaults({});
  CreatePod("b");
  auto lines = w.WaitLines(1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["type"], "ADDED");
  EXPECT_EQ(lines[0]["object"]["metadata"]["name"], "b");

  // Resuming from pod a's revision: only Events were dropped since, so the stream goes on.
  WatchReader resumed(server_->port(),
                      "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                          std::to_string(after_a) + "&timeoutSeconds=5");
  auto resumed_lines = resumed.WaitLines(1);
  ASSERT_EQ(resumed_lines.size(), 1u);
  EXPECT_EQ(resumed_lines[0]["type"], "ADDED");
  EXPECT_EQ(resumed_lines[0]["object"]["metadata"]["name"], "b");

  // A bookmark after Events carries their revision.
  WatchReader marked(server_->port(),
                     "/api/v1/namespaces/default/pods?watch=true&allowWatchBookmarks=true"
                     "&timeoutSeconds=5&resourceVersion=" +
                         std::to_string(Rv()));
  for (int i = 30; i < 33; ++i) {
    ASSERT_EQ(Post(events, event_json(i))->status, 201);
  }
  const uint64_t after_events = Rv();
  // Bookmarks come every 300 ms here; one sent before the Events landed may carry less.
  bool marked_current = false;
  for (const Json& line : marked.WaitLines(3, 3000)) {
    EXPECT_EQ(line["type"], "BOOKMARK");
    marked_current |= line["object"]["metadata"]["resourceVersion"] == std::to_string(after_events);
  }
  EXPECT_TRUE(marked_current);

  // Resuming from before pod a, whose ADDED has left the history: 410.
  WatchReader old(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                       std::to_string(behind));
  auto expired = old.WaitLines(1);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]["type"], "ERROR");
  EXPECT_EQ(expired[0]["object"]["code"], 410);
}

// §10.6: selectors on list and watch; DELETED/ADDED on selector transitions.
TEST_F(ApisimTest, SelectorsAndTransitions) {
  CreatePod("a", "node-1", R"({"app":"web"})");
  CreatePod("b", "node-2", R"({"app":"db"})");
  Json l = GetJson("/api/v1/pods?labelSelector=app%20in%20(web)");
  ASSERT_EQ(l["items"].size(), 1u);
  EXPECT_EQ(l["items"][0]["metadata"]["name"], "a");
  l = GetJson("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-2");
  ASSERT_EQ(l["items"].size(), 1u);
  EXPECT_EQ(l["items"][0]["metadata"]["name"], "b");
  EXPECT_FALSE(l["metadata"].contains("remainingItemCount"));
  ExpectStatus(cli_->Get("/api/v1/pods?fieldSelector=spec.bogus%3Dx"), 400, "BadRequest");
  ExpectStatus(cli_->Get("/api/v1/pods?labelSelector=a%20in%20b"), 400, "BadRequest");

  const std::string rv = std::to_string(Rv());
  WatchReader w(server_->port(),
                "/api/v1/pods?watch=true&resourceVersion=" + rv +
                    "&fieldSelector=status.phase!%3DSucceeded,status.phase!%3DFailed");
  WatchReader lw(server_->port(),
                 "/api/v1/pods?watch=true&resourceVersion=" + rv + "&labelSelector=tier%3Dgpu");
  auto r = Patch("/api/v1/namespaces/default/pods/a/status", R"({"status":{"phase":"Succeeded"}})",
                 "application/merge-patch+json");
  ASSERT_EQ(r->status, 200) << r->body;
  r = Patch("/api/v1/namespaces/default/pods/b", R"({"metadata":{"labels":{"tier":"gpu"}}})",
            "application/merge-patch+json");
  ASSERT_EQ(r->status, 200) << r->body;
  auto lines = w.WaitLines(2);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0]["type"], "DELETED");  // a left the selector: DELETED with the old object
  EXPECT_EQ(lines[0]["object"]["metadata"]["name"], "a");
  EXPECT_EQ(lines[0]["object"]["status"]["phase"], "Pending");
  EXPECT_EQ(lines[1]["type"], "MODIFIED");
  auto llines = lw.WaitLines(1);
  ASSERT_EQ(llines.size(), 1u);
  EXPECT_EQ(llines[0]["type"], "ADDED");  // b entered the label selector
  EXPECT_EQ(llines[0]["object"]["metadata"]["name"], "b");
}

// §10.7, §10.8: bookmarks; watch-list with the initial-events-end bookmark.
TEST_F(ApisimTest, BookmarksAndWatchList) {
  CreatePod("a");
  CreatePod("b");
  {
    WatchReader w(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                       std::to_string(Rv()) + "&allowWatchBookmarks=true");
    auto lines = w.WaitLines(1, 3000);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["type"], "BOOKMARK");
    EXPECT_EQ(lines[0]["object"]["metadata"]["resourceVersion"], std::to_string(Rv()));
  }
  {
    WatchReader w(server_->port(),
                  "/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true&"
                  "resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=");
    auto lines = w.WaitLines(3);
    ASSERT_GE(lines.size(), 3u);
    EXPECT_EQ(lines[0]["type"], "ADDED");
    EXPECT_EQ(lines[1]["type"], "ADDED");
    EXPECT_EQ(lines[2]["type"], "BOOKMARK");
    EXPECT_EQ(lines[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
    EXPECT_EQ(lines[2]["object"]["metadata"]["resourceVersion"], std::to_string(Rv()));
  }
  ExpectStatus(cli_->Get("/api/v1/pods?watch=true&sendInitialEvents=true"), 422, "Invalid");
  ExpectStatus(cli_->Get("/api/v1/pods?watch=true&resourceVersionMatch=NotOlderThan"), 422,
               "Invalid");
  ExpectStatus(cli_->Get("/api/v1/pods?sendInitialEvents=true"), 422, "Invalid");
  // In kube-apiserver v1.37.2's words (docs/apisim.md, "Checked against kube-apiserver").
  auto r = cli_->Get("/api/v1/pods?watch=true&sendInitialEvents=true");
  EXPECT_EQ(Json::parse(r->body)["details"]["causes"][0]["field"], "resourceVersionMatch");
  EXPECT_EQ(Json::parse(r->body)["details"]["causes"][0]["message"],
            "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan");
  r = cli_->Get("/api/v1/pods?sendInitialEvents=true");
  EXPECT_EQ(Json::parse(r->body)["details"]["causes"][0]["field"], "sendInitialEvents");
  // A watch that ends within 2 s gets no bookmark (the last one is due 2 s before the end).
  {
    WatchReader w(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                       std::to_string(Rv()) +
                                       "&allowWatchBookmarks=true&timeoutSeconds=1");
    EXPECT_TRUE(w.WaitDone(4000));
    EXPECT_EQ(w.RawLines().size(), 0u);
  }
}

// §10.9: limit/continue from a consistent snapshot; 410 for an expired token.
TEST_F(ApisimTest, PagedListIsConsistentSnapshot) {
  for (int i = 0; i < 5; ++i) {
    CreatePod("p" + std::to_string(i));
  }
  Json page = GetJson("/api/v1/namespaces/default/pods?limit=2");
  ASSERT_EQ(page["items"].size(), 2u);
  const std::string snap = page["metadata"]["resourceVersion"];
  EXPECT_EQ(page["metadata"]["remainingItemCount"], 3);
  std::string token = page["metadata"]["continue"];
  // Changes after the first page must not show up in later pages.
  cli_->Delete("/api/v1/namespaces/default/pods/p3");
  CreatePod("p9");
  std::vector<std::string> names = {page["items"][0]["metadata"]["name"],
                                    page["items"][1]["metadata"]["name"]};
  while (!token.empty()) {
    page = GetJson("/api/v1/namespaces/default/pods?limit=2&continue=" + token);
    EXPECT_EQ(page["metadata"]["resourceVersion"], snap);
    for (const Json& it : page["items"]) {
      names.push_back(it["metadata"]["name"]);
    }
    token = page["metadata"].value("continue", "");
    if (!token.empty()) {
      EXPECT_EQ(page["metadata"]["remainingItemCount"], 5 - static_cast<int>(names.size()));
    }
  }
  EXPECT_THAT(names, ::testing::ElementsAre("p0", "p1", "p2", "p3", "p4"));
  Json again = GetJson("/api/v1/namespaces/default/pods?limit=2");
  token = again["metadata"]["continue"];
  ExpectStatus(
      cli_->Get(
          ("/api/v1/namespaces/default/pods?limit=2&resourceVersion=5&continue=" + token).c_str()),
      400, "BadRequest");
  CreatePod("late");                  // the token's revision is now history ...
  Post("/simulator/v1/compact", "");  // ... and compacted away
  auto expired = cli_->Get(("/api/v1/namespaces/default/pods?limit=2&continue=" + token).c_str());
  ExpectStatus(expired, 410, "Expired");
  // The Status offers a token for the rest at the latest revision, as kube-apiserver's does.
  const std::string rest = Json::parse(expired->body)["metadata"].value("continue", "");
  ASSERT_FALSE(rest.empty()) << expired->body;
  page = GetJson("/api/v1/namespaces/default/pods?limit=2&continue=" + rest);
  EXPECT_EQ(page["metadata"]["resourceVersion"], std::to_string(Rv()));
  ASSERT_EQ(page["items"].size(), 2u);
  EXPECT_EQ(page["items"][0]["metadata"]["name"], "p2");  // after the first page's p0, p1
  EXPECT_EQ(page["items"][1]["metadata"]["name"], "p4");  // p3 is gone; p9 follows ("late"
  EXPECT_EQ(page["metadata"]["remainingItemCount"], 1);   // sorts before the start)
  // Exact list at a compacted revision: 410; from the future: 504 with Retry-After.
  ExpectStatus(
      cli_->Get(("/api/v1/pods?resourceVersion=" + snap + "&resourceVersionMatch=Exact").c_str()),
      410, "Expired");
  ExpectStatus(cli_->Get("/api/v1/pods?resourceVersionMatch=Exact"), 422, "Invalid");
  ExpectStatus(cli_->Get("/api/v1/pods?resourceVersion=0&resourceVersionMatch=Exact"), 422,
               "Invalid");
}

TEST_F(ApisimTest, TooLargeResourceVersionIs504) {
  auto start = std::chrono::steady_clock::now();
  auto r = cli_->Get(("/api/v1/pods?resourceVersion=" + std::to_string(Rv() + 100)).c_str());
  ExpectStatus(r, 504, "Timeout");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2900));
}

// §10.10 and bad input: Status bodies with the right codes; the store does not change.
TEST_F(ApisimTest, ErrorsLeaveStoreUnchanged) {
  CreatePod("a");
  const uint64_t rv = Rv();
  ExpectStatus(cli_->Get("/api/v1/namespaces/default/pods/zzz"), 404, "NotFound");
  ExpectStatus(cli_->Get("/api/v1/namespaces/default/widgets"), 404, "NotFound");
  ExpectStatus(Post("/api/v1/namespaces/default/pods", PodJson("a")), 409, "AlreadyExists");
  ExpectStatus(Post("/api/v1/namespaces/default/pods", "{not json"), 400, "BadRequest");
  ExpectStatus(Post("/api/v1/namespaces/default/pods", "[1,2]"), 400, "BadRequest");
  ExpectStatus(Post("/api/v1/namespaces/default/pods",
                    R"({"metadata":{"name":"x","labels":{"a":1}},"spec":{"containers":[]}})"),
               400, "BadRequest");
  ExpectStatus(Post("/api/v1/namespaces/default/pods",
                    R"({"metadata":{"name":"x"},"spec":{"containers":"nope"}})"),
               400, "BadRequest");
  ExpectStatus(Post("/api/v1/namespaces/default/pods", R"({"metadata":{"name":"x"},"spec":{}})"),
               422, "Invalid");
  ExpectStatus(Post("/api/v1/namespaces/default/pods", PodJson("Bad_Name")), 422, "Invalid");
  ExpectStatus(Post("/api/v1/namespaces/nope/pods", PodJson("x")), 404, "NotFound");
  ExpectStatus(
      Post("/api/v1/namespaces/default/pods", PodJson("x"), "application/vnd.kubernetes.protobuf"),
      415, "UnsupportedMediaType");
  ExpectStatus(Patch("/api/v1/namespaces/default/pods/a", "{}", "application/apply-patch+yaml"),
               415, "UnsupportedMediaType");
  ExpectStatus(Patch("/api/v1/namespaces/default/pods/a", "{", "application/merge-patch+json"), 400,
               "BadRequest");
  ExpectStatus(Post("/api/v1/namespaces/default/pods/a", "{}"), 405, "MethodNotAllowed");
  ExpectStatus(cli_->Put("/api/v1/namespaces/default/pods", "{}", "application/json"), 405,
               "MethodNotAllowed");
  std::string big(3 * 1024 * 1024 + 10, ' ');
  ExpectStatus(Post("/api/v1/namespaces/default/pods", big), 413, "RequestEntityTooLarge");
  httplib::Headers proto = {{"Accept", "application/vnd.kubernetes.protobuf"}};
  ExpectStatus(cli_->Get("/api/v1/pods", proto), 406, "NotAcceptable");
  EXPECT_EQ(Rv(), rv);
  EXPECT_EQ(GetJson("/api/v1/pods")["items"].size(), 1u);
}

// §10.11: optimistic concurrency and the patch types.
TEST_F(ApisimTest, ConflictsAndPatchTypes) {
  Json a = CreatePod("a");
  const std::string rv0 = a["metadata"]["resourceVersion"];
  a["metadata"]["labels"]["x"] = "1";
  auto r = cli_->Put("/api/v1/namespaces/default/pods/a", a.dump(), "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  ExpectStatus(cli_->Put("/api/v1/namespaces/default/pods/a", a.dump(), "application/json"), 409,
               "Conflict");  // stale RV
  ExpectStatus(Patch("/api/v1/namespaces/default/pods/a",
                     R"({"metadata":{"resourceVersion":")" + rv0 + R"(","labels":{"y":"2"}}})",
                     "application/merge-patch+json"),
               409, "Conflict");
  ExpectStatus(Patch("/api/v1/namespaces/default/pods/a",
                     R"([{"op":"test","path":"/metadata/labels/x","value":"other"}])",
                     "application/json-patch+json"),
               422, "Invalid");
  // metadata.uid names the object: in a PUT it is a precondition (409), in a patch it meets
  // the immutability check (422); either way another object's uid writes nothing.
  {
    const uint64_t before = Rv();
    Json other = Json::parse(cli_->Get("/api/v1/namespaces/default/pods/a")->body);
    other["metadata"]["uid"] = "not-a";
    other["metadata"].erase("resourceVersion");
    ExpectStatus(cli_->Put("/api/v1/namespaces/default/pods/a", other.dump(), "application/json"),
                 409, "Conflict");
    auto bad =
        Patch("/api/v1/namespaces/default/pods/a",
              R"({"metadata":{"uid":"not-a","labels":{"z":"1"}}})", "application/merge-patch+json");
    ExpectStatus(bad, 422, "Invalid");
    EXPECT_EQ(Json::parse(bad->body)["message"],
              "Pod \"a\" is invalid: metadata.uid: Invalid value: \"not-a\": field is immutable");
    EXPECT_EQ(Rv(), before);
    const std::string uid = a["metadata"]["uid"];
    r = Patch("/api/v1/namespaces/default/pods/a",
              R"({"metadata":{"uid":")" + uid + R"(","labels":{"z":"1"}}})",
              "application/merge-patch+json");
    ASSERT_EQ(r->status, 200) << r->body;
  }
  r = Patch("/api/v1/namespaces/default/pods/a",
            R"([{"op":"add","path":"/metadata/annotations","value":{"k":"v"}}])",
            "application/json-patch+json");
  ASSERT_EQ(r->status, 200) << r->body;
  r = Patch(
      "/api/v1/namespaces/default/pods/a",
      R"({"metadata":{"annotations":{"k":null,"k2":"v2"}},"spec":{"activeDeadlineSeconds":5}})",
      "application/strategic-merge-patch+json");
  ASSERT_EQ(r->status, 200) << r->body;
  Json p = Json::parse(r->body);
  EXPECT_FALSE(p["metadata"]["annotations"].contains("k"));
  EXPECT_EQ(p["metadata"]["annotations"]["k2"], "v2");
  EXPECT_EQ(p["spec"]["activeDeadlineSeconds"], 5);
  EXPECT_EQ(p["metadata"]["generation"], 2);  // spec changed
  {
    // The same spec with its keys (and those of its containers) in reverse order is no change;
    // one changed value is.
    std::function<nlohmann::ordered_json(const nlohmann::ordered_json&)> reversed =
        [&](const nlohmann::ordered_json& v) {
          if (v.is_array()) {
            nlohmann::ordered_json out = nlohmann::ordered_json::array();
            for (const auto& e : v) {
              out.push_back(reversed(e));
            }
            return out;
          }
          if (!v.is_object()) {
            return v;
          }
          std::vector<std::string> keys;
          for (auto it = v.begin(); it != v.end(); ++it) {
            keys.push_back(it.key());
          }
          nlohmann::ordered_json out = nlohmann::ordered_json::object();
          for (auto k = keys.rbegin(); k != keys.rend(); ++k) {
            out[*k] = reversed(v[*k]);
          }
          return out;
        };
    nlohmann::ordered_json o = nlohmann::ordered_json::parse(r->body);
    o["spec"] = reversed(o["spec"]);
    ASSERT_NE(o["spec"].dump(), nlohmann::ordered_json::parse(r->body)["spec"].dump());
    r = cli_->Put("/api/v1/namespaces/default/pods/a", o.dump(), "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(Json::parse(r->body)["metadata"]["generation"], 2);
    o = nlohmann::ordered_json::parse(r->body);
    o["spec"]["activeDeadlineSeconds"] = 6;
    r = cli_->Put("/api/v1/namespaces/default/pods/a", o.dump(), "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(Json::parse(r->body)["metadata"]["generation"], 3);
    p = Json::parse(r->body);
  }
  // A patch that changes nothing keeps the revision.
  const uint64_t before = Rv();
  r = Patch("/api/v1/namespaces/default/pods/a", R"({"metadata":{"annotations":{"k2":"v2"}}})",
            "application/merge-patch+json");
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(Rv(), before);
  // The main resource ignores status; /status only takes status.
  r = Patch("/api/v1/namespaces/default/pods/a", R"({"status":{"phase":"Running"}})",
            "application/merge-patch+json");
  EXPECT_EQ(Json::parse(r->body)["status"]["phase"], "Pending");
  r = Patch("/api/v1/namespaces/default/pods/a/status",
            R"({"status":{"phase":"Running"},"metadata":{"labels":{"ignored":"1"}}})",
            "application/merge-patch+json");
  EXPECT_EQ(Json::parse(r->body)["status"]["phase"], "Running");
  EXPECT_FALSE(Json::parse(r->body)["metadata"]["labels"].contains("ignored"));
  // dryRun=All changes nothing.
  const uint64_t dry = Rv();
  r = Patch("/api/v1/namespaces/default/pods/a?dryRun=All", R"({"metadata":{"labels":{"d":"1"}}})",
            "application/merge-patch+json");
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(Rv(), dry);
}

// §10.12: binding.
TEST_F(ApisimTest, Binding) {
  Json a = CreatePod("a");
  const std::string bind = R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"a","uid":")" +
                           a["metadata"]["uid"].get<std::string>() +
                           R"(","annotations":{"hami.io/vgpu-node":"n1"}},)"
                           R"("target":{"apiVersion":"v1","kind":"Node","name":"n1"}})";
  auto r = Post("/api/v1/namespaces/default/pods/a/binding", bind);
  ASSERT_EQ(r->status, 201) << r->body;
  Json s = Json::parse(r->body);
  EXPECT_EQ(s["status"], "Success");
  EXPECT_EQ(s["code"], 201);
  Json pod = GetJson("/api/v1/namespaces/default/pods/a");
  EXPECT_EQ(pod["spec"]["nodeName"], "n1");
  EXPECT_EQ(pod["metadata"]["annotations"]["hami.io/vgpu-node"], "n1");
  EXPECT_EQ(pod["status"]["conditions"][0]["type"], "PodScheduled");
  auto again = Post("/api/v1/namespaces/default/pods/a/binding", bind);
  ExpectStatus(again, 409, "Conflict");
  EXPECT_THAT(again->body, HasSubstr("already assigned to node"));
  ExpectStatus(Post("/api/v1/namespaces/default/pods/zz/binding",
                    R"({"metadata":{"name":"zz"},"target":{"name":"n1"}})"),
               404, "NotFound");
  CreatePod("b");
  ExpectStatus(Post("/api/v1/namespaces/default/pods/b/binding",
                    R"({"metadata":{"name":"other"},"target":{"name":"n1"}})"),
               400, "BadRequest");
  ExpectStatus(Post("/api/v1/namespaces/default/pods/b/binding",
                    R"({"metadata":{"name":"b","uid":"wrong"},"target":{"name":"n1"}})"),
               409, "Conflict");
}

// The eviction subresource: the pod's budget is consulted and spent, then the pod deleted.
TEST_F(ApisimTest, EvictionSpendsThePodsBudgetAndRefusesWhenItIsSpent) {
  Json a = CreatePod("a", "n1", R"({"app":"web"})");
  CreatePod("b", "n1", R"({"app":"web"})");
  CreatePod("c", "n1", R"({"app":"db"})");
  auto r = Post("/apis/policy/v1/namespaces/default/poddisruptionbudgets",
                R"({"metadata":{"name":"web"},"spec":{"minAvailable":1,)"
                R"("selector":{"matchLabels":{"app":"web"}}}})");
  ASSERT_EQ(r->status, 201) << r->body;
  Json pdb = Json::parse(r->body);
  pdb["status"] = {{"disruptionsAllowed", 1}, {"currentHealthy", 2}, {"desiredHealthy", 1}};
  r = cli_->Put("/apis/policy/v1/namespaces/default/poddisruptionbudgets/web/status", pdb.dump(),
                "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  auto evict = [&](const std::string& name, const std::string& uid = "") {
    std::string body =
        R"({"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":")" + name + R"("})";
    if (!uid.empty()) {
      body += R"(,"deleteOptions":{"preconditions":{"uid":")" + uid + R"("}})";
    }
    return Post("/api/v1/namespaces/default/pods/" + name + "/eviction", body + "}");
  };
  ExpectStatus(evict("a", "not-a"), 409, "Conflict");
  r = evict("a", a["metadata"]["uid"].get<std::string>());
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Json::parse(r->body)["status"], "Success");
  Json gone = GetJson("/api/v1/namespaces/default/pods/a");
  EXPECT_TRUE(gone["metadata"].contains("deletionTimestamp")) << gone.dump();
  Json spent = GetJson("/apis/policy/v1/namespaces/default/poddisruptionbudgets/web");
  EXPECT_EQ(spent["status"]["disruptionsAllowed"], 0);
  EXPECT_TRUE(spent["status"]["disruptedPods"].contains("a"));

  auto refused = evict("b");
  ExpectStatus(refused, 429, "TooManyRequests");
  EXPECT_THAT(refused->body, HasSubstr("violate the pod's disruption budget"));
  EXPECT_THAT(refused->body, HasSubstr("DisruptionBudget"));
  EXPECT_FALSE(
      GetJson("/api/v1/namespaces/default/pods/b")["metadata"].contains("deletionTimestamp"));
  // A pod no budget selects goes; a missing one is 404; the body must name the pod.
  ASSERT_EQ(evict("c")->status, 201);
  ExpectStatus(evict("zz"), 404, "NotFound");
  ExpectStatus(Post("/api/v1/namespaces/default/pods/b/eviction", R"({"metadata":{"name":"x"}})"),
               400, "BadRequest");
}

// Each eviction of a bound pod is recorded with the pods of its node just before it: those bound
// there and the pending ones an annotation reserves there (what a preemption oracle judges the
// victims against); a refused eviction, or one of an unbound pod, records nothing.
TEST_F(ApisimTest, EvictionsAreRecordedWithThePodsOfTheirNode) {
  CreatePod("a", "n1");
  CreatePod("b", "n1");
  CreatePod("elsewhere", "n2");
  CreatePod("pending");
  auto r = Post("/api/v1/namespaces/default/pods",
                R"({"metadata":{"name":"reserved","annotations":{"hami.io/vgpu-node":"n1"}},)"
                R"("spec":{"containers":[{"name":"c","image":"busybox"}]}})");
  ASSERT_EQ(r->status, 201) << r->body;
  auto evict = [&](const std::string& name) {
    return Post(
        "/api/v1/namespaces/default/pods/" + name + "/eviction",
        R"({"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":")" + name + R"("}})");
  };
  ExpectStatus(evict("zz"), 404, "NotFound");
  ASSERT_EQ(evict("pending")->status, 201);
  const uint64_t before = Rv();
  ASSERT_EQ(evict("a")->status, 201);
  Json got = GetJson("/simulator/v1/evictions");
  ASSERT_EQ(got["evictions"].size(), 1u) << got.dump();
  const Json& e = got["evictions"][0];
  EXPECT_EQ(e["name"], "a");
  EXPECT_EQ(e["namespace"], "default");
  EXPECT_EQ(e["node"], "n1");
  EXPECT_FALSE(e["uid"].get<std::string>().empty());
  EXPECT_EQ(e["resourceVersion"], std::to_string(before));
  std::set<std::string> names;
  for (const Json& p : e["nodePods"]) {
    names.insert(p["metadata"]["name"].get<std::string>());
    EXPECT_FALSE(p["metadata"].contains("deletionTimestamp")) << "the state before the eviction";
  }
  EXPECT_EQ(names, (std::set<std::string>{"a", "b", "reserved"}));
  ASSERT_EQ(evict("b")->status, 201);
  got = GetJson("/simulator/v1/evictions");
  ASSERT_EQ(got["evictions"].size(), 2u);
  bool a_terminating = false;
  for (const Json& p : got["evictions"][1]["nodePods"]) {
    a_terminating |= p["metadata"]["name"] == "a" && p["metadata"].contains("deletionTimestamp");
  }
  EXPECT_TRUE(a_terminating) << "the second record sees the first victim being deleted";
}

// §10.13: graceful deletion played by the built-in kubelet; preconditions.
// A pod whose grace ended while a finalizer held it goes the moment the finalizer is removed,
// even when the reaper already passed its deadline (it used to forget the deadline, leaving the
// pod terminating for ever).
TEST_F(ApisimTest, AFinalizerRemovedAfterTheGraceEndedDeletesThePod) {
  Json pod = Json::parse(PodJson("held", "n1"));
  pod["metadata"]["finalizers"] = Json::array({"example.com/hold"});
  auto r = Post("/api/v1/namespaces/default/pods", pod.dump());
  ASSERT_EQ(r->status, 201) << r->body;
  r = cli_->Delete("/api/v1/namespaces/default/pods/held?gracePeriodSeconds=0");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(GetJson("/api/v1/namespaces/default/pods/held", 200)["metadata"].contains(
      "deletionTimestamp"));
  server_->store().Reap();  // the grace is over, but the finalizer holds the pod
  GetJson("/api/v1/namespaces/default/pods/held", 200);
  r = Patch("/api/v1/namespaces/default/pods/held", R"({"metadata":{"finalizers":null}})",
            "application/merge-patch+json");
  ASSERT_EQ(r->status, 200) << r->body;
  GetJson("/api/v1/namespaces/default/pods/held", 404);
}

TEST_F(ApisimTest, GracefulDeletion) {
  CreatePod("unbound");
  // kube-apiserver v1.37.2 deletes even a pod that goes at once in two writes: MODIFIED with
  // deletionTimestamp, deletionGracePeriodSeconds 0 and generation + 1, then DELETED; the
  // answer is the object as deleted (docs/apisim.md, "Checked against kube-apiserver").
  WatchReader u(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                     std::to_string(Rv()) +
                                     "&fieldSelector=metadata.name%3Dunbound");
  auto r = cli_->Delete("/api/v1/namespaces/default/pods/unbound");
  ASSERT_EQ(r->status, 200);
  GetJson("/api/v1/namespaces/default/pods/unbound", 404);  // no node: deleted at once
  auto ulines = u.WaitLines(2, 4000);
  ASSERT_EQ(ulines.size(), 2u);
  EXPECT_EQ(ulines[0]["type"], "MODIFIED");
  EXPECT_EQ(ulines[0]["object"]["metadata"]["deletionGracePeriodSeconds"], 0);
  EXPECT_TRUE(ulines[0]["object"]["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(ulines[0]["object"]["metadata"]["generation"], 2);
  EXPECT_EQ(ulines[1]["type"], "DELETED");
  Json answer = Json::parse(r->body);
  EXPECT_EQ(answer["metadata"]["resourceVersion"],
            ulines[1]["object"]["metadata"]["resourceVersion"]);
  EXPECT_EQ(answer["metadata"]["deletionGracePeriodSeconds"], 0);

  Json b = CreatePod("bound", "n1");
  ExpectStatus(cli_->Delete("/api/v1/namespaces/default/pods/bound",
                            R"({"preconditions":{"uid":"nope"}})", "application/json"),
               409, "Conflict");
  WatchReader w(server_->port(), "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" +
                                     std::to_string(Rv()) + "&fieldSelector=metadata.name%3Dbound");
  r = cli_->Delete("/api/v1/namespaces/default/pods/bound", R"({"gracePeriodSeconds":1})",
                   "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  Json d = Json::parse(r->body);
  EXPECT_TRUE(d["metadata"].contains("deletionTimestamp"));
  EXPECT_EQ(d["metadata"]["deletionGracePeriodSeconds"], 1);
  EXPECT_EQ(d["metadata"]["generation"], 2);
  GetJson("/api/v1/namespaces/default/pods/bound", 200);  // still there during the grace
  // The built-in kubelet ends it as a kubelet does: DELETE with grace 0 (MODIFIED), DELETED.
  auto lines = w.WaitLines(3, 4000);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["type"], "MODIFIED");
  EXPECT_EQ(lines[1]["type"], "MODIFIED");
  EXPECT_EQ(lines[1]["object"]["metadata"]["deletionGracePeriodSeconds"], 0);
  EXPECT_EQ(lines[1]["object"]["metadata"]["generation"], 2);  // + 1 only the first time
  EXPECT_EQ(lines[2]["type"], "DELETED");
  GetJson("/api/v1/namespaces/default/pods/bound", 404);

  // DeleteOptions as query parameters, as kube-apiserver accepts them (simulate finding 5).
  CreatePod("forced", "n1");
  r = cli_->Delete(
      "/api/v1/namespaces/default/pods/forced?gracePeriodSeconds=0&propagationPolicy=Background");
  ASSERT_EQ(r->status, 200) << r->body;
  GetJson("/api/v1/namespaces/default/pods/forced", 404);  // gone at once despite its node
  CreatePod("graceful", "n1");
  r = cli_->Delete("/api/v1/namespaces/default/pods/graceful?gracePeriodSeconds=300");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Json::parse(r->body)["metadata"]["deletionGracePeriodSeconds"], 300);
  GetJson("/api/v1/namespaces/default/pods/graceful", 200);
  ExpectStatus(cli_->Delete("/api/v1/namespaces/default/pods/graceful?gracePeriodSeconds=soon"),
               400, "BadRequest");

  // A pod being deleted that turns terminal goes at once.
  CreatePod("job", "n1");
  cli_->Delete("/api/v1/namespaces/default/pods/job", R"({"gracePeriodSeconds":300})",
               "application/json");
  GetJson("/api/v1/namespaces/default/pods/job", 200);
  r = Patch("/api/v1/namespaces/default/pods/job/status", R"({"status":{"phase":"Succeeded"}})",
            "application/merge-patch+json");
  ASSERT_EQ(r->status, 200);
  GetJson("/api/v1/namespaces/default/pods/job", 404);
}

// §10.14: discovery, version, openapi, health.
TEST_F(ApisimTest, Discovery) {
  EXPECT_EQ(GetJson("/version")["minor"], "32");
  EXPECT_EQ(GetJson("/api")["versions"][0], "v1");
  Json apis = GetJson("/apis");
  std::vector<std::string> groups;
  for (const Json& g : apis["groups"]) {
    groups.push_back(g["name"]);
  }
  EXPECT_THAT(groups,
              ::testing::UnorderedElementsAre("coordination.k8s.io", "events.k8s.io", "policy"));
  Json v1 = GetJson("/api/v1");
  std::vector<std::string> names;
  for (const Json& r : v1["resources"]) {
    names.push_back(r["name"]);
  }
  EXPECT_THAT(names,
              ::testing::IsSupersetOf({"pods", "pods/status", "pods/binding", "nodes", "namespaces",
                                       "events", "configmaps", "resourcequotas"}));
  EXPECT_EQ(GetJson("/apis/coordination.k8s.io/v1")["resources"][0]["name"], "leases");
  Json idx = GetJson("/openapi/v3");
  std::string url = idx["paths"]["api/v1"]["serverRelativeURL"];
  Json doc = GetJson(url);
  Json patch = doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
  EXPECT_EQ(patch["x-kubernetes-group-version-kind"]["kind"], "Pod");
  EXPECT_EQ(patch["parameters"][0]["name"], "fieldValidation");
  for (const char* h : {"/healthz", "/readyz", "/livez"}) {
    auto r = cli_->Get(h);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "ok");
  }
  EXPECT_EQ(GetJson("/api/v1/namespaces")["items"].size(), 4u);
}

// kube-apiserver gzips a reply only when the client accepts gzip and the body is at least
// 128 KiB; small replies (every GET, PATCH and error a scheduler sends) and watches go out plain.
TEST_F(ApisimTest, OnlyLargeRepliesAreCompressed) {
  httplib::Client raw("127.0.0.1", server_->port());
  raw.set_decompress(false);
  const httplib::Headers gzip = {{"Accept-Encoding", "gzip, deflate, br"}};
  Json pod = CreatePod("small");
  auto got = raw.Get("/api/v1/namespaces/default/pods/small", gzip);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_FALSE(got->has_header("Content-Encoding")) << got->get_header_value("Content-Encoding");
  EXPECT_EQ(Json::parse(got->body)["metadata"]["uid"], pod["metadata"]["uid"]);
  auto patched = raw.Patch("/api/v1/namespaces/default/pods/small", gzip,
                           R"({"metadata":{"labels":{"a":"b"}}})", "application/merge-patch+json");
  ASSERT_TRUE(patched);
  EXPECT_EQ(patched->status, 200);
  EXPECT_FALSE(patched->has_header("Content-Encoding"));
  auto missing = raw.Get("/api/v1/namespaces/default/pods/nope", gzip);
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_FALSE(missing->has_header("Content-Encoding"));
  // An error httplib answers itself (through the error handler): a body over the limit.
  auto too_large = raw.Post("/api/v1/namespaces/default/pods", gzip,
                            std::string(4 * 1024 * 1024, ' '), "application/json");
  ASSERT_TRUE(too_large);
  EXPECT_EQ(too_large->status, 413);
  EXPECT_FALSE(too_large->has_header("Content-Encoding"));
  EXPECT_EQ(Json::parse(too_large->body)["reason"], "RequestEntityTooLarge");

  // A list of more than 128 KiB is compressed for a client that accepts gzip, and only then.
  const std::string labels = R"({"pad":")" + std::string(60, 'x') + R"("})";
  for (int i = 0; i < 400; ++i) {
    ASSERT_TRUE(server_->store()
                    .Create(*FindResource("", "v1", "pods"), "default",
                            PodJson("big-" + std::to_string(i), "", labels))
                    .ok());
  }
  auto list = raw.Get("/api/v1/pods", gzip);
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  EXPECT_EQ(list->get_header_value("Content-Encoding"), "gzip");
  auto plain = raw.Get("/api/v1/pods");
  ASSERT_TRUE(plain);
  EXPECT_FALSE(plain->has_header("Content-Encoding"));
  EXPECT_GE(plain->body.size(), 128u * 1024) << "the list must pass the threshold";
  EXPECT_LT(list->body.size(), plain->body.size());
}

// §10.16: leases keep MicroTime at six digits; events (both APIs); configmaps; quotas.
TEST_F(ApisimTest, LeasesEventsAndOthers) {
  auto r = Post("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
                R"({"metadata":{"name":"tessera"},"spec":{"holderIdentity":"a",)"
                R"("leaseDurationSeconds":15,"acquireTime":"2025-01-01T00:00:00Z",)"
                R"("renewTime":"2025-01-01T00:01:10.1234567Z","leaseTransitions":0}})");
  ASSERT_EQ(r->status, 201) << r->body;
  Json lease = Json::parse(r->body);
  EXPECT_EQ(lease["spec"]["acquireTime"], "2025-01-01T00:00:00.000000Z");
  EXPECT_EQ(lease["spec"]["renewTime"], "2025-01-01T00:01:10.123456Z");
  EXPECT_EQ(lease["apiVersion"], "coordination.k8s.io/v1");
  lease["spec"]["holderIdentity"] = "b";
  r = cli_->Put("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera", lease.dump(),
                "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  ExpectStatus(cli_->Put("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/tessera",
                         lease.dump(), "application/json"),
               409, "Conflict");
  r = Post("/api/v1/namespaces/default/events",
           R"({"metadata":{"name":"p.1"},"involvedObject":{"kind":"Pod","name":"p",)"
           R"("namespace":"default"},"reason":"FilteringFailed","type":"Warning","count":1})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(
      GetJson("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dp")["items"]
          .size(),
      1u);
  r = Post("/apis/events.k8s.io/v1/namespaces/default/events",
           R"({"metadata":{"name":"e.2"},"eventTime":"2025-01-01T00:00:00.000000Z",)"
           R"("reportingController":"tessera","reportingInstance":"x","action":"Bind",)"
           R"("reason":"Scheduled","type":"Normal"})");
  ASSERT_EQ(r->status, 201) << r->body;
  ExpectStatus(
      Post("/apis/events.k8s.io/v1/namespaces/default/events", R"({"metadata":{"name":"e.3"}})"),
      422, "Invalid");
  r = Post("/api/v1/namespaces/default/configmaps",
           R"({"metadata":{"name":"cm"},"data":{"k":"v"}})");
  ASSERT_EQ(r->status, 201) << r->body;
  ExpectStatus(Post("/api/v1/namespaces/default/configmaps",
                    R"({"metadata":{"name":"cm2"},"data":{"k":1}})"),
               400, "BadRequest");
  r = Post("/api/v1/namespaces/default/resourcequotas",
           R"({"metadata":{"name":"q"},"spec":{"hard":{"pods":"10"}}})");
  ASSERT_EQ(r->status, 201) << r->body;
  auto del = cli_->Delete("/api/v1/namespaces/default/configmaps/cm");
  ASSERT_EQ(del->status, 200);
  EXPECT_EQ(Json::parse(del->body)["status"], "Success");
}

// Found by running the conformance tests and a few requests against kube-apiserver v1.37.2
// (docs/apisim.md, "Checked against kube-apiserver"): of the kinds served here only pods get a
// metadata.generation; the others keep the one the client sent, and an update cannot change it.
// An invalid name is refused with the API server's words, example and regular expression.
TEST_F(ApisimTest, OnlyPodsHaveAGenerationAndNamesAreRefusedInTheServersWords) {
  auto r = Post("/api/v1/namespaces/default/configmaps", R"({"metadata":{"name":"plain"}})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_FALSE(Json::parse(r->body)["metadata"].contains("generation")) << r->body;
  r = Post("/api/v1/nodes", R"({"metadata":{"name":"n-gen"}})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_FALSE(Json::parse(r->body)["metadata"].contains("generation")) << r->body;
  r = Post("/api/v1/namespaces/default/configmaps", R"({"metadata":{"name":"g","generation":5}})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Json::parse(r->body)["metadata"]["generation"], 5);
  r = cli_->Put("/api/v1/namespaces/default/configmaps/g",
                R"({"metadata":{"name":"g","generation":7},"data":{"a":"b"}})", "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Json::parse(r->body)["metadata"]["generation"], 5);
  EXPECT_EQ(CreatePod("p")["metadata"]["generation"], 1);

  r = Post("/api/v1/namespaces/default/configmaps", R"({"metadata":{"name":"Bad_Name"}})");
  ExpectStatus(r, 422, "Invalid");
  EXPECT_EQ(Json::parse(r->body)["message"],
            "ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a "
            "lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character (e.g. "
            "'example.com', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')");
  r = Post("/api/v1/namespaces", R"({"metadata":{"name":"Bad_NS"}})");
  ExpectStatus(r, 422, "Invalid");
  EXPECT_EQ(Json::parse(r->body)["message"],
            "Namespace \"Bad_NS\" is invalid: metadata.name: Invalid value: \"Bad_NS\": a "
            "lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
            "'-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
            "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')");
  ExpectStatus(cli_->Get("/api/v1/namespaces/default/pods?limit=1&continue=garbage"), 400,
               "BadRequest");
  // A resource of a group is named with its group.
  r = cli_->Get("/apis/coordination.k8s.io/v1/namespaces/default/leases/nope");
  ExpectStatus(r, 404, "NotFound");
  EXPECT_EQ(Json::parse(r->body)["message"], "leases.coordination.k8s.io \"nope\" not found");

  // A List's items carry no kind and apiVersion; an object on its own starts with them, in
  // that order, whatever order the client wrote them in.
  r = Post(
      "/api/v1/namespaces/default/configmaps",
      R"({"data":{"k":"v"},"metadata":{"name":"order"},"apiVersion":"v1","kind":"ConfigMap"})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(
      r->body.rfind(R"({"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"order",)", 0), 0u)
      << r->body;
  Json list = GetJson("/api/v1/namespaces/default/configmaps");
  ASSERT_EQ(list["items"].size(), 3u);
  for (const Json& item : list["items"]) {
    EXPECT_FALSE(item.contains("kind")) << item.dump();
    EXPECT_FALSE(item.contains("apiVersion")) << item.dump();
    EXPECT_TRUE(item["metadata"].contains("name")) << item.dump();
  }
  EXPECT_EQ(list["kind"], "ConfigMapList");
  EXPECT_EQ(GetJson("/api/v1/namespaces/default/configmaps/order")["data"]["k"], "v");

  // A negative limit is no limit; one that is no number is refused as Go's parser words it.
  list = GetJson("/api/v1/namespaces/default/configmaps?limit=-1");
  EXPECT_EQ(list["items"].size(), 3u);
  EXPECT_FALSE(list["metadata"].contains("continue"));
  r = cli_->Get("/api/v1/namespaces/default/configmaps?limit=abc");
  ExpectStatus(r, 400, "BadRequest");
  EXPECT_EQ(Json::parse(r->body)["message"], "strconv.ParseInt: parsing \"abc\": invalid syntax");
}

// §10.18: fault injection.
TEST_F(ApisimTest, DroppedDeleteIsGoneForGood) {
  CreatePod("a");
  CreatePod("b");
  const std::string rv = std::to_string(Rv());
  auto f = cli_->Put("/simulator/v1/faults",
                     R"({"dropWatchEvents":[{"resource":"pods","type":"DELETED",)"
                     R"("probability":1.0,"count":1}]})",
                     "application/json");
  ASSERT_EQ(f->status, 200) << f->body;
  WatchReader w(server_->port(),
                "/api/v1/namespaces/default/pods?watch=true&resourceVersion=" + rv);
  cli_->Delete("/api/v1/namespaces/default/pods/a");  // DELETED dropped
  cli_->Delete("/api/v1/namespaces/default/pods/b");  // delivered (count exhausted)
  // Each deletion is MODIFIED (deletionTimestamp) then DELETED; only a's DELETED is lost.
  auto lines = w.WaitLines(3);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["type"], "MODIFIED");
  EXPECT_EQ(lines[0]["object"]["metadata"]["name"], "a");
  EXPECT_EQ(lines[1]["type"], "MODIFIED");
  EXPECT_EQ(lines[1]["object"]["metadata"]["name"], "b");
  EXPECT_EQ(lines[2]["type"], "DELETED");
  EXPECT_EQ(lines[2]["object"]["metadata"]["name"], "b");
  // Also lost for a watch that resumes from before the deletion.
  WatchReader resume(server_->port(),
                     "/api/v1/namespaces/default/pods?watch=true&"
                     "timeoutSeconds=1&resourceVersion=" +
                         rv);
  EXPECT_TRUE(resume.WaitDone(4000));
  ASSERT_EQ(resume.RawLines().size(), 3u);
  // Only a relist discovers it.
  EXPECT_EQ(GetJson("/api/v1/pods")["items"].size(), 0u);
  Json stats = GetJson("/simulator/v1/stats");
  EXPECT_EQ(stats["watchEventsDropped"], 1);
  ExpectStatus(cli_->Put("/simulator/v1/faults", R"({"bogus":1})", "application/json"), 400,
               "BadRequest");
}

// The rollback fault: POST /simulator/v1/snapshot, then /simulator/v1/restore puts the objects
// and the revision back as an etcd restore (and the API server's restart) does. Objects changed
// after the snapshot get their old state and a smaller resourceVersion, deleted ones come back
// with their uid, created ones are gone; open watches break; earlier revisions answer 410.
TEST_F(ApisimTest, RestoreRollsBackToTheSnapshot) {
  ExpectStatus(Post("/simulator/v1/restore", ""), 400, "BadRequest");  // no snapshot yet
  Json a = CreatePod("a");
  Json b = CreatePod("b");
  Json c = CreatePod("c");
  auto snap = Post("/simulator/v1/snapshot", "");
  ASSERT_EQ(snap->status, 200) << snap->body;
  const uint64_t at = Rv();
  EXPECT_EQ(Json::parse(snap->body)["snapshotRevision"], std::to_string(at));

  ASSERT_EQ(Patch("/api/v1/namespaces/default/pods/b", R"({"metadata":{"labels":{"x":"1"}}})",
                  "application/merge-patch+json")
                ->status,
            200);
  cli_->Delete("/api/v1/namespaces/default/pods/c");
  CreatePod("d");
  const uint64_t before = Rv();
  ASSERT_GT(before, at);
  WatchReader w(server_->port(),
                "/api/v1/pods?watch=true&resourceVersion=" + std::to_string(before));
  WaitWatches(1);

  // Bad requests change nothing.
  ExpectStatus(Post("/simulator/v1/restore", R"({"bogus":1})"), 400, "BadRequest");
  ExpectStatus(Post("/simulator/v1/restore", R"({"bumpRevision":-1})"), 400, "BadRequest");
  ExpectStatus(Post("/simulator/v1/restore", "[]"), 400, "BadRequest");
  EXPECT_EQ(Rv(), before);
  EXPECT_EQ(GetJson("/api/v1/pods")["items"].size(), 3u);  // a, b, d

  auto restored = Post("/simulator/v1/restore", "");
  ASSERT_EQ(restored->status, 200) << restored->body;
  EXPECT_EQ(Json::parse(restored->body)["resourceVersion"], std::to_string(at));
  EXPECT_EQ(Rv(), at);
  EXPECT_TRUE(w.WaitDone());
  EXPECT_FALSE(w.clean());  // the watch broke, as the API server's restart breaks it

  Json list = GetJson("/api/v1/namespaces/default/pods");
  EXPECT_EQ(list["metadata"]["resourceVersion"], std::to_string(at));
  ASSERT_EQ(list["items"].size(), 3u);
  const Json* want[] = {&a, &b, &c};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(list["items"][i]["metadata"]["name"], (*want[i])["metadata"]["name"]);
    EXPECT_EQ(list["items"][i]["metadata"]["uid"], (*want[i])["metadata"]["uid"]);
    EXPECT_EQ(list["items"][i]["metadata"]["resourceVersion"],
              (*want[i])["metadata"]["resourceVersion"]);
  }
  EXPECT_FALSE(list["items"][1]["metadata"]["labels"].contains("x"));
  // A watch from a revision before the restore's: 410, as from the new watch cache.
  {
    WatchReader old(server_->port(),
                    "/api/v1/pods?watch=true&resourceVersion=" + std::to_string(at - 1));
    auto lines = old.WaitLines(1);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["type"], "ERROR");
    EXPECT_EQ(lines[0]["object"]["code"], 410);
  }
  // Writes go on from the snapshot's revision: resourceVersions of the lost timeline come again.
  Json e = CreatePod("e");
  EXPECT_EQ(e["metadata"]["resourceVersion"], std::to_string(at + 1));

  // With bumpRevision (etcdutl --bump-revision) the counter jumps past every revision handed out.
  restored = Post("/simulator/v1/restore", R"({"bumpRevision":1000})");
  ASSERT_EQ(restored->status, 200) << restored->body;
  EXPECT_EQ(Rv(), at + 1000);
  EXPECT_EQ(GetJson("/api/v1/pods")["items"].size(), 3u);  // e is gone again
  EXPECT_EQ(CreatePod("f")["metadata"]["resourceVersion"], std::to_string(at + 1001));
  {
    WatchReader old(server_->port(),
                    "/api/v1/pods?watch=true&resourceVersion=" + std::to_string(before));
    auto lines = old.WaitLines(1);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["type"], "ERROR");
    EXPECT_EQ(lines[0]["object"]["code"], 410);
  }
}

TEST_F(ApisimTest, SeverPauseAndFailRequests) {
  WatchReader w(server_->port(), "/api/v1/pods?watch=true&resourceVersion=" + std::to_string(Rv()));
  WaitWatches(1);
  auto s = Post("/simulator/v1/sever-watches", "");
  ASSERT_EQ(s->status, 200);
  EXPECT_TRUE(w.WaitDone());
  EXPECT_FALSE(w.clean());  // broken, not a clean end

  cli_->Put("/simulator/v1/faults", R"({"pauseWatches":true})", "application/json");
  WatchReader p(server_->port(), "/api/v1/pods?watch=true&resourceVersion=" + std::to_string(Rv()));
  CreatePod("a");
  EXPECT_EQ(p.WaitLines(1, 500).size(), 0u);
  cli_->Put("/simulator/v1/faults", R"({"pauseWatches":false})", "application/json");
  EXPECT_EQ(p.WaitLines(1).size(), 1u);

  cli_->Put("/simulator/v1/faults",
            R"({"failRequests":{"probability":1.0,"code":429,"verbs":["list"]}})",
            "application/json");
  auto r = cli_->Get("/api/v1/pods");
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_THAT(r->get_header_value("Content-Type"), HasSubstr("text/plain"));
  GetJson("/api/v1/namespaces/default/pods/a", 200);  // get is not a failing verb
  cli_->Put("/simulator/v1/faults", R"({"failRequests":{"probability":1.0,"code":500}})",
            "application/json");
  r = Post("/api/v1/namespaces/default/pods", PodJson("b"));
  ExpectStatus(r, 500, "InternalError");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  cli_->Delete("/simulator/v1/faults");
  GetJson("/api/v1/pods", 200);
  EXPECT_EQ(GetJson("/api/v1/pods")["items"].size(), 1u);
}

TEST(ApisimAuthTest, TokenAndTls) {
  ServerOptions o;
  o.token = "s3cret";
  o.tls_self_signed = true;
  auto s = Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_THAT((*s)->url(), HasSubstr("https://127.0.0.1:"));
  const std::string ca_path =
      (std::filesystem::temp_directory_path() / ("apisim-ca-" + std::to_string(getpid()))).string();
  {
    FILE* f = std::fopen(ca_path.c_str(), "w");
    std::fputs((*s)->ca_pem().c_str(), f);
    std::fclose(f);
  }
  httplib::SSLClient cli("127.0.0.1", (*s)->port());
  cli.set_ca_cert_path(ca_path.c_str());
  cli.enable_server_certificate_verification(true);
  auto r = cli.Get("/api/v1/pods");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(Json::parse(r->body)["reason"], "Unauthorized");
  r = cli.Get("/healthz");
  EXPECT_EQ(r->status, 200);
  cli.set_bearer_token_auth("s3cret");
  r = cli.Get("/api/v1/pods");
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT((*s)->Kubeconfig(), HasSubstr("certificate-authority-data:"));
  EXPECT_THAT((*s)->Kubeconfig(), HasSubstr("token: s3cret"));
  std::filesystem::remove(ca_path);
}

TEST(ApisimStateTest, SaveAndLoadKeepRevision) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("apisim-state-" + std::to_string(getpid())))
          .string();
  std::filesystem::remove(path);
  uint64_t saved_rv = 0;
  {
    ServerOptions o;
    o.state_file = path;
    auto s = Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    httplib::Client cli("127.0.0.1", (*s)->port());
    ASSERT_EQ(cli.Post("/api/v1/namespaces/default/pods", PodJson("keep", "n1"), "application/json")
                  ->status,
              201);
    ASSERT_EQ(cli.Post("/simulator/v1/save", "", "application/json")->status, 200);
    saved_rv = (*s)->store().CurrentRevision();
  }
  ServerOptions o;
  o.state_file = path;
  auto s = Server::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GE((*s)->store().CurrentRevision(), saved_rv);
  httplib::Client cli("127.0.0.1", (*s)->port());
  auto r = cli.Get("/api/v1/namespaces/default/pods/keep");
  ASSERT_EQ(r->status, 200);
  auto c = cli.Post("/api/v1/namespaces/default/pods", PodJson("next"), "application/json");
  EXPECT_GT(std::stoull(Json::parse(c->body)["metadata"]["resourceVersion"].get<std::string>()),
            saved_rv);
  std::filesystem::remove(path);
}

// A client that vanishes mid-stream costs the server nothing: its watch ends at the next write.
TEST_F(ApisimTest, SurvivesAbruptClientDisconnect) {
  {
    WatchReader w(server_->port(),
                  "/api/v1/pods?watch=true&resourceVersion=" + std::to_string(Rv()));
    WaitWatches(1);
  }  // the client closes its socket without reading further
  int churn = 0;
  Eventually(  // each write reaches the dead watch's socket, which ends it
      [&] {
        if (GetJson("/simulator/v1/stats")["watchesOpen"] == 0) {
          return true;
        }
        CreatePod("churn-" + std::to_string(churn++));
        return false;
      },
      absl::Seconds(10), absl::Milliseconds(20));
  EXPECT_EQ(GetJson("/simulator/v1/stats")["watchesOpen"], 0);
  EXPECT_EQ(GetJson("/api/v1/namespaces")["kind"], "NamespaceList");
}

// 20 concurrent watchers each see every event, in order.
TEST_F(ApisimTest, ConcurrentWatchersSeeEveryEventInOrder) {
  const std::string rv = std::to_string(Rv());
  std::vector<std::unique_ptr<WatchReader>> readers;
  for (int i = 0; i < 20; ++i) {
    readers.push_back(std::make_unique<WatchReader>(
        server_->port(), "/api/v1/pods?watch=true&resourceVersion=" + rv));
  }
  std::thread writer([this] {
    httplib::Client c("127.0.0.1", server_->port());
    for (int i = 0; i < 100; ++i) {
      c.Post("/api/v1/namespaces/default/pods", PodJson("w" + std::to_string(i)),
             "application/json");
    }
  });
  writer.join();
  for (auto& r : readers) {
    auto lines = r->WaitLines(100, 10000);
    ASSERT_EQ(lines.size(), 100u);
    uint64_t last = 0;
    for (const Json& l : lines) {
      uint64_t v = std::stoull(l["object"]["metadata"]["resourceVersion"].get<std::string>());
      EXPECT_GT(v, last);
      last = v;
    }
  }
}

// The "default" namespace, which namespaced objects need, in a bare Store.
void CreateDefaultNamespace(Store& store) {
  const ResourceInfo* namespaces = FindResource("", "v1", "namespaces");
  ASSERT_NE(namespaces, nullptr);
  ASSERT_TRUE(store.Create(*namespaces, "", R"({"metadata":{"name":"default"}})", {}).ok());
}

// Concurrent patches of one object lose no update, and each is one revision. (Computing a
// patch outside the store's lock and publishing it onto a version it was not computed from
// would fail this.)
TEST(ApisimStoreTest, ConcurrentPatchesOfOneObjectLoseNoUpdate) {
  Store store;
  const ResourceInfo* pods = FindResource("", "v1", "pods");
  ASSERT_NE(pods, nullptr);
  ASSERT_NO_FATAL_FAILURE(CreateDefaultNamespace(store));
  absl::StatusOr<std::string> created = store.Create(*pods, "default", PodJson("a"), {});
  ASSERT_TRUE(created.ok()) << created.status();
  const uint64_t rv0 =
      std::stoull(Json::parse(*created)["metadata"]["resourceVersion"].get<std::string>());
  constexpr int kThreads = 4;
  constexpr int kPatches = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPatches; ++i) {
        const std::string body = R"({"metadata":{"annotations":{"t)" + std::to_string(t) + "-" +
                                 std::to_string(i) + R"(":"v"}}})";
        if (!store.Patch(*pods, "default", "a", "", PatchType::kMerge, body, {}).ok()) {
          failed.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(failed.load(), 0);
  absl::StatusOr<std::string> got = store.Get(*pods, "default", "a");
  ASSERT_TRUE(got.ok()) << got.status();
  const Json pod = Json::parse(*got);
  EXPECT_EQ(pod["metadata"]["annotations"].size(), static_cast<size_t>(kThreads * kPatches));
  EXPECT_EQ(std::stoull(pod["metadata"]["resourceVersion"].get<std::string>()),
            rv0 + kThreads * kPatches);
}

// A watcher blocked in Next() is woken by every kind of write as soon as the write is done,
// not when its wait times out: the store wakes watchers after unlocking, so a write path that
// forgot to would leave them asleep for the whole `max_wait` (30 s here). So is it by severing.
TEST(ApisimStoreTest, EveryWriteWakesABlockedWatcherAtOnce) {
  // Real time, whose reads tell when the watcher waits: Next reads the clock for its give-up
  // time, then again under the store's lock just before it waits, so a write (which takes that
  // lock) after the second read comes after the wait began.
  ReadingClock clock;
  Store store({}, &clock);
  const ResourceInfo* pods = FindResource("", "v1", "pods");
  ASSERT_NE(pods, nullptr);
  ASSERT_NO_FATAL_FAILURE(CreateDefaultNamespace(store));
  WatchOptions options;
  options.resource_version = std::to_string(store.CurrentRevision());
  absl::StatusOr<std::unique_ptr<WatchStream>> watch = store.Watch(*pods, "default", options);
  ASSERT_TRUE(watch.ok()) << watch.status();

  const std::vector<std::pair<std::string, std::function<absl::Status()>>> writes = {
      {"ADDED", [&] { return store.Create(*pods, "default", PodJson("a"), {}).status(); }},
      {"MODIFIED",
       [&] {
         return store
             .Patch(*pods, "default", "a", "", PatchType::kMerge,
                    R"({"metadata":{"annotations":{"k":"v"}}})", {})
             .status();
       }},
      {"MODIFIED",
       [&] {
         return store
             .Bind("default", "a",
                   R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"a"},)"
                   R"("target":{"kind":"Node","name":"n1"}})")
             .status();
       }},
      {"DELETED",
       [&] {
         return store.Delete(*pods, "default", "a", R"({"gracePeriodSeconds":0})", {}).status();
       }},
  };
  for (const auto& [type, write] : writes) {
    std::string out;
    WatchStream::Step step = WatchStream::Step::kIdle;
    const absl::Time start = absl::Now();
    clock.ForgetReads();
    std::thread watcher([&] { step = (*watch)->Next(&out, absl::Seconds(30)); });
    // The watcher blocks first (a write before it waits is seen without any wake-up).
    EXPECT_TRUE(clock.WaitForReads(watcher.get_id(), 2)) << type;
    ASSERT_TRUE(write().ok()) << type;
    watcher.join();
    EXPECT_EQ(step, WatchStream::Step::kData) << type;
    EXPECT_NE(out.find("\"type\":\"" + type + "\""), std::string::npos) << type << ": " << out;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << type << ": woken only by the timeout";
  }
  // Severing the watches wakes the watcher too, and ends its stream.
  std::string out;
  WatchStream::Step step = WatchStream::Step::kIdle;
  const absl::Time start = absl::Now();
  clock.ForgetReads();
  std::thread watcher([&] { step = (*watch)->Next(&out, absl::Seconds(30)); });
  EXPECT_TRUE(clock.WaitForReads(watcher.get_id(), 2));
  EXPECT_EQ(store.SeverWatches(), 1);
  watcher.join();
  EXPECT_EQ(step, WatchStream::Step::kAbort);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "severing woke it only by the timeout";
}

}  // namespace
}  // namespace tessera::apisim
