#include "tessera/kube/informer.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/decode.h"
#include "tessera/kube/store.h"
#include "tessera/testing/fake_transport.h"
#include "tessera/testing/wait.h"

namespace tessera::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string PodJson(std::string_view name, std::string_view uid, std::string_view rv,
                    std::string_view node = "") {
  return fmt::format(
      R"({{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{}","namespace":"default",)"
      R"("uid":"{}","resourceVersion":"{}"}},"spec":{{"nodeName":"{}"}},)"
      R"("status":{{"phase":"Running"}}}})",
      name, uid, rv, node);
}

std::string ListJson(const std::vector<std::string>& items, std::string_view rv,
                     std::string_view cont = "") {
  std::string joined;
  for (const std::string& item : items) {
    joined += joined.empty() ? "" : ",";
    joined += item;
  }
  std::string meta = fmt::format(R"("resourceVersion":"{}")", rv);
  if (!cont.empty()) {
    meta += fmt::format(R"(,"continue":"{}")", cont);
  }
  return fmt::format(R"({{"kind":"PodList","apiVersion":"v1","metadata":{{{}}},"items":[{}]}})",
                     meta, joined);
}

std::string Event(std::string_view type, const std::string& object) {
  return fmt::format(R"({{"type":"{}","object":{}}})", type, object) + "\n";
}

std::string Bookmark(std::string_view rv) {
  return Event("BOOKMARK",
               fmt::format(R"({{"kind":"Pod","apiVersion":"v1","metadata":{{"resourceVersion":)"
                           R"("{}"}}}})",
                           rv));
}

std::string StatusJson(int code, std::string_view reason, std::string_view message) {
  return fmt::format(R"({{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure",)"
                     R"("message":"{}","reason":"{}","code":{}}})",
                     message, reason, code);
}

Response Http(int code, std::string body) {
  Response r;
  r.status_code = code;
  r.body = std::move(body);
  return r;
}

// Records handler calls as strings, e.g. "add default/a 1 initial", "update default/a 1->2",
// "delete default/a 2 tombstone".
class Recorder {
 public:
  EventHandlers<Pod> Handlers() {
    EventHandlers<Pod> h;
    h.on_add = [this](const Pod& p, bool initial) {
      Push(fmt::format("add {} {}{}", p.Key(), p.meta.resource_version, initial ? " initial" : ""));
    };
    h.on_update = [this](const Pod& o, const Pod& n) {
      Push(fmt::format("update {} {}->{}", n.Key(), o.meta.resource_version,
                       n.meta.resource_version));
    };
    h.on_delete = [this](const Pod& p, bool unknown) {
      Push(fmt::format("delete {} {}{}", p.Key(), p.meta.resource_version,
                       unknown ? " tombstone" : ""));
    };
    return h;
  }
  void Push(std::string s) {
    MutexLock lock(&mu_);
    calls_.push_back(std::move(s));
  }
  std::vector<std::string> Take() {
    MutexLock lock(&mu_);
    return std::exchange(calls_, {});
  }
  size_t size() {
    MutexLock lock(&mu_);
    return calls_.size();
  }
  // Waits (real time) for at least n recorded calls.
  bool WaitFor(size_t n) {
    return ::tessera::testing::Eventually([&] { return size() >= n; });
  }

 private:
  Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

using ::tessera::testing::Eventually;

class InformerTest : public ::testing::Test {
 protected:
  void Make(absl::Duration resync = absl::ZeroDuration()) {
    PodInformer::Options opts;
    opts.name = "test-pods";
    opts.clock = &clock_;
    opts.resync_period = resync;
    opts.reflector.backoff.jitter = 0;  // exact delays
    opts.reflector.field_selector = "status.phase!=Succeeded";
    opts.reflector.page_size = 2;
    informer_ = std::make_unique<PodInformer>(&client_, opts, rec_.Handlers());
    informer_->Start();
  }

  // Answers the next LIST and checks its path.
  void ReplyList(std::string_view expect_query_part, const std::string& body, int code = 200) {
    ASSERT_TRUE(fake_.WaitForPending(1));
    EXPECT_THAT(fake_.pending()[0].path, HasSubstr(expect_query_part));
    ASSERT_TRUE(fake_.Reply(Http(code, body)));
  }

  // Waits for watch number `n` (1-based) and opens it.
  StreamId OpenWatch(size_t n) {
    StreamId id = fake_.WaitForStream(n - 1);
    EXPECT_NE(id, 0u);
    if (id != 0) {
      EXPECT_TRUE(fake_.StreamOpen(id));
    }
    return id;
  }

  std::string WatchPath(StreamId id) { return fake_.stream_request(id)->path; }

  void Advance(absl::Duration d) {
    clock_.Advance(d);
    informer_->Wake();
  }

  // Waits until the worker has looked at the clock as it is now, after everything queued
  // before: what was due by now has been done, so what has not happened is not due.
  void Settle() {
    auto looked = std::make_shared<std::atomic<bool>>(false);
    informer_->Wake([looked] { looked->store(true); });
    ASSERT_TRUE(Eventually([&] { return looked->load(); }));
  }

  FakeClock clock_;
  FakeTransport fake_;
  ApiClient client_{&fake_};
  Recorder rec_;
  std::unique_ptr<PodInformer> informer_;
};

TEST_F(InformerTest, PagedListThenWatchFromListRv) {
  Make();
  EXPECT_FALSE(informer_->HasSynced());
  ReplyList("limit=2&resourceVersion=0",
            ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "10", "tok1"));
  // Later pages carry the token and no resourceVersion.
  ASSERT_TRUE(fake_.WaitForPending(1));
  EXPECT_EQ(fake_.pending()[0].path,
            "/api/v1/pods?continue=tok1&fieldSelector=status.phase%21%3DSucceeded&limit=2");
  EXPECT_FALSE(informer_->HasSynced());
  ASSERT_TRUE(fake_.Reply(Http(200, ListJson({PodJson("c", "uc", "7", "n1")}, "10"))));
  ASSERT_TRUE(informer_->WaitForSync(absl::Seconds(5)));
  EXPECT_THAT(rec_.Take(), ElementsAre("add default/a 5 initial", "add default/b 6 initial",
                                       "add default/c 7 initial"));
  StreamId w = OpenWatch(1);
  const std::string path = WatchPath(w);
  EXPECT_THAT(path, HasSubstr("allowWatchBookmarks=true"));
  EXPECT_THAT(path, HasSubstr("fieldSelector=status.phase%21%3DSucceeded"));
  EXPECT_THAT(path, HasSubstr("resourceVersion=10&timeoutSeconds="));
  EXPECT_THAT(path, HasSubstr("watch=true"));
  const int timeout = std::stoi(path.substr(path.find("timeoutSeconds=") + 15));
  EXPECT_GE(timeout, 300);
  EXPECT_LT(timeout, 600);
  EXPECT_EQ(informer_->store().size(), 3u);
  ASSERT_EQ(informer_->store().ListByNode("n1").size(), 1u);
  EXPECT_EQ(informer_->counters().reflector.lists, 1);
  EXPECT_EQ(informer_->counters().reflector.list_pages, 2);
}

// Reconcile with a LIST older than what the watch has delivered: it repairs exactly what the
// list proves (missing, stale — a new uid included — and gone at or below the list's revision),
// skips undecidable resourceVersions, and never re-adds a pod the watch deleted or removes one
// the watch added after the list.
TEST_F(InformerTest, ReconcileRepairsOnlyWhatTheListProvesAndNeverUndoesTheWatch) {
  Make();
  ReplyList("limit=2",
            ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6"), PodJson("c", "uc", "7"),
                      PodJson("f", "uf", "4"), PodJson("g", "ug1", "3"), PodJson("x", "ux", "abc")},
                     "10"));
  ASSERT_TRUE(informer_->WaitForSync(absl::Seconds(5)));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(
      w, Event("DELETED", PodJson("b", "ub", "11")) + Event("ADDED", PodJson("d", "ud", "12"))));
  ASSERT_TRUE(rec_.WaitFor(6 + 2));
  rec_.Take();

  std::vector<Pod> listed;
  for (const std::string& json :
       {PodJson("a", "ua", "5"), PodJson("b", "ub", "6"), PodJson("c", "uc", "8"),
        PodJson("e", "ue", "9"), PodJson("g", "ug2", "9"), PodJson("x", "ux", "abd")}) {
    absl::StatusOr<Pod> pod = DecodePod(json);
    ASSERT_TRUE(pod.ok()) << pod.status();
    listed.push_back(*std::move(pod));
  }
  Mutex mu;
  std::optional<ReconcileResult> result;
  informer_->Reconcile(std::move(listed), "9", [&](ReconcileResult r) {
    MutexLock lock(&mu);
    result = std::move(r);
  });
  ASSERT_TRUE(Eventually([&] {
    MutexLock lock(&mu);
    return result.has_value();
  }));
  MutexLock lock(&mu);
  EXPECT_TRUE(result->ran);
  EXPECT_EQ(result->listed, 6u);
  EXPECT_EQ(result->missing, 1);    // e
  EXPECT_EQ(result->stale, 2);      // c 7→8, g recreated (ug1 → ug2)
  EXPECT_EQ(result->gone, 1);       // f (rv 4 <= 9); d (rv 12) stays
  EXPECT_EQ(result->undecided, 1);  // x
  EXPECT_THAT(rec_.Take(), ElementsAre("update default/c 7->8", "add default/e 9",
                                       "update default/g 3->9", "delete default/f 4 tombstone"));
  EXPECT_EQ(informer_->store().Get("default/b"), nullptr);
  EXPECT_NE(informer_->store().Get("default/d"), nullptr);
  EXPECT_EQ(informer_->store().Get("default/g")->meta.uid, "ug2");
  EXPECT_EQ(informer_->store().Get("default/x")->meta.resource_version, "abc");
  EXPECT_EQ(informer_->counters().reconciles, 1);
  EXPECT_EQ(informer_->counters().reconcile_gone, 1);
}

TEST_F(InformerTest, ExpiredContinueFallsBackToFullList) {
  Make();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "10", "t"));
  ReplyList("continue=t", StatusJson(410, "Expired", "The provided continue parameter is too old"),
            410);
  // One unpaged list at the original RV.
  ASSERT_TRUE(fake_.WaitForPending(1));
  EXPECT_EQ(fake_.pending()[0].path,
            "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded&resourceVersion=0");
  ASSERT_TRUE(fake_.Reply(Http(
      200, ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6"), PodJson("c", "uc", "8")},
                    "12"))));
  ASSERT_TRUE(informer_->WaitForSync(absl::Seconds(5)));
  EXPECT_EQ(rec_.Take().size(), 3u);  // no duplicates from the abandoned first page
  StreamId w = OpenWatch(1);
  EXPECT_THAT(WatchPath(w), HasSubstr("resourceVersion=12&"));
  EXPECT_EQ(informer_->counters().reflector.continue_expired, 1);
}

TEST_F(InformerTest, EventsInOrderAndNormalCloseResumesFromLastRv) {
  Make();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5")}, "10"));
  StreamId w = OpenWatch(1);
  // One event split across chunks, then more in one chunk.
  std::string added = Event("ADDED", PodJson("b", "ub", "11"));
  ASSERT_TRUE(fake_.StreamData(w, added.substr(0, 20)));
  ASSERT_TRUE(fake_.StreamData(w, added.substr(20)));
  ASSERT_TRUE(fake_.StreamData(w, Event("MODIFIED", PodJson("a", "ua", "12", "n2")) +
                                      Event("DELETED", PodJson("b", "ub", "13")) +
                                      Event("MODIFIED", PodJson("z", "uz", "14"))));
  ASSERT_TRUE(rec_.WaitFor(5));
  EXPECT_THAT(rec_.Take(),
              ElementsAre("add default/a 5 initial", "add default/b 11", "update default/a 5->12",
                          "delete default/b 13", "add default/z 14"));
  EXPECT_EQ(informer_->store().ListByNode("n2").size(), 1u);
  EXPECT_EQ(informer_->store().Get("default/b"), nullptr);
  Advance(absl::Seconds(300));
  ASSERT_TRUE(fake_.StreamClose(w, absl::OkStatus()));
  StreamId w2 = OpenWatch(2);
  EXPECT_THAT(WatchPath(w2), HasSubstr("resourceVersion=14&"));
  EXPECT_EQ(fake_.requests().size(), 3u);  // list, watch, watch: no relist
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_restarts == 1; }));
  EXPECT_EQ(informer_->counters().reflector.events, 4);
}

TEST_F(InformerTest, BookmarkAdvancesResourceVersionWithoutDelivery) {
  Make();
  ReplyList("limit=2", ListJson({}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Bookmark("50")));
  ASSERT_TRUE(Eventually([&] { return informer_->counters().reflector.bookmarks == 1; }));
  EXPECT_EQ(rec_.size(), 0u);
  ASSERT_TRUE(fake_.StreamClose(w, absl::OkStatus()));  // a bookmark is not an "event": short
  // A very short watch (under 1 s, no events) is an error: relist after backoff.
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_errors == 1; }));
  Advance(absl::Milliseconds(800));
  ReplyList("resourceVersion=50", ListJson({}, "51"));
  StreamId w2 = OpenWatch(2);
  EXPECT_THAT(WatchPath(w2), HasSubstr("resourceVersion=51&"));
}

TEST_F(InformerTest, RelistAfter410DeliversTombstonesExactlyOnce) {
  Make();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6", "n1")}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Event("ADDED", PodJson("c", "uc", "11"))));
  ASSERT_TRUE(rec_.WaitFor(3));
  rec_.Take();
  // The watch falls behind compaction: ERROR 410, then the server ends the stream.
  ASSERT_TRUE(fake_.StreamData(
      w, Event("ERROR", StatusJson(410, "Expired", "too old resource version: 11 (20)"))));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w); }));
  fake_.DeliverCancellations();
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_errors == 1; }));
  // The server answered: the first 410 relists at once, without backoff, at the last RV
  // (unpaged); too old as well → at once with RV "" (paged again).
  EXPECT_EQ(informer_->counters().reflector.last_backoff, absl::ZeroDuration());
  ReplyList("resourceVersion=11", StatusJson(410, "Expired", "too old"), 410);
  ASSERT_TRUE(fake_.WaitForPending(1));
  EXPECT_EQ(fake_.pending()[0].path,
            "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded&limit=2");
  // b and c were deleted during the gap; a was deleted and re-created under a new uid.
  ASSERT_TRUE(fake_.Reply(Http(200, ListJson({PodJson("a", "ua2", "30")}, "31"))));
  ASSERT_TRUE(rec_.WaitFor(3));
  EXPECT_THAT(rec_.Take(), ElementsAre("delete default/b 6 tombstone",
                                       "delete default/c 11 tombstone", "update default/a 5->30"));
  EXPECT_EQ(informer_->store().size(), 1u);
  EXPECT_EQ(informer_->store().GetByUid("ua"), nullptr);
  EXPECT_NE(informer_->store().GetByUid("ua2"), nullptr);
  EXPECT_TRUE(informer_->store().ListByNode("n1").empty());
  EXPECT_EQ(informer_->counters().tombstones, 2);
  // A second relist with the same content delivers no tombstone again.
  StreamId w2 = OpenWatch(2);
  ASSERT_TRUE(fake_.StreamClose(w2, absl::OutOfRangeError("HTTP 410")));
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_errors == 2; }));
  // A second 410 within immediate_relist_interval (10 s) waits for the backoff.
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(800); }));
  Settle();
  EXPECT_EQ(fake_.pending().size(), 0u);
  Advance(absl::Seconds(2));
  ReplyList("resourceVersion=31", ListJson({PodJson("a", "ua2", "30")}, "40"));
  OpenWatch(3);
  ASSERT_TRUE(rec_.WaitFor(1));
  EXPECT_THAT(rec_.Take(), ElementsAre("update default/a 30->30"));
  EXPECT_EQ(informer_->counters().tombstones, 2);
  EXPECT_EQ(informer_->counters().reflector.relists, 2);
}

TEST_F(InformerTest, ErrorEventOtherThan410Relists) {
  Make();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5")}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Event("ERROR", StatusJson(500, "InternalError", "boom"))));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w); }));
  fake_.DeliverCancellations();
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_errors == 1; }));
  Advance(absl::Milliseconds(800));
  ReplyList("resourceVersion=10", ListJson({PodJson("a", "ua", "5")}, "12"));
  OpenWatch(2);
  EXPECT_EQ(informer_->counters().reflector.relists, 1);
}

TEST_F(InformerTest, TooLargeResourceVersionRelistsFromLatest) {
  Make();
  ReplyList("resourceVersion=0", StatusJson(504, "Timeout", "Too large resource version: 9"), 504);
  // At once, without backoff, a consistent LIST of the latest state (paged); a 504 on that one
  // backs off.
  ASSERT_TRUE(fake_.WaitForPending(1));
  EXPECT_EQ(fake_.pending()[0].path,
            "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded&limit=2");
  ReplyList("limit=2", StatusJson(504, "Timeout", "Too large resource version: 9"), 504);
  // (last_backoff is set once the retry time is fixed, so the clock may move after it.)
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(800); }));
  EXPECT_EQ(informer_->counters().reflector.list_errors, 2);
  Advance(absl::Milliseconds(800));
  ReplyList("resourceVersion=0", ListJson({}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Event("ERROR", StatusJson(410, "Expired", "too old"))));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w); }));
  fake_.DeliverCancellations();
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_errors == 1; }));
  Advance(absl::Seconds(2));
  ReplyList("resourceVersion=10", StatusJson(504, "Timeout", "Too large resource version"), 504);
  ASSERT_TRUE(fake_.WaitForPending(1));
  EXPECT_EQ(fake_.pending()[0].path,
            "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded&limit=2");
}

// Issue 41 finding 4: after an etcd restore the API server's revision is below the last one the
// watch saw, and it answers a watch from there 504 "Too large resource version" (as an HTTP 504
// or an ERROR event) once its 3 s wait is over. Watching again from there would fail forever: it
// relists, from the latest state (resourceVersion ""), and that list replaces the store even
// where resourceVersions went backwards.
TEST_F(InformerTest, AWatchFromAResourceVersionTooLargeRelistsFromTheLatest) {
  Make();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Event("MODIFIED", PodJson("a", "ua", "15")) +
                                      Event("DELETED", PodJson("b", "ub", "16")) +
                                      Event("ADDED", PodJson("c", "uc", "17"))));
  ASSERT_TRUE(rec_.WaitFor(2 + 3));
  rec_.Take();
  // The API server restarts on the restored storage (revision 6): the stream breaks, and the
  // watch from 17 waits 3 s, then ends with 504.
  ASSERT_TRUE(fake_.StreamClose(w, absl::UnavailableError("connection reset")));
  StreamId w2 = OpenWatch(2);
  EXPECT_THAT(WatchPath(w2), HasSubstr("resourceVersion=17&"));
  Advance(absl::Seconds(3));
  ASSERT_TRUE(fake_.StreamFailHttp(
      w2, Http(504, StatusJson(504, "Timeout", "Too large resource version: 17, current: 6"))));
  // A consistent LIST of the latest state, paged, at once.
  ASSERT_TRUE(fake_.WaitForPending(1));
  EXPECT_EQ(fake_.pending()[0].path,
            "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded&limit=2");
  ASSERT_TRUE(
      fake_.Reply(Http(200, ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "6"))));
  StreamId w3 = OpenWatch(3);
  EXPECT_THAT(WatchPath(w3), HasSubstr("resourceVersion=6&"));
  EXPECT_THAT(rec_.Take(), ElementsAre("delete default/c 17 tombstone", "update default/a 15->5",
                                       "add default/b 6"));
  EXPECT_EQ(informer_->store().Get("default/a")->meta.resource_version, "5");
  EXPECT_EQ(informer_->store().Get("default/b")->meta.uid, "ub");
  EXPECT_EQ(informer_->store().Get("default/c"), nullptr);
  EXPECT_EQ(informer_->counters().reflector.rollbacks, 1);

  // The same 504 as the watch's ERROR event (kube-apiserver's watch cache sends it so), 10 s
  // later (one immediate relist per immediate_relist_interval).
  Advance(absl::Seconds(10));
  ASSERT_TRUE(fake_.StreamData(w3, Event("ADDED", PodJson("d", "ud", "9"))));
  ASSERT_TRUE(rec_.WaitFor(1));
  ASSERT_TRUE(fake_.StreamClose(w3, absl::UnavailableError("connection reset")));
  StreamId w4 = OpenWatch(4);
  ASSERT_TRUE(fake_.StreamData(
      w4, Event("ERROR", StatusJson(504, "Timeout", "Too large resource version: 9"))));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w4); }));
  fake_.DeliverCancellations();
  ASSERT_TRUE(fake_.WaitForPending(1));
  EXPECT_EQ(fake_.pending()[0].path,
            "/api/v1/pods?fieldSelector=status.phase%21%3DSucceeded&limit=2");
}

// A Reconcile whose list proves that the API server went back in time — an object of the same
// uid at a smaller resourceVersion than the stored one although the list is not older, a pod
// the watch saw deleted listed again, or a list older than what the informer had seen before it
// was taken — repairs nothing by resourceVersion rules (they would keep the lost timeline's
// objects) but relists, and the relist replaces the store.
TEST_F(InformerTest, AReconcileThatSeesARollbackRelists) {
  Make();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Event("MODIFIED", PodJson("a", "ua", "12", "n1")) +
                                      Event("DELETED", PodJson("b", "ub", "13")) +
                                      Event("ADDED", PodJson("c", "uc", "14", "n1"))));
  ASSERT_TRUE(rec_.WaitFor(2 + 3));
  rec_.Take();
  auto decode = [](const std::vector<std::string>& jsons) {
    std::vector<Pod> pods;
    for (const std::string& json : jsons) {
      pods.push_back(*DecodePod(json));
    }
    return pods;
  };
  auto reconcile = [&](std::vector<Pod> listed, std::string rv, std::string seen) {
    Mutex mu;
    std::optional<ReconcileResult> result;
    informer_->Reconcile(std::move(listed), std::move(rv), std::move(seen), [&](ReconcileResult r) {
      MutexLock lock(&mu);
      result = std::move(r);
    });
    EXPECT_TRUE(Eventually([&] {
      MutexLock lock(&mu);
      return result.has_value();
    }));
    MutexLock lock(&mu);
    return result.value_or(ReconcileResult{});
  };
  // The restored server went on past the watch's revision: list at 20 with a at 5 and b back.
  ReconcileResult r =
      reconcile(decode({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}), "20", "14");
  EXPECT_TRUE(r.ran);
  EXPECT_TRUE(r.rolled_back);
  EXPECT_EQ(r.missing + r.stale + r.gone, 0);
  EXPECT_THAT(r.details, ElementsAre(HasSubstr("rollback default/a uid=ua rv=12->5")));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w); }));
  fake_.DeliverCancellations();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "20"));
  StreamId w2 = OpenWatch(2);
  EXPECT_THAT(WatchPath(w2), HasSubstr("resourceVersion=20&"));
  EXPECT_THAT(rec_.Take(), ElementsAre("delete default/c 14 tombstone", "update default/a 12->5",
                                       "add default/b 6"));
  EXPECT_TRUE(informer_->store().ListByNode("n1").empty());

  // A pod the watch deleted, listed again by a list not older than its deletion.
  ASSERT_TRUE(fake_.StreamData(w2, Event("DELETED", PodJson("b", "ub", "21"))));
  ASSERT_TRUE(rec_.WaitFor(1));
  rec_.Take();
  r = reconcile(decode({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}), "22", "21");
  EXPECT_TRUE(r.rolled_back);
  EXPECT_THAT(r.details, ElementsAre(HasSubstr("rollback default/b uid=ub")));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w2); }));
  fake_.DeliverCancellations();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "22"));
  StreamId w3 = OpenWatch(3);
  EXPECT_THAT(rec_.Take(), ElementsAre("update default/a 5->5", "add default/b 6"));

  // A list older than the revision the informer had seen before it was taken (the restored
  // server is still behind): nothing the list holds says so, the revisions do.
  ASSERT_TRUE(fake_.StreamData(w3, Event("ADDED", PodJson("e", "ue", "30"))));
  ASSERT_TRUE(rec_.WaitFor(1));
  rec_.Take();
  r = reconcile(decode({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}), "7", "30");
  EXPECT_TRUE(r.rolled_back);
  EXPECT_THAT(r.details, ElementsAre(HasSubstr("list rv=7 < seen rv=30")));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w3); }));
  fake_.DeliverCancellations();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "7"));
  OpenWatch(4);
  EXPECT_EQ(informer_->store().Get("default/e"), nullptr);
  EXPECT_EQ(informer_->counters().reconcile_rollbacks, 3);

  // Without the revision seen before the list (""), an ordinary older list is no rollback and
  // removes nothing newer than itself (b, rv 6).
  r = reconcile(decode({PodJson("a", "ua", "5")}), "5", "");
  EXPECT_TRUE(r.ran);
  EXPECT_FALSE(r.rolled_back);
  EXPECT_EQ(r.missing + r.stale + r.gone, 0);
  EXPECT_NE(informer_->store().Get("default/b"), nullptr);
}

TEST_F(InformerTest, UndecodableEventRelists) {
  Make();
  ReplyList("limit=2", ListJson({}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, R"({"type":"ADDED","object":{"kind":"Node"}})"));
  EXPECT_TRUE(Eventually([&] { return fake_.cancel_requested(w); }));
  fake_.DeliverCancellations();
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_errors == 1; }));
  EXPECT_EQ(informer_->counters().reflector.last_error.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(InformerTest, ACutStreamRewatchesAtOnceAndAFailingWatchBacksOff) {
  Make();
  ReplyList("limit=2", ListJson({}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Event("ADDED", PodJson("a", "ua", "11"))));
  // A running stream cut: the next WATCH goes out at once, from the last RV, without a relist.
  ASSERT_TRUE(fake_.StreamClose(w, absl::UnavailableError("connection reset")));
  StreamId w2 = OpenWatch(2);
  EXPECT_THAT(WatchPath(w2), HasSubstr("resourceVersion=11&"));
  EXPECT_EQ(informer_->counters().reflector.watch_errors, 1);
  EXPECT_EQ(informer_->counters().reflector.last_backoff, absl::ZeroDuration());
  // That WATCH fails at once (the server is gone): now it backs off.
  ASSERT_TRUE(fake_.StreamClose(w2, absl::UnavailableError("connection refused")));
  EXPECT_TRUE(Eventually([&] { return informer_->counters().reflector.watch_errors == 2; }));
  EXPECT_EQ(informer_->counters().reflector.last_backoff, absl::Milliseconds(800));
  Settle();
  EXPECT_EQ(fake_.requests().size(), 3u);  // list, watch, watch: nothing before the backoff
  Advance(absl::Milliseconds(800));
  StreamId w3 = OpenWatch(3);
  EXPECT_THAT(WatchPath(w3), HasSubstr("resourceVersion=11&"));
  EXPECT_EQ(informer_->counters().reflector.relists, 0);
}

// Even when earlier failures grew the backoff: a stream that ran rewatches at once
// (docs/simulate.md finding 6: a 12.8 s wait after a cut, with the server answering).
TEST_F(InformerTest, ACutStreamDoesNotWaitOutABackoffGrownBefore) {
  Make();
  ReplyList("resourceVersion=0", "internal", 500);
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(800); }));
  Advance(absl::Milliseconds(800));
  ReplyList("resourceVersion=0", "internal", 500);
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(1600); }));
  Advance(absl::Milliseconds(1600));
  ReplyList("resourceVersion=0", ListJson({}, "10"));
  StreamId w = OpenWatch(1);
  Advance(absl::Seconds(5));  // open for 5 s, no event
  ASSERT_TRUE(fake_.StreamClose(w, absl::UnavailableError("connection reset")));
  StreamId w2 = OpenWatch(2);
  EXPECT_THAT(WatchPath(w2), HasSubstr("resourceVersion=10&"));
  EXPECT_EQ(informer_->counters().reflector.last_backoff, absl::ZeroDuration());
}

TEST_F(InformerTest, ListErrorsBackOffExponentiallyAndResetAfterHealth) {
  Make();
  ReplyList("resourceVersion=0", "internal", 500);
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(800); }));
  Settle();
  EXPECT_TRUE(fake_.pending().empty());
  Advance(absl::Milliseconds(799));
  Settle();
  EXPECT_TRUE(fake_.pending().empty());
  Advance(absl::Milliseconds(1));
  ReplyList("resourceVersion=0", StatusJson(503, "ServiceUnavailable", "later"), 503);
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(1600); }));
  EXPECT_THAT(std::string(informer_->counters().reflector.last_error.message()),
              HasSubstr("later (HTTP 503"));
  Advance(absl::Milliseconds(1600));
  ReplyList("resourceVersion=0", "x", 500);
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(3200); }));
  // Two healthy minutes later the backoff starts again from its initial delay.
  Advance(absl::Seconds(3.2));
  ReplyList("resourceVersion=0", ListJson({}, "10"));
  StreamId w = OpenWatch(1);
  Advance(absl::Minutes(3));
  ASSERT_TRUE(fake_.StreamClose(w, absl::UnavailableError("reset")));
  StreamId w2 = OpenWatch(2);  // the stream ran: at once
  ASSERT_TRUE(fake_.StreamClose(w2, absl::UnavailableError("refused")));
  EXPECT_TRUE(Eventually(
      [&] { return informer_->counters().reflector.last_backoff == absl::Milliseconds(800); }));
  EXPECT_EQ(informer_->counters().reflector.list_errors, 3);
  EXPECT_FALSE(informer_->counters().reflector.last_error.ok());
}

TEST_F(InformerTest, ResyncRedeliversCachedObjectsAsUpdates) {
  Make(absl::Minutes(10));
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5"), PodJson("b", "ub", "6")}, "10"));
  OpenWatch(1);
  ASSERT_TRUE(rec_.WaitFor(2));
  rec_.Take();
  Advance(absl::Minutes(9));
  Settle();
  EXPECT_EQ(rec_.size(), 0u);
  Advance(absl::Minutes(1));
  ASSERT_TRUE(rec_.WaitFor(2));
  EXPECT_THAT(rec_.Take(), ElementsAre("update default/a 5->5", "update default/b 6->6"));
  EXPECT_EQ(informer_->counters().resyncs, 1);
  EXPECT_EQ(fake_.requests().size(), 2u);  // a resync sends nothing
}

TEST_F(InformerTest, StopJoinsAndDropsLateCallbacks) {
  Make();
  ReplyList("limit=2", ListJson({}, "10"));
  StreamId w = OpenWatch(1);
  informer_->Stop();
  EXPECT_TRUE(fake_.cancel_requested(w));
  EXPECT_FALSE(fake_.StreamData(w, Event("ADDED", PodJson("a", "ua", "11"))));
  informer_.reset();
  EXPECT_EQ(rec_.size(), 0u);
}

// Wake(then) runs `then` on the worker after what was queued before it; after Stop it is
// destroyed unrun.
TEST_F(InformerTest, WakeThenRunsAfterEarlierDeliveriesAndNeverAfterStop) {
  Make();
  ReplyList("limit=2", ListJson({PodJson("a", "ua", "5")}, "10"));
  StreamId w = OpenWatch(1);
  ASSERT_TRUE(fake_.StreamData(w, Event("ADDED", PodJson("b", "ub", "11"))));
  std::atomic<size_t> seen{0};
  informer_->Wake([&] { seen.store(rec_.size()); });
  ASSERT_TRUE(Eventually([&] { return seen.load() > 0; }));
  EXPECT_EQ(seen.load(), 2u);  // the list's add and the event's
  informer_->Stop();
  auto token = std::make_shared<int>(0);
  informer_->Wake([token, &seen] { seen.store(0); });
  EXPECT_EQ(token.use_count(), 1);
  EXPECT_EQ(seen.load(), 2u);
}

// The store is read by other threads while the worker applies events (TSan checks this test).
TEST_F(InformerTest, ConcurrentReadersWhileEventsApply) {
  Make();
  ReplyList("limit=2", ListJson({}, "1"));
  StreamId w = OpenWatch(1);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      for (const auto& p : informer_->store().ListByNode("n")) {
        EXPECT_EQ(p->node_name, "n");
      }
      (void)informer_->store().GetByUid("u7");
      (void)informer_->counters();
    }
  });
  constexpr int kEvents = 500;
  for (int i = 0; i < kEvents; ++i) {
    const std::string name = fmt::format("p{}", i % 50);
    const std::string uid = fmt::format("u{}", i % 50);
    const std::string rv = std::to_string(i + 2);
    ASSERT_TRUE(fake_.StreamData(
        w, Event(i % 7 == 6 ? "DELETED" : "MODIFIED", PodJson(name, uid, rv, "n"))));
  }
  ASSERT_TRUE(Eventually([&] { return informer_->counters().reflector.events == kEvents; }));
  done.store(true);
  reader.join();
  // The store equals the result of applying the events in order.
  size_t expected = 0;
  for (int k = 0; k < 50; ++k) {
    int last = -1;
    for (int i = k; i < kEvents; i += 50) {
      last = i;
    }
    expected += (last % 7 == 6) ? 0 : 1;
  }
  EXPECT_EQ(informer_->store().size(), expected);
}

TEST(NodeInformerTest, ListsAndWatchesNodes) {
  FakeClock clock;
  FakeTransport fake;
  ApiClient client(&fake);
  Mutex mu;
  std::vector<std::string> seen;
  EventHandlers<Node> h;
  h.on_add = [&](const Node& n, bool initial) {
    MutexLock l(&mu);
    seen.push_back("add " + n.meta.name + (initial ? " initial" : ""));
  };
  h.on_delete = [&](const Node& n, bool unknown) {
    MutexLock l(&mu);
    seen.push_back("delete " + n.meta.name + (unknown ? " tombstone" : ""));
  };
  NodeInformer::Options opts;
  opts.name = "nodes";
  opts.clock = &clock;
  NodeInformer informer(&client, opts, h);
  informer.Start();
  ASSERT_TRUE(fake.WaitForPending(1));
  EXPECT_EQ(fake.pending()[0].path, "/api/v1/nodes?limit=500&resourceVersion=0");
  ASSERT_TRUE(
      fake.Reply(Http(200, R"({"kind":"NodeList","metadata":{"resourceVersion":"3"},"items":[)"
                           R"({"metadata":{"name":"gpu-1","uid":"n1","resourceVersion":"2"}}]})")));
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(5)));
  StreamId w = fake.WaitForStream(0);
  ASSERT_NE(w, 0u);
  EXPECT_THAT(fake.stream_request(w)->path, HasSubstr("/api/v1/nodes?allowWatchBookmarks=true"));
  ASSERT_TRUE(fake.StreamOpen(w));
  ASSERT_TRUE(
      fake.StreamData(w, R"({"type":"DELETED","object":{"kind":"Node","metadata":{"name":"gpu-1",)"
                         R"("resourceVersion":"4"}}})"
                         "\n"));
  ASSERT_TRUE(Eventually([&] { return informer.store().size() == 0; }));
  informer.Stop();
  MutexLock l(&mu);
  EXPECT_THAT(seen, ElementsAre("add gpu-1 initial", "delete gpu-1"));
}

TEST(StoreTest, IndexesFollowUpsertsDeletesAndReplace) {
  PodStore store;
  Pod a;
  a.meta.uid = "ua";
  a.meta.ns = "ns";
  a.meta.name = "a";
  a.meta.resource_version = "1";
  a.node_name = "n1";
  Pod b = a;
  b.meta.uid = "ub";
  b.meta.name = "b";
  EXPECT_EQ(store.Upsert(a), nullptr);
  EXPECT_EQ(store.Upsert(b), nullptr);
  ASSERT_EQ(store.ListByNode("n1").size(), 2u);
  // Moving a to another node, under a new uid (delete + re-create).
  Pod a2 = a;
  a2.meta.uid = "ua2";
  a2.node_name = "n2";
  auto old = store.Upsert(a2);
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(old->meta.uid, "ua");
  EXPECT_EQ(store.GetByUid("ua"), nullptr);
  EXPECT_EQ(store.GetByUid("ua2")->node_name, "n2");
  EXPECT_EQ(store.ListByNode("n1").size(), 1u);
  EXPECT_EQ(store.ListByNode("n2").size(), 1u);
  EXPECT_EQ(store.Delete("ns/b")->meta.uid, "ub");
  EXPECT_EQ(store.Delete("ns/b"), nullptr);
  EXPECT_TRUE(store.ListByNode("n1").empty());
  EXPECT_THAT(store.Keys(), ElementsAre("ns/a"));

  Pod c = a;
  c.meta.uid = "uc";
  c.meta.name = "c";
  c.node_name = "";
  auto result = store.Replace({c, b});
  ASSERT_EQ(result.deleted.size(), 1u);
  EXPECT_EQ(result.deleted[0]->meta.uid, "ua2");
  ASSERT_EQ(result.replaced.size(), 2u);
  EXPECT_EQ(result.replaced[0].first, nullptr);
  EXPECT_EQ(store.GetByUid("ua2"), nullptr);
  EXPECT_TRUE(store.ListByNode("n2").empty());
  EXPECT_EQ(store.ListByNode("n1").size(), 1u);
  EXPECT_THAT(store.Keys(), ElementsAre("ns/b", "ns/c"));
  auto list = store.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]->meta.name, "b");
}

TEST(StoreTest, ASharedUidFollowsTheLatestObjectAndOutlivesTheOthers) {
  // Two keys with one uid (a re-create under a new name seen before the old name's delete):
  // the uid index names the latest, and removing or replacing the other leaves it intact.
  PodStore store;
  Pod a;
  a.meta.uid = "u";
  a.meta.ns = "ns";
  a.meta.name = "a";
  a.node_name = "n1";
  Pod b = a;
  b.meta.name = "b";
  store.Upsert(a);
  store.Upsert(b);
  ASSERT_NE(store.GetByUid("u"), nullptr);
  EXPECT_EQ(store.GetByUid("u")->meta.name, "b");
  EXPECT_NE(store.Delete("ns/a"), nullptr);  // the only reference to a goes here
  ASSERT_NE(store.GetByUid("u"), nullptr);
  EXPECT_EQ(store.GetByUid("u")->meta.name, "b");
  Pod b2 = b;
  b2.meta.resource_version = "2";
  store.Upsert(b2);
  ASSERT_NE(store.GetByUid("u"), nullptr);
  EXPECT_EQ(store.GetByUid("u")->meta.resource_version, "2");
  ASSERT_EQ(store.ListByNode("n1").size(), 1u);
  EXPECT_EQ(store.ListByNode("n1")[0]->meta.resource_version, "2");
  EXPECT_NE(store.Delete("ns/b"), nullptr);
  EXPECT_EQ(store.GetByUid("u"), nullptr);
  EXPECT_TRUE(store.ListByNode("n1").empty());
}

TEST(StoreTest, NodesAreKeyedByNameAndHaveNoNodeIndex) {
  NodeStore store;
  Node n;
  n.meta.name = "node-a";
  n.meta.uid = "u";
  store.Upsert(n);
  EXPECT_NE(store.Get("node-a"), nullptr);
  EXPECT_NE(store.GetByUid("u"), nullptr);
  EXPECT_TRUE(store.ListByNode("node-a").empty());
}

}  // namespace
}  // namespace tessera::kube
