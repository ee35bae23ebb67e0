// File: tessera/kube/reflector.h
//
// Reflector<T> (T = Pod, Node or ResourceQuota) keeps a sink in step with the API server with
// client-go's list/watch semantics (docs/k8s-protocol.md §3.1): a paged LIST, then a WATCH from the
// list's resourceVersion with bookmarks, and on each end of the watch a re-watch, a relist or a
// backoff. What each ending leads to: docs/kube-client.md "The reflector".
//
//   Reflector<Pod> reflector(&client, options, clock, &sink, post);  // sink: OnReplace, OnEvent
//   reflector.Start();  ...  reflector.Tick();                // retries whose backoff elapsed
//
// Errors: none returned; failures are retried (tessera::Backoff, reset after `backoff_reset`
// without failure) and counted in counters() (last_error).
//
// Thread safety: the reflector owns no thread. Every method except counters() runs on its owner's
// thread; transport callbacks only `post` tasks to it. counters() from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

#include "tessera/base/backoff.h"
#include "tessera/base/clock.h"
#include "tessera/base/mutex.h"
#include "tessera/kube/client.h"
#include "tessera/kube/decode.h"

namespace tessera::kube {

struct ReflectorOptions {
  std::string ns;  // empty: all namespaces
  std::string label_selector;
  std::string field_selector;
  int64_t page_size = 500;
  absl::Duration min_watch_timeout = absl::Minutes(5);
  // Stall watchdog of each watch stream (zero: none). Keep it above the bookmark interval.
  absl::Duration watch_stall_timeout = absl::Minutes(3);
  Backoff::Options backoff = {absl::Milliseconds(800), absl::Seconds(30), 2.0, 0.5};
  absl::Duration backoff_reset = absl::Minutes(2);
  // A watch ending with 410 relists without backoff at most once per this interval.
  absl::Duration immediate_relist_interval = absl::Seconds(10);
  uint64_t seed = 0x5eed;
};

// Counters for metrics and tests. Monotonic except the "last_" fields.
struct ReflectorCounters {
  int64_t lists = 0;             // complete LISTs delivered to OnReplace
  int64_t list_pages = 0;        // LIST requests answered with a page
  int64_t list_errors = 0;       // failed LIST requests
  int64_t relists = 0;           // LISTs started after the first
  int64_t continue_expired = 0;  // 410 on a continue page (fell back to a full LIST)
  int64_t watches = 0;           // WATCH requests started
  int64_t watch_restarts = 0;    // watches started again after a normal close
  int64_t watch_errors = 0;      // watches that ended with an error (410 and ERROR included)
  int64_t events = 0;            // ADDED/MODIFIED/DELETED events delivered
  int64_t bookmarks = 0;
  // LISTs whose resourceVersion was below one seen before: the API server's storage went back
  // in time (an etcd restore). The list replaced the store all the same.
  int64_t rollbacks = 0;
  absl::Time last_event_time = absl::InfinitePast();
  std::string last_resource_version;
  absl::Duration last_backoff = absl::ZeroDuration();
  absl::Status last_error;
};

template <typename T>
class ReflectorSink {
 public:
  virtual ~ReflectorSink() = default;
  // The complete result of a LIST, every page concatenated, its resourceVersion, and the clock's
  // time when the LIST's first request was about to be sent (the snapshot is no older).
  virtual void OnReplace(std::vector<T> items, const std::string& resource_version,
                         absl::Time list_started) = 0;
  // One ADDED, MODIFIED or DELETED event.
  virtual void OnEvent(WatchEvent<T> event) = 0;
};

template <typename T>
class Reflector {
 public:
  using Task = absl::AnyInvocable<void()>;
  using Post = std::function<void(Task)>;

  // `client`, `clock` and `sink` must outlive the reflector.
  Reflector(ApiClient* client, ReflectorOptions options, Clock* clock, ReflectorSink<T>* sink,
            Post post);
  ~Reflector();
  Reflector(const Reflector&) = delete;
  Reflector& operator=(const Reflector&) = delete;

  // Starts the first LIST. Call once.
  void Start();
  // Cancels the watch and ignores every later result. Idempotent.
  void Stop();
  // Runs a retry whose backoff has elapsed. Returns when the next retry is due
  // (InfiniteFuture when none is waiting).
  absl::Time Tick();
  // Drops the watch, LIST or wait in progress and lists the latest state (resourceVersion "")
  // now, for an owner that learnt that the watch's revisions no longer hold (the API server
  // went back in time). No-op before Start() and after Stop().
  void Relist();

  ReflectorCounters counters() const;

 private:
  enum class Phase { kIdle, kListing, kWatching, kWaiting, kStopped };
  enum class Retry { kRelist, kRewatch };

  void StartList(std::string resource_version);
  void SendPage();
  void OnPage(uint64_t gen, absl::StatusOr<ApiClient::ListOf<T>> page);
  void StartWatch();
  void OnWatchEvent(uint64_t gen, WatchEvent<T> event);
  void OnWatchEnd(uint64_t gen, absl::Status status);
  // Schedules `retry` after the next backoff delay, or at once (no backoff step) if `immediate`.
  void Fail(Retry retry, absl::Status error, bool immediate = false);
  template <typename F>
  void UpdateCounters(F f) {
    MutexLock lock(&counters_mu_);
    f(counters_);
  }

  ApiClient* const client_;
  const ReflectorOptions options_;
  Clock* const clock_;
  ReflectorSink<T>* const sink_;
  const Post post_;

  Phase phase_ = Phase::kIdle;
  uint64_t gen_ = 0;  // bumped by every new request; results of older ones are ignored
  Backoff backoff_;
  std::mt19937_64 rng_;
  absl::Time last_failure_ = absl::InfinitePast();
  absl::Time last_immediate_relist_ = absl::InfinitePast();
  absl::Time retry_at_ = absl::InfiniteFuture();
  Retry retry_ = Retry::kRelist;
  bool listed_once_ = false;
  // The highest resourceVersion (as an integer) delivered since the last LIST, the LIST's
  // included; 0 when none parsed. A LIST below it means the server went back in time.
  uint64_t seen_rv_ = 0;

  // The LIST in progress.
  std::string list_rv_;
  absl::Time list_started_;
  bool paged_ = true;
  std::string continue_;
  std::string page_rv_;
  std::vector<T> items_;

  // The watch in progress.
  std::string last_rv_;
  WatchHandle watch_;
  absl::Time watch_started_ = absl::InfinitePast();
  int64_t watch_events_ = 0;

  mutable Mutex counters_mu_;
  ReflectorCounters counters_ ABSL_GUARDED_BY(counters_mu_);
};

extern template class Reflector<Pod>;
extern template class Reflector<Node>;
extern template class Reflector<ResourceQuota>;

}  // namespace tessera::kube
