#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "fmt/core.h"

#include "tessera/apisim/store.h"
#include "tessera/apisim/store_internal.h"
#include "tessera/base/status_macros.h"

namespace tessera::apisim {

using internal::Json;
using internal::ListOptionsInvalid;
using internal::Matches;
using internal::ParseRv;
using internal::ParseSelectors;
using internal::TooLarge;

namespace {

std::string EventLine(std::string_view type, std::string_view object) {
  std::string line;
  line.reserve(object.size() + 32);
  line += "{\"type\":\"";
  line += type;
  line += "\",\"object\":";
  line += object;
  line += "}\n";
  return line;
}

std::string ErrorEventLine(const absl::Status& status) {
  return EventLine("ERROR", ToStatusJson(status));
}

std::string BookmarkLine(const ResourceInfo& r, uint64_t rv, bool initial_end) {
  Json o = Json::object();
  o["kind"] = r.kind;
  o["apiVersion"] = r.api_version();
  o["metadata"]["resourceVersion"] = std::to_string(rv);
  if (initial_end) {
    o["metadata"]["annotations"]["k8s.io/initial-events-end"] = "true";
  }
  return EventLine("BOOKMARK", o.dump());
}

absl::Status ExpiredWatch(uint64_t want, uint64_t oldest) {
  return ApiError(410, "Expired", fmt::format("too old resource version: {} ({})", want, oldest));
}

}  // namespace

// ---- watch --------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<WatchStream>> Store::Watch(const ResourceInfo& r,
                                                          std::string_view ns,
                                                          const WatchOptions& o) {
  if (o.send_initial_events_set) {
    if (o.resource_version_match != "NotOlderThan") {
      return ListOptionsInvalid("resourceVersionMatch", "Forbidden",
                                "sendInitialEvents requires setting resourceVersionMatch to "
                                "NotOlderThan");
    }
  } else if (!o.resource_version_match.empty()) {
    return ListOptionsInvalid("resourceVersionMatch", "Forbidden",
                              "resourceVersionMatch is forbidden for watch unless "
                              "sendInitialEvents is provided");
  }
  TESSERA_ASSIGN_OR_RETURN(auto selectors, ParseSelectors(r, o.label_selector, o.field_selector));
  auto w = std::unique_ptr<WatchStream>(new WatchStream());
  w->store_ = this;
  w->resource_ = &r;
  w->resource_index_ = IndexOf(r);
  w->ns_ = std::string(ns);
  w->labels_ = std::move(selectors.first);
  w->fields_ = std::move(selectors.second);
  w->bookmarks_ = o.allow_bookmarks;
  const absl::Time now = clock_->Now();
  double timeout = o.timeout_seconds;
  if (timeout <= 0) {
    std::uniform_real_distribution<double> u(1.0, 2.0);
    std::random_device rd;
    std::mt19937 g(rd());
    timeout = 1800.0 * u(g);
  }
  w->deadline_ = now + absl::Seconds(timeout);
  w->next_bookmark_ = std::min(now + options_.bookmark_interval, w->deadline_ - absl::Seconds(2));
  if (w->next_bookmark_ <= now) {
    // As kube-apiserver's watch cache: a watch that ends within 2 s gets no bookmark.
    w->final_bookmark_sent_ = true;
    w->next_bookmark_ = absl::InfiniteFuture();
  }
  const bool legacy_initial =
      !o.send_initial_events_set && (o.resource_version.empty() || o.resource_version == "0");
  const bool initial = legacy_initial || o.send_initial_events;

  StoreLock l(this);
  w->sever_generation_ = sever_generation_;
  uint64_t want = 0;
  if (!o.resource_version.empty() && o.resource_version != "0") {
    if (!ParseRv(o.resource_version, &want)) {
      return ApiError(400, "BadRequest",
                      fmt::format("Invalid value: \"{}\": resourceVersion must be an integer",
                                  o.resource_version));
    }
    if (want > rv_ && !WaitForRevision(want)) {
      return TooLarge(want, rv_);
    }
  }
  if (initial) {
    w->cursor_ = rv_;
    ForEachAt(w->resource_index_, ns, rv_, "", [&](const ObjectPtr& obj) {
      if (Matches(*obj, w->labels_, w->fields_)) {
        w->initial_.push_back(obj);
      }
      return true;
    });
    w->send_initial_end_ = o.send_initial_events;
  } else if (want < trimmed_rv_by_resource_[w->resource_index_]) {
    // An event of this resource after `want` is gone (events of other resources do not count:
    // the watch cache is per resource).
    expired_answers_.fetch_add(1);
    w->pending_error_ = ErrorEventLine(ExpiredWatch(want, oldest_rv_));
    w->cursor_ = rv_;
  } else {
    w->cursor_ = want;
  }
  watches_open_.fetch_add(1);
  watches_started_.fetch_add(1);
  return w;
}

WatchStream::~WatchStream() {
  if (store_ != nullptr) {
    store_->watches_open_.fetch_sub(1);
  }
}

WatchStream::Step WatchStream::Next(std::string* out, absl::Duration max_wait) {
  out->clear();
  if (ended_) {
    return Step::kEnd;
  }
  if (!pending_error_.empty()) {
    *out = std::move(pending_error_);
    pending_error_.clear();
    ended_ = true;
    return Step::kData;
  }
  if (initial_pos_ < initial_.size() || send_initial_end_) {
    size_t end = std::min(initial_.size(), initial_pos_ + 256);
    for (; initial_pos_ < end; ++initial_pos_) {
      *out += EventLine("ADDED", initial_[initial_pos_]->json);
    }
    if (initial_pos_ == initial_.size()) {
      initial_.clear();
      initial_.shrink_to_fit();
      initial_pos_ = 0;
      if (send_initial_end_) {
        *out += BookmarkLine(*resource_, cursor_, true);
        send_initial_end_ = false;
      }
    }
    store_->watch_events_sent_.fetch_add(1);
    return Step::kData;
  }
  Store& s = *store_;
  const absl::Time give_up = s.clock_->Now() + max_wait;
  std::vector<Store::Event> batch;
  while (true) {
    {
      MutexLock l(&s.mu_);
      while (true) {
        if (s.shutdown_) {
          return Step::kAbort;
        }
        if (s.sever_generation_ != sever_generation_) {
          ++s.watches_severed_;
          return Step::kAbort;
        }
        const absl::Time now = s.clock_->Now();
        if (now >= deadline_) {
          ended_ = true;
          return Step::kEnd;
        }
        const size_t r = resource_index_;
        if (!s.faults_.pause_watches && s.trimmed_rv_by_resource_[r] > cursor_) {
          // An event of this watch's resource that it has not sent is gone: like the watch
          // cache, end it with 410.
          *out = ErrorEventLine(ExpiredWatch(cursor_, s.oldest_rv_));
          s.expired_answers_.fetch_add(1);
          ended_ = true;
          return Step::kData;
        }
        if (!s.faults_.pause_watches && s.newest_rv_by_resource_[r] > cursor_) {
          // The newest event of this resource is in the history (else it was trimmed, checked
          // above), and everything between the cursor and the oldest event kept belongs to
          // other resources: skip it.
          cursor_ = std::max(cursor_, s.history_.front().rv - 1);
          size_t i = cursor_ + 1 - s.history_.front().rv;
          size_t end = std::min(s.history_.size(), i + 1024);
          batch.assign(s.history_.begin() + static_cast<std::ptrdiff_t>(i),
                       s.history_.begin() + static_cast<std::ptrdiff_t>(end));
          cursor_ = batch.back().rv;
          break;
        }
        if (!s.faults_.pause_watches) {
          // Nothing of this resource after the cursor: the watch has seen everything up to the
          // store's revision (so its bookmarks carry a current one, as the watch cache's do).
          cursor_ = std::max(cursor_, s.rv_);
        }
        if (bookmarks_ && now >= next_bookmark_) {
          *out = BookmarkLine(*resource_, cursor_, false);
          if (!final_bookmark_sent_ && next_bookmark_ >= deadline_ - absl::Seconds(2)) {
            final_bookmark_sent_ = true;
          }
          next_bookmark_ = now + s.options_.bookmark_interval;
          if (!final_bookmark_sent_) {
            next_bookmark_ = std::min(next_bookmark_, deadline_ - absl::Seconds(2));
          }
          return Step::kData;
        }
        absl::Time wake = std::min(deadline_, give_up);
        if (bookmarks_) {
          wake = std::min(wake, next_bookmark_);
        }
        if (now >= give_up) {
          return Step::kIdle;
        }
        s.changed_by_resource_[r].WaitFor(
            &s.mu_, absl::ToChronoMicroseconds(wake - now) + std::chrono::microseconds(100));
      }
    }
    uint64_t sent = 0;
    for (const Store::Event& e : batch) {
      if (e.resource != resource_index_ || e.dropped) {
        continue;
      }
      if (!ns_.empty() && e.obj->ns != ns_) {
        continue;
      }
      const bool now_match = Matches(*e.obj, labels_, fields_);
      switch (e.type) {
        case EventType::kAdded:
          if (now_match) {
            *out += EventLine("ADDED", e.obj->json);
            ++sent;
          }
          break;
        case EventType::kDeleted:
          if (now_match) {
            *out += EventLine("DELETED", e.obj->json);
            ++sent;
          }
          break;
        case EventType::kModified: {
          const bool was_match = e.prev != nullptr && Matches(*e.prev, labels_, fields_);
          if (was_match && now_match) {
            *out += EventLine("MODIFIED", e.obj->json);
            ++sent;
          } else if (!was_match && now_match) {
            *out += EventLine("ADDED", e.obj->json);
            ++sent;
          } else if (was_match) {
            *out += EventLine("DELETED", e.prev->JsonWithRv(e.rv));
            ++sent;
          }
          break;
        }
      }
    }
    batch.clear();
    if (sent > 0) {
      s.watch_events_sent_.fetch_add(sent);
      return Step::kData;
    }
    if (s.clock_->Now() >= give_up) {
      return Step::kIdle;
    }
  }
}

}  // namespace tessera::apisim
