#include "tessera/accounting/resyncer.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include <fmt/core.h>
#include <pthread.h>

#include "tessera/base/logging.h"

namespace tessera::accounting {

namespace {

constexpr int kListAttempts = 3;

// The hand-over of one Reconcile result from an informer's worker to the waiting pass.
struct Handoff {
  Mutex mu;
  CondVar cv;
  std::optional<kube::ReconcileResult> result ABSL_GUARDED_BY(mu);
};

}  // namespace

Resyncer::Resyncer(kube::ApiClient* client, kube::Informer<kube::Pod>* pods,
                   kube::Informer<kube::Node>* nodes, ResyncOptions options, OnReport on_report)
    : client_(client),
      pods_(pods),
      nodes_(nodes),
      options_(options),
      on_report_(std::move(on_report)),
      rng_(options_.seed) {}

Resyncer::~Resyncer() { Stop(); }

void Resyncer::Start() {
  if (options_.period <= absl::ZeroDuration() || thread_.joinable()) {
    return;
  }
  thread_ = std::thread([this] { Loop(); });
}

void Resyncer::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) {
    thread_.join();
  }
}

bool Resyncer::Stopping() const {
  MutexLock lock(&mu_);
  return stopping_;
}

bool Resyncer::WaitUntil(absl::Time due) {
  MutexLock lock(&mu_);
  Clock* const clock = options_.clock;
  // A fake clock moves without notifying anyone: look at it often.
  const absl::Duration max_wait =
      clock == Clock::Real() ? absl::InfiniteDuration() : absl::Milliseconds(10);
  for (absl::Time now = clock->Now(); !stopping_ && now < due; now = clock->Now()) {
    cv_.WaitFor(&mu_, absl::ToChronoMicroseconds(std::min(due - now, max_wait)));
  }
  return !stopping_;
}

bool Resyncer::PauseAfterPage(absl::Duration page_took, absl::Duration* paused) {
  const absl::Duration pause = std::min(page_took * options_.pace, options_.max_page_pause);
  if (pause <= absl::ZeroDuration()) {
    return !Stopping();
  }
  const absl::Time begin = options_.clock->Now();
  const bool running = WaitUntil(begin + pause);
  *paused += options_.clock->Now() - begin;
  return running;
}

ResyncReport Resyncer::last() const {
  MutexLock lock(&mu_);
  return last_;
}

void Resyncer::Loop() {
  pthread_setname_np(pthread_self(), "resync");
  std::uniform_real_distribution<double> jitter(-options_.jitter, options_.jitter);
  while (true) {
    const absl::Duration wait = options_.period * (1.0 + jitter(rng_));
    if (!WaitUntil(options_.clock->Now() + wait)) {
      return;
    }
    RunOnce();
  }
}

template <typename T>
bool Resyncer::ListAll(std::vector<T>* items, std::string* resource_version, ResyncReport* report,
                       std::string* error) {
  for (int attempt = 0; attempt < kListAttempts; ++attempt) {
    items->clear();
    kube::ListOptions opts;
    opts.limit = options_.page_size;
    // "": a consistent read from storage, never served from the watch cache.
    opts.resource_version = "";
    bool expired = false;
    while (true) {
      if (Stopping()) {
        *error = "stopped";
        return false;
      }
      ++report->requests;
      const absl::Time page_start = options_.clock->Now();
      absl::StatusOr<kube::ApiClient::ListOf<T>> page;
      if constexpr (std::is_same_v<T, kube::Pod>) {
        page = client_->ListPods(opts);
      } else {
        page = client_->ListNodes(opts);
      }
      if (!page.ok()) {
        if (absl::IsOutOfRange(page.status()) && !opts.continue_token.empty()) {
          expired = true;  // the snapshot was compacted under the pages: start again
          break;
        }
        *error = page.status().ToString();
        return false;
      }
      if (opts.continue_token.empty()) {
        *resource_version = page->meta.resource_version;
      }
      items->insert(items->end(), std::make_move_iterator(page->items.begin()),
                    std::make_move_iterator(page->items.end()));
      if (page->meta.continue_token.empty()) {
        return true;
      }
      opts.continue_token = page->meta.continue_token;
      if (!PauseAfterPage(options_.clock->Now() - page_start, &report->paused)) {
        *error = "stopped";
        return false;
      }
    }
    if (!expired) {
      break;
    }
  }
  *error = "the paged LIST's snapshot kept expiring (410)";
  return false;
}

template <typename T>
void Resyncer::Resync(kube::Informer<T>* informer, std::string_view resource,
                      ResyncReport* report) {
  std::vector<T> items;
  std::string rv;
  std::string error;
  // What the informer had seen before the LIST: a list below it means a rollback.
  std::string seen = informer->counters().reflector.last_resource_version;
  if (!ListAll(&items, &rv, report, &error)) {
    report->error +=
        fmt::format("{}{}: list: {}", report->error.empty() ? "" : "; ", resource, error);
    return;
  }
  (std::is_same_v<T, kube::Pod> ? report->pods : report->nodes) = items.size();
  auto handoff = std::make_shared<Handoff>();
  informer->Reconcile(std::move(items), rv, std::move(seen),
                      [handoff](kube::ReconcileResult result) {
                        MutexLock lock(&handoff->mu);
                        handoff->result = std::move(result);
                        handoff->cv.SignalAll();
                      });
  std::optional<kube::ReconcileResult> result;
  const absl::Time deadline = options_.clock->Now() + options_.reconcile_timeout;
  {
    MutexLock lock(&handoff->mu);
    while (!handoff->result && options_.clock->Now() < deadline && !Stopping()) {
      handoff->cv.WaitFor(&handoff->mu, std::chrono::milliseconds(50));
    }
    result = std::move(handoff->result);
  }
  if (!result || !result->ran) {
    report->error +=
        fmt::format("{}{}: the informer did not run the comparison{}",
                    report->error.empty() ? "" : "; ", resource, result ? " (not synced)" : "");
    return;
  }
  auto add = [&](const char* kind, int64_t n) {
    if (n > 0) {
      report->corrections[kind] += n;
    }
  };
  add("missing", result->missing);
  add("stale", result->stale);
  add("gone", result->gone);
  for (const std::string& line : result->details) {
    report->details.push_back(fmt::format("{} {}", resource, line));
    TESSERA_LOG(kWarning, "resync repaired {} {}", resource, line);
  }
}

ResyncReport Resyncer::RunOnce() {
  MutexLock run(&run_mu_);
  ResyncReport report;
  report.at = options_.clock->Now();
  const absl::Time start = options_.clock->Now();
  if (!pods_->HasSynced() || !nodes_->HasSynced()) {
    report.error = "the informers have not synced yet";
  } else {
    // Nodes first: a pod repaired after its node is counted against the node's devices.
    Resync(nodes_, "nodes", &report);
    Resync(pods_, "pods", &report);
  }
  report.took = options_.clock->Now() - start;
  int64_t total = 0;
  for (const auto& [kind, n] : report.corrections) {
    total += n;
  }
  TESSERA_VLOG(1, "resync: {} pods, {} nodes, {} requests, {} repairs, {} ({} paused){}",
               report.pods, report.nodes, report.requests, total, absl::FormatDuration(report.took),
               absl::FormatDuration(report.paused),
               report.error.empty() ? "" : ", error: " + report.error);
  if (!report.error.empty()) {
    TESSERA_LOG(kWarning, "resync: {}", report.error);
  }
  if (on_report_) {
    on_report_(report);
  }
  {
    MutexLock lock(&mu_);
    last_ = report;
  }
  return report;
}

}  // namespace tessera::accounting
