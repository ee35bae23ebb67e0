#include "tessera/extender/event_recorder.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include <fmt/core.h>

#include "tessera/base/logging.h"

namespace tessera::extender {

EventRecorder::EventRecorder(Options options, kube::ApiClient* client, Clock* clock)
    : options_(std::move(options)),
      client_(client),
      clock_(clock != nullptr ? clock : Clock::Real()),
      queue_({.name = "sched-events", .threads = 1, .limit = options_.queue_limit}) {
  TESSERA_CHECK(client_ != nullptr);
}

EventRecorder::~EventRecorder() { queue_.Stop(); }  // sends what is queued

void EventRecorder::Record(const kube::ObjectMeta& involved, std::string_view reason,
                           std::string message, EventType type) {
  if (!Admit(fmt::format("{}\n{}",
                         involved.uid.empty() ? involved.ns + "/" + involved.name : involved.uid,
                         reason))) {
    return;
  }
  Pending e;
  e.ns = involved.ns;
  e.name = involved.name;
  e.uid = involved.uid;
  e.reason = std::string(reason);
  e.message = std::move(message);
  CapEventMessage(&e.message);
  e.type = type;
  // A full queue drops the event; queue_.dropped() counts it.
  (void)queue_.Push([this, e = std::move(e)]() mutable { Send(std::move(e)); });
}

bool EventRecorder::Admit(const std::string& key) {
  const absl::Time now = clock_->Now();
  MutexLock l(&spam_mu_);
  auto [it, fresh] = budgets_.try_emplace(key);
  Budget& b = it->second;
  if (fresh) {
    b.tat = now;
    by_age_.push_back(key);
  } else {
    by_age_.splice(by_age_.end(), by_age_, b.age);
  }
  b.age = std::prev(by_age_.end());
  const absl::Time next = std::max(b.tat, now) + options_.spam_refill;
  const bool admitted = next - now <= options_.spam_refill * options_.spam_burst;
  if (admitted) {
    b.tat = next;
  } else {
    ++throttled_;
  }
  while (budgets_.size() > options_.spam_pods) {
    budgets_.erase(by_age_.front());
    by_age_.pop_front();
  }
  return admitted;
}

void EventRecorder::Flush() { queue_.Flush(); }

EventRecorder::Counts EventRecorder::counts() const {
  MutexLock l(&spam_mu_);
  return Counts{sent_.load(std::memory_order_relaxed), failed_.load(std::memory_order_relaxed),
                queue_.dropped(), throttled_};
}

void EventRecorder::Send(Pending e) {
  kube::CoreEvent ce;
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    // Unique names even when the clock stands still (a fake clock, a coarse one).
    const int64_t nanos = std::max(absl::ToUnixNanos(now), last_nanos_ + 1);
    last_nanos_ = nanos;
    ce.name = kube::EventName(e.name, absl::FromUnixNanos(nanos));
    ce.first_timestamp = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", now, absl::UTCTimeZone());
    ce.last_timestamp = ce.first_timestamp;
  }
  ce.ns = e.ns;
  ce.involved_kind = "Pod";
  ce.involved_api_version = "v1";
  ce.involved_ns = std::move(e.ns);
  ce.involved_name = std::move(e.name);
  ce.involved_uid = std::move(e.uid);
  ce.reason = std::move(e.reason);
  ce.message = std::move(e.message);
  ce.type = e.type == EventType::kWarning ? "Warning" : "Normal";
  ce.source_component = options_.component;
  if (absl::Status sent = client_->CreateEvent(ce); sent.ok()) {
    sent_.fetch_add(1, std::memory_order_relaxed);
  } else {
    failed_.fetch_add(1, std::memory_order_relaxed);
    TESSERA_LOG(kWarning, "event {} for pod {}/{} not recorded: {}", ce.reason, ce.involved_ns,
                ce.involved_name, std::string(sent.message()));
  }
}

void CapEventMessage(std::string* text, size_t limit) {
  if (text->size() <= limit) {
    return;
  }
  size_t cut = limit - 3;
  // Back to the start of a character: UTF-8 continuation bytes are 10xxxxxx.
  while (cut > 0 && (static_cast<unsigned char>((*text)[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  text->resize(cut);
  text->append("...");
}

EventNodeList::EventNodeList(std::string head, std::string_view separator)
    : text_(std::move(head)), separator_(separator) {
  text_ += '(';
  // The tail needs room: "," + "... 4294967295 more" + ")".
  constexpr size_t kTail = 22;
  budget_ = EventRecorder::kMessageLimit > text_.size() + kTail
                ? EventRecorder::kMessageLimit - kTail
                : text_.size();
  first_ = text_.size();
}

void EventNodeList::Add(std::string_view item) {
  const size_t sep = text_.size() > first_ ? separator_.size() : 0;
  if (omitted_ > 0 || text_.size() + sep + item.size() > budget_) {
    ++omitted_;
    return;
  }
  text_.append(separator_.data(), sep);
  text_.append(item);
}

std::string EventNodeList::Finish() && {
  if (omitted_ > 0) {
    if (text_.size() > first_) {
      text_.append(separator_);
    }
    text_ += fmt::format("... {} more", omitted_);
  }
  text_ += ')';
  return std::move(text_);
}

}  // namespace tessera::extender
