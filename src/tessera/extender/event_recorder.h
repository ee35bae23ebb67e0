// File: tessera/extender/event_recorder.h
//
// EventRecorder posts core/v1 Events about pods (FilteringSucceed, BindingFailed, ...) from a
// background thread, so that a /filter or /bind never waits for an event's API round trip and
// never fails because of one. Events are best effort: a full queue drops the new event, a
// refused POST is logged; both are counted. Each pod gets at most `spam_burst` events of one
// reason, then one per `spam_refill` (client-go's spam filter, which HAMi's recorder applies —
// 25, then one per 5 minutes — but per reason), so that a pod refused at every retry neither
// crowds out the others' events nor silences its own of another reason.
//
//   EventRecorder events({.component = "hami-scheduler"}, client, clock);
//   events.Record(pod.meta, "FilteringFailed", "no candidate nodes", EventType::kWarning);
//   events.Flush();  // tests and shutdown: wait until the queue is sent
//
// Messages are cut to kMessageLimit bytes at a UTF-8 character boundary (ending "..."), the
// limit events.k8s.io puts on a note. EventNodeList builds "<head>(<node>, <node>, ...)" lists
// that end "... <n> more)" instead of growing past the limit.
//
// Each event gets a name unique per pod even when the clock does not move (kube::EventName of
// a strictly increasing nanosecond time).
//
// Thread safety: Record, Flush and counts may be called concurrently from any thread. The
// client and clock must be thread-safe and outlive the recorder. The destructor sends what is
// queued, then joins the sender thread ("sched-events").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/base/work_queue.h"
#include "tessera/kube/client.h"
#include "tessera/kube/objects.h"

namespace tessera::extender {

enum class EventType : uint8_t { kNormal, kWarning };

class EventRecorder {
 public:
  // The longest message, in bytes. HAMi's FilteringSucceed lists every fitting node: 500
  // candidates made ~9 KB.
  static constexpr size_t kMessageLimit = 1024;

  struct Options {
    std::string component = "hami-scheduler";       // the events' source.component
    size_t queue_limit = 1000;                      // events queued beyond this are dropped
    int spam_burst = 25;                            // events per pod and reason at once
    absl::Duration spam_refill = absl::Minutes(5);  // one more per pod and reason each
    size_t spam_pods = 4096;  // pod and reason pairs remembered (least recently used go)
  };
  // Totals since construction.
  struct Counts {
    uint64_t sent = 0;
    uint64_t failed = 0;     // the API refused or failed
    uint64_t dropped = 0;    // the queue was full
    uint64_t throttled = 0;  // over the budget of its pod and reason
  };

  EventRecorder(Options options, kube::ApiClient* client, Clock* clock);
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues an event about the pod `involved` (its namespace, name and uid are used). Never
  // blocks on the API.
  void Record(const kube::ObjectMeta& involved, std::string_view reason, std::string message,
              EventType type);

  // Blocks until every event queued before the call has been sent or has failed.
  void Flush();

  Counts counts() const;

 private:
  struct Pending {
    std::string ns, name, uid, reason, message;
    EventType type = EventType::kNormal;
  };
  void Send(Pending e);
  // Takes from the budget of `key` (the pod and the reason); false when it is spent.
  bool Admit(const std::string& key) ABSL_LOCKS_EXCLUDED(spam_mu_);

  // A budget as a theoretical arrival time: each event moves it `spam_refill` on from
  // max(it, now), and an event that would move it past now + spam_burst × spam_refill is
  // throttled (a token bucket in exact time).
  struct Budget {
    absl::Time tat;
    std::list<std::string>::iterator age;  // in by_age_
  };

  const Options options_;
  kube::ApiClient* const client_;
  Clock* const clock_;

  Mutex mu_;
  int64_t last_nanos_ ABSL_GUARDED_BY(mu_) = 0;

  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> failed_{0};

  mutable Mutex spam_mu_;
  absl::flat_hash_map<std::string, Budget> budgets_ ABSL_GUARDED_BY(spam_mu_);
  std::list<std::string> by_age_ ABSL_GUARDED_BY(spam_mu_);  // least recently used first
  uint64_t throttled_ ABSL_GUARDED_BY(spam_mu_) = 0;

  WorkQueue queue_;  // last: its sender stops before the members it uses go
};

// Cuts `text` to at most `limit` bytes (limit >= 3) at a UTF-8 character boundary, ending it
// with "..." when anything was cut.
void CapEventMessage(std::string* text, size_t limit = EventRecorder::kMessageLimit);

// "<head>(<item><separator><item>...)" within EventRecorder::kMessageLimit bytes: items that do
// not fit are counted instead and the list ends "... <n> more)". Not thread-safe (a local).
class EventNodeList {
 public:
  EventNodeList(std::string head, std::string_view separator);

  // False once an item was left out: a caller with costly items may Omit() instead of building.
  bool Open() const { return omitted_ == 0; }
  void Add(std::string_view item);
  // Counts an item that was not built.
  void Omit() { ++omitted_; }
  std::string Finish() &&;

 private:
  std::string text_;
  std::string_view separator_;
  size_t budget_ = 0;
  size_t first_ = 0;  // where the items start
  size_t omitted_ = 0;
};

}  // namespace tessera::extender
