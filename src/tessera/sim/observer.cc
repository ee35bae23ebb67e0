#include "tessera/sim/observer.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/clock.h"

#include "tessera/sim/mig_oracle.h"
#include "tessera/sim/quota_oracle.h"

namespace tessera::sim {

Observer::Observer(Options options)
    : options_(std::move(options)), oracle_(options_.scenario->window) {}

void Observer::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Observer::Stop() {
  stop_ = true;
  if (thread_.joinable()) {
    thread_.join();
  }
}

void Observer::AddViolation(absl::Time at, std::string what) {
  MutexLock l(&mutex_);
  oracle_.AddViolation(at, std::move(what));
}

void Observer::Finish(absl::Time end) {
  MutexLock l(&mutex_);
  oracle_.Finish(end);
}

void Observer::Report(RunResult* out) {
  MutexLock l(&mutex_);
  out->divergences = oracle_.divergences();
  out->violations = oracle_.violations();
  out->transient_divergences = oracle_.transient();
  out->transient_fault_spans = oracle_.transient_fault_spans();
  out->observations = oracle_.observations();
  out->compared = oracle_.compared();
}

void Observer::Observe() {
  std::vector<kube::Pod> pods;
  std::vector<kube::Node> nodes;
  kube::ListOptions lo;
  lo.limit = 500;
  while (true) {
    absl::StatusOr<kube::PodList> page = options_.client->ListPods(lo);
    if (!page.ok()) {
      return;  // apisim down or failing: no observation
    }
    for (kube::Pod& p : page->items) {
      pods.push_back(std::move(p));
    }
    if (page->meta.continue_token.empty()) {
      break;
    }
    lo.continue_token = page->meta.continue_token;
  }
  kube::ListOptions no;
  absl::StatusOr<kube::NodeList> nl = options_.client->ListNodes(no);
  if (!nl.ok()) {
    return;
  }
  nodes = std::move(nl->items);
  std::vector<kube::ResourceQuota> quotas;
  if (!options_.scenario->namespaces.empty()) {
    absl::StatusOr<kube::ResourceQuotaList> ql = options_.client->ListResourceQuotas(no);
    if (!ql.ok()) {
      return;
    }
    quotas = std::move(ql->items);
  }
  if (options_.on_evicted) {
    MutexLock l(&options_.book->mutex);
    for (const kube::Pod& p : pods) {
      if (!p.Deleting()) {
        continue;
      }
      auto it = options_.book->pods.find(p.meta.name);
      if (it == options_.book->pods.end() ||
          (it->second.stage != Stage::kBound && it->second.stage != Stage::kRunning)) {
        continue;  // not the workload's, or its own deletion
      }
      it->second.stage = Stage::kDeleting;
      options_.book->terminating.insert(p.meta.name);
      ++options_.book->result.evicted;
      options_.on_evicted(p.meta.name);
    }
  }
  const absl::Time now = options_.clock->Now();
  kube::Request r;
  r.path = "/metrics";
  kube::DoOptions once;
  once.retry.max_attempts = 1;
  absl::StatusOr<kube::Response> resp = kube::Do(*options_.metrics, r, std::move(once));
  std::optional<Exported> exported;
  if (resp.ok()) {
    absl::StatusOr<Exported> e = ParseMetrics(resp->body);
    if (e.ok()) {
      exported = std::move(*e);
    }
  }
  const Truth truth = ComputeTruth(nodes, pods);
  std::optional<MigObservation> mig;
  if (options_.scenario->mig_share > 0) {
    mig.emplace();
    mig->truth = ComputeMigTruth(nodes, pods);
    if (resp.ok()) {
      absl::StatusOr<MigInstances> instances = ParseMigInstances(resp->body);
      if (instances.ok()) {
        mig->exported = std::move(*instances);
      }
    }
  }
  std::optional<QuotaObservation> quota;
  if (!options_.scenario->namespaces.empty()) {
    quota.emplace();
    quota->truth = ComputeQuotaTruth(truth, pods, quotas);
    if (resp.ok()) {
      absl::StatusOr<QuotaUsed> used = ParseQuotaUsed(resp->body);
      if (used.ok()) {
        quota->exported = std::move(*used);
      }
    }
  }
  std::string cause;
  absl::Time start;
  {
    MutexLock l(&options_.book->mutex);
    if (now - options_.book->last_fault_at <= options_.scenario->window) {
      cause = options_.book->last_fault;
    }
    start = options_.book->result.start;
  }
  Sample sample;
  sample.at = now - start;
  sample.truth_mib = truth.total_usedmem;
  sample.live_pods = static_cast<int64_t>(pods.size());
  if (resp.ok()) {
    sample.requeued = ParseRequeuedTotal(resp->body);
  }
  if (exported.has_value()) {
    sample.exported_mib = 0;
    for (const auto& [uuid, d] : exported->devices) {
      sample.exported_mib += d.usedmem;
    }
  }
  {
    MutexLock l(&mutex_);
    oracle_.Observe(now, truth, exported.has_value() ? &*exported : nullptr, cause,
                    quota.has_value() ? &*quota : nullptr, mig.has_value() ? &*mig : nullptr);
    sample.diverging = static_cast<int64_t>(oracle_.open());
    sample.diverging_shares = static_cast<int64_t>(oracle_.open_shares());
  }
  MutexLock l(&options_.book->mutex);
  options_.book->diverging_now = sample.diverging;
  options_.book->result.samples.push_back(sample);
}

void Observer::Loop() {
  absl::Time next = options_.clock->Now();
  while (!stop_.load()) {
    const absl::Time now = options_.clock->Now();
    if (now < next) {
      absl::SleepFor(std::min(next - now, absl::Milliseconds(100)));
      continue;
    }
    next = now + absl::Seconds(1);
    Observe();
  }
}

}  // namespace tessera::sim
