#include "tessera/kube/reflector.h"

#include <algorithm>
#include <charconv>
#include <string_view>
#include <utility>

#include "tessera/base/logging.h"

namespace tessera::kube {
namespace {

// The revision of a resourceVersion; 0 when it is not an unsigned integer.
uint64_t RevisionOf(std::string_view rv) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(rv.data(), rv.data() + rv.size(), v);
  return ec == std::errc() && end == rv.data() + rv.size() ? v : 0;
}

// 504 "Too large resource version": the API server's revision is below the one asked for (it is
// catching up, or its storage went back in time). An HTTP 504, or a watch's ERROR event with
// reason Timeout.
bool TooLargeResourceVersion(const absl::Status& status) {
  return HttpStatusCodeOf(status) == 504 ||
         (status.code() == absl::StatusCode::kUnavailable && ReasonOf(status) == "Timeout");
}

}  // namespace

template <typename T>
Reflector<T>::Reflector(ApiClient* client, ReflectorOptions options, Clock* clock,
                        ReflectorSink<T>* sink, Post post)
    : client_(client),
      options_(std::move(options)),
      clock_(clock),
      sink_(sink),
      post_(std::move(post)),
      backoff_(options_.backoff, options_.seed),
      rng_(options_.seed) {}

template <typename T>
Reflector<T>::~Reflector() {
  Stop();
}

template <typename T>
void Reflector<T>::Start() {
  StartList("0");
}

template <typename T>
void Reflector<T>::Stop() {
  phase_ = Phase::kStopped;
  ++gen_;
  watch_.Cancel();
}

template <typename T>
absl::Time Reflector<T>::Tick() {
  if (phase_ != Phase::kWaiting) {
    return absl::InfiniteFuture();
  }
  if (clock_->Now() < retry_at_) {
    return retry_at_;
  }
  retry_at_ = absl::InfiniteFuture();
  if (retry_ == Retry::kRewatch) {
    StartWatch();
  } else {
    UpdateCounters([](ReflectorCounters& c) { ++c.relists; });
    StartList(last_rv_);
  }
  return absl::InfiniteFuture();
}

template <typename T>
void Reflector<T>::Relist() {
  if (phase_ == Phase::kIdle || phase_ == Phase::kStopped) {
    return;
  }
  watch_.Cancel();
  watch_ = WatchHandle();
  retry_at_ = absl::InfiniteFuture();
  UpdateCounters([](ReflectorCounters& c) { ++c.relists; });
  StartList("");  // bumps gen_: results of the requests dropped here are ignored
}

template <typename T>
ReflectorCounters Reflector<T>::counters() const {
  MutexLock lock(&counters_mu_);
  return counters_;
}

template <typename T>
void Reflector<T>::StartList(std::string resource_version) {
  phase_ = Phase::kListing;
  list_rv_ = std::move(resource_version);
  list_started_ = clock_->Now();
  paged_ = options_.page_size > 0 && (list_rv_.empty() || list_rv_ == "0");
  continue_.clear();
  page_rv_.clear();
  items_.clear();
  SendPage();
}

template <typename T>
void Reflector<T>::SendPage() {
  ListOptions opts;
  opts.ns = options_.ns;
  opts.label_selector = options_.label_selector;
  opts.field_selector = options_.field_selector;
  opts.limit = paged_ ? options_.page_size : 0;
  opts.continue_token = continue_;
  if (continue_.empty()) {
    opts.resource_version = list_rv_;
  }
  const uint64_t gen = ++gen_;
  // The callbacks hold a copy of post_, never the reflector itself: they may run after the
  // reflector is gone, and then post drops the task.
  client_->ListAsync<T>(
      opts, [this, post = post_, gen](absl::StatusOr<ApiClient::ListOf<T>> page) mutable {
        post([this, gen, page = std::move(page)]() mutable { OnPage(gen, std::move(page)); });
      });
}

template <typename T>
void Reflector<T>::OnPage(uint64_t gen, absl::StatusOr<ApiClient::ListOf<T>> page) {
  if (gen != gen_ || phase_ != Phase::kListing) {
    return;
  }
  if (!page.ok()) {
    UpdateCounters([&](ReflectorCounters& c) {
      ++c.list_errors;
      c.last_error = page.status();
    });
    if (page.status().code() == absl::StatusCode::kOutOfRange) {
      if (!continue_.empty()) {
        // The continue token expired: one full list at the original RV.
        TESSERA_LOG(kInfo, "reflector: continue token expired, listing without pages");
        UpdateCounters([](ReflectorCounters& c) { ++c.continue_expired; });
        paged_ = false;
        continue_.clear();
        items_.clear();
        SendPage();
        return;
      }
      if (!list_rv_.empty()) {
        // Too old for a LIST at this RV: a consistent read of the latest state.
        StartList("");
        return;
      }
    }
    if (TooLargeResourceVersion(page.status()) && !list_rv_.empty() && continue_.empty()) {
      // "Too large resource version" (the cache is behind the RV): read the latest instead.
      StartList("");
      return;
    }
    TESSERA_LOG(kWarning, "reflector: LIST failed: {}", page.status().ToString());
    Fail(Retry::kRelist, page.status());
    return;
  }
  UpdateCounters([](ReflectorCounters& c) { ++c.list_pages; });
  if (page_rv_.empty() || continue_.empty()) {
    page_rv_ = page->meta.resource_version;
  }
  if (items_.empty()) {
    items_ = std::move(page->items);
  } else {
    items_.reserve(items_.size() + page->items.size());
    for (T& item : page->items) {
      items_.push_back(std::move(item));
    }
  }
  if (!page->meta.continue_token.empty() && paged_) {
    continue_ = page->meta.continue_token;
    SendPage();
    return;
  }
  last_rv_ = page_rv_;
  const uint64_t list_revision = RevisionOf(last_rv_);
  if (listed_once_ && list_revision != 0 && list_revision < seen_rv_) {
    TESSERA_LOG(kWarning,
                "reflector: the API server's resourceVersion went back from {} to {} (its "
                "storage was restored?): the list replaces the cache, older versions included",
                seen_rv_, list_revision);
    UpdateCounters([](ReflectorCounters& c) { ++c.rollbacks; });
  }
  seen_rv_ = list_revision;
  listed_once_ = true;
  std::vector<T> items = std::move(items_);
  items_.clear();
  UpdateCounters([&](ReflectorCounters& c) {
    ++c.lists;
    c.last_resource_version = last_rv_;
  });
  sink_->OnReplace(std::move(items), last_rv_, list_started_);
  StartWatch();
}

template <typename T>
void Reflector<T>::StartWatch() {
  phase_ = Phase::kWatching;
  WatchOptions opts;
  opts.ns = options_.ns;
  opts.label_selector = options_.label_selector;
  opts.field_selector = options_.field_selector;
  opts.resource_version = last_rv_;
  opts.allow_bookmarks = true;
  const int64_t min_s = std::max<int64_t>(1, absl::ToInt64Seconds(options_.min_watch_timeout));
  std::uniform_int_distribution<int64_t> dist(min_s, 2 * min_s - 1);
  opts.timeout = absl::Seconds(dist(rng_));
  opts.stall_timeout = options_.watch_stall_timeout;
  const uint64_t gen = ++gen_;
  watch_started_ = clock_->Now();
  watch_events_ = 0;
  UpdateCounters([](ReflectorCounters& c) { ++c.watches; });
  WatchCallbacks<T> callbacks;
  callbacks.on_batch = [this, post = post_, gen](std::vector<WatchEvent<T>> events) {
    post([this, gen, events = std::move(events)]() mutable {
      for (WatchEvent<T>& event : events) {
        OnWatchEvent(gen, std::move(event));
      }
    });
  };
  callbacks.on_end = [this, post = post_, gen](absl::Status status) {
    post([this, gen, status = std::move(status)]() mutable { OnWatchEnd(gen, std::move(status)); });
  };
  watch_ = client_->Watch<T>(opts, std::move(callbacks));
}

template <typename T>
void Reflector<T>::OnWatchEvent(uint64_t gen, WatchEvent<T> event) {
  if (gen != gen_ || phase_ != Phase::kWatching) {
    return;
  }
  switch (event.type) {
    case WatchEventType::kError:
      return;  // the stream's end carries the error
    case WatchEventType::kBookmark:
      if (!event.object.meta.resource_version.empty()) {
        last_rv_ = event.object.meta.resource_version;
        seen_rv_ = std::max(seen_rv_, RevisionOf(last_rv_));
      }
      UpdateCounters([&](ReflectorCounters& c) {
        ++c.bookmarks;
        c.last_resource_version = last_rv_;
      });
      return;
    default:
      break;
  }
  ++watch_events_;
  if (!event.object.meta.resource_version.empty()) {
    last_rv_ = event.object.meta.resource_version;
    seen_rv_ = std::max(seen_rv_, RevisionOf(last_rv_));
  }
  const absl::Time now = clock_->Now();
  UpdateCounters([&](ReflectorCounters& c) {
    ++c.events;
    c.last_event_time = now;
    c.last_resource_version = last_rv_;
  });
  sink_->OnEvent(std::move(event));
}

template <typename T>
void Reflector<T>::OnWatchEnd(uint64_t gen, absl::Status status) {
  if (gen != gen_ || phase_ != Phase::kWatching) {
    return;
  }
  watch_ = WatchHandle();  // the stream has ended: nothing to cancel
  if (status.ok()) {
    if (watch_events_ == 0 && clock_->Now() - watch_started_ < absl::Seconds(1)) {
      Fail(Retry::kRelist, absl::UnavailableError("very short watch: closed in under 1s with "
                                                  "no events"));
      return;
    }
    UpdateCounters([](ReflectorCounters& c) { ++c.watch_restarts; });
    StartWatch();
    return;
  }
  TESSERA_LOG(kInfo, "reflector: watch ended: {}", status.ToString());
  if (TooLargeResourceVersion(status)) {
    // The server is behind the revision the watch resumed from, and a watch from there would
    // fail again and again; after an etcd restore it may never get there, or get there on
    // another timeline. The server answered (after waiting for the revision): relist the latest
    // state, at once unless that was done within immediate_relist_interval.
    const absl::Time now = clock_->Now();
    const bool immediate = now - last_immediate_relist_ >= options_.immediate_relist_interval;
    if (immediate) {
      last_immediate_relist_ = now;
    }
    last_rv_.clear();
    Fail(Retry::kRelist, std::move(status), immediate);
    return;
  }
  switch (status.code()) {
    case absl::StatusCode::kUnavailable: {
      // A stream that was running when it broke says nothing about the server now: retry at
      // once instead of waiting out a backoff that earlier failures may have grown.
      const bool ran = watch_events_ > 0 || clock_->Now() - watch_started_ >= absl::Seconds(1);
      Fail(Retry::kRewatch, std::move(status), /*immediate=*/ran);
      return;
    }
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kCancelled:
      Fail(Retry::kRewatch, std::move(status));
      return;
    case absl::StatusCode::kOutOfRange: {
      const absl::Time now = clock_->Now();
      const bool immediate = now - last_immediate_relist_ >= options_.immediate_relist_interval;
      if (immediate) {
        last_immediate_relist_ = now;
      }
      Fail(Retry::kRelist, std::move(status), immediate);
      return;
    }
    default:
      Fail(Retry::kRelist, std::move(status));
      return;
  }
}

template <typename T>
void Reflector<T>::Fail(Retry retry, absl::Status error, bool immediate) {
  const absl::Time now = clock_->Now();
  absl::Duration delay = absl::ZeroDuration();
  if (!immediate) {  // an immediate retry neither grows the backoff nor delays its reset
    if (now - last_failure_ >= options_.backoff_reset) {
      backoff_.Reset();
    }
    last_failure_ = now;
    delay = backoff_.Next();
  }
  if (phase_ == Phase::kWatching) {
    UpdateCounters([](ReflectorCounters& c) { ++c.watch_errors; });
  }
  if (retry == Retry::kRelist && !listed_once_) {
    // Still no complete list: the next LIST starts from scratch at "0".
    last_rv_ = "0";
  }
  UpdateCounters([&](ReflectorCounters& c) {
    c.last_backoff = delay;
    c.last_error = std::move(error);
  });
  phase_ = Phase::kWaiting;
  retry_ = retry;
  retry_at_ = now + delay;
  ++gen_;
}

template class Reflector<Pod>;
template class Reflector<Node>;
template class Reflector<ResourceQuota>;

}  // namespace tessera::kube
