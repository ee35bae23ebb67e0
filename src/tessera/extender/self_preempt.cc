#include "tessera/extender/self_preempt.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "tessera/base/logging.h"
#include "tessera/extender/scheduler_internal.h"

namespace tessera::extender {
namespace {

// kube-scheduler's order key for one node (smaller is better).
struct Rank {
  int64_t pdb_violations;
  int64_t highest;  // the most important victim's priority
  int64_t sum;      // sum of (priority + 2^31): non-negative, as kube-scheduler sums them
  int64_t count;
  int64_t earliest_start_negated;  // the latest "earliest start of the most important" is best

  auto Key() const {
    return std::make_tuple(pdb_violations, highest, sum, count, earliest_start_negated);
  }
};

Rank RankOf(const PreemptionCandidate& c) {
  Rank r{.pdb_violations = c.pdb_violations,
         .highest = std::numeric_limits<int32_t>::min(),
         .sum = 0,
         .count = static_cast<int64_t>(c.victims.size()),
         .earliest_start_negated = 0};
  for (const cycle::PotentialVictim& v : c.victims) {
    r.highest = std::max<int64_t>(r.highest, v.priority);
    r.sum += static_cast<int64_t>(v.priority) + (int64_t{1} << 31);
  }
  int64_t earliest = std::numeric_limits<int64_t>::max();
  for (const cycle::PotentialVictim& v : c.victims) {
    if (v.priority == r.highest) {
      earliest = std::min(earliest, v.start_unix);
    }
  }
  r.earliest_start_negated = c.victims.empty() ? 0 : -earliest;
  return r;
}

}  // namespace

std::optional<size_t> PickNode(const std::vector<PreemptionCandidate>& candidates) {
  std::optional<size_t> best;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!best || RankOf(candidates[i]).Key() < RankOf(candidates[*best]).Key()) {
      best = i;
    }
  }
  return best;
}

SelfPreemptor::SelfPreemptor(Options options, Deps deps)
    : options_(options), deps_(std::move(deps)) {}

void SelfPreemptor::Refused(const kube::Pod& pod, std::vector<std::string> nodes) {
  if (pod.priority <= 0 || pod.preempt_never || pod.meta.uid.empty() || nodes.empty()) {
    return;
  }
  const absl::Time now = deps_.clock->Now();
  MutexLock l(&mu_);
  auto it = refused_.find(pod.meta.uid);
  if (it != refused_.end()) {
    it->second.nodes = std::move(nodes);  // the latest filter's; the refusal keeps its start
    return;
  }
  if (refused_.size() >= options_.max_pods) {
    return;
  }
  refused_.emplace(
      pod.meta.uid,
      Refusal{.ns = pod.meta.ns, .name = pod.meta.name, .nodes = std::move(nodes), .since = now});
}

SelfPreemptor::Counts SelfPreemptor::counts() const {
  MutexLock l(&mu_);
  return counts_;
}

size_t SelfPreemptor::tracked() const {
  MutexLock l(&mu_);
  return refused_.size();
}

void SelfPreemptor::Round() {
  const absl::Time now = deps_.clock->Now();
  // The due refusals, highest priority first (then the oldest), outside the lock.
  std::vector<std::pair<kube::Pod, std::vector<std::string>>> due;
  {
    MutexLock l(&mu_);
    for (auto it = refused_.begin(); it != refused_.end();) {
      auto current = it++;
      std::optional<kube::Pod> pod = deps_.lookup(current->second.ns, current->second.name);
      if (!pod || pod->meta.uid != current->first || !internal::NotPending(*pod).ok()) {
        refused_.erase(current);  // bound, finished or gone: nothing to preempt for
        continue;
      }
      if (current->second.since + options_.settle <= now &&
          !deps_.scheduler->IsNominated(current->first)) {
        due.emplace_back(*std::move(pod), current->second.nodes);
      }
    }
  }
  std::sort(due.begin(), due.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(-static_cast<int64_t>(a.first.priority), a.first.meta.uid) <
           std::make_tuple(-static_cast<int64_t>(b.first.priority), b.first.meta.uid);
  });
  for (const auto& [pod, nodes] : due) {
    if (PreemptFor(pod, nodes)) {
      MutexLock l(&mu_);
      refused_.erase(pod.meta.uid);
    }
  }
}

bool SelfPreemptor::PreemptFor(const kube::Pod& pod, const std::vector<std::string>& nodes) {
  PreemptArgs args;
  args.pod = pod;
  for (const std::string& n : nodes) {
    args.victims[n];  // offered without victims: kube-scheduler proposes none here
  }
  PreemptOutcome outcome;
  absl::StatusOr<PreemptResult> answer = deps_.preemptor->Preempt(args, &outcome);
  if (!answer.ok()) {
    TESSERA_LOGS(kWarning, "self-preemption: cannot choose victims", "pod", pod.Key(), "err",
                 internal::Message(answer.status()));
    return false;
  }
  std::vector<PreemptionCandidate> candidates;
  size_t guarded = 0;  // nodes whose victims a budget protects
  for (auto& [node, victims] : outcome.added) {
    const int64_t violations = answer->victims.at(node).num_pdb_violations;
    if (victims.empty()) {
      // It fits there without evicting anyone: capacity freed since the refusal, and
      // kube-scheduler's next attempt (the requeue's) places it.
      return true;
    }
    if (violations > 0) {
      ++guarded;
      continue;  // the Eviction API would refuse a victim its budget protects
    }
    candidates.push_back({.node = node, .victims = victims, .pdb_violations = violations});
  }
  std::optional<size_t> pick = PickNode(candidates);
  if (!pick) {
    {
      MutexLock l(&mu_);
      ++counts_.hopeless;
    }
    TESSERA_VLOGS(1, "self-preemption: no eviction of lower-priority pods frees a share", "pod",
                  pod.Key(), "nodes", nodes.size(), "guarded", guarded);
    deps_.scheduler->NotePreemption(
        pod.meta.uid,
        guarded > 0 ? fmt::format("no eviction of lower-priority pods frees a GPU share on {} {} "
                                  "without breaking a PodDisruptionBudget",
                                  nodes.size(), nodes.size() == 1 ? "node" : "nodes")
                    : fmt::format("no eviction of lower-priority pods frees a GPU share on {} {}",
                                  nodes.size(), nodes.size() == 1 ? "node" : "nodes"));
    return false;
  }
  const PreemptionCandidate& chosen = candidates[*pick];
  uint64_t evicted = 0;
  for (const cycle::PotentialVictim& v : chosen.victims) {
    absl::Status s = deps_.client->EvictPod(v.ns, v.name, v.uid);
    if (s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kAborted) {
      continue;  // gone already (404), or another pod by that name now (409): its share is free
    }
    if (!s.ok()) {
      {
        MutexLock l(&mu_);
        counts_.evicted += evicted;
        ++counts_.refused;
      }
      TESSERA_LOGS(kWarning,
                   "self-preemption: an eviction was refused; the node is abandoned "
                   "for this round",
                   "pod", pod.Key(), "node", chosen.node, "victim", v.ns + "/" + v.name, "err",
                   internal::Message(s));
      return false;
    }
    ++evicted;
    kube::ObjectMeta subject;
    subject.ns = v.ns;
    subject.name = v.name;
    subject.uid = v.uid;
    deps_.scheduler->events().Record(
        subject, "Preempted",
        fmt::format("Tessera evicted this pod to free a GPU share on {} for {} (priority {})",
                    chosen.node, pod.Key(), pod.priority),
        EventType::kNormal);
  }
  deps_.scheduler->Nominate(pod, {chosen.node});
  deps_.scheduler->NotePreemption(pod.meta.uid, "");
  const std::string names = VictimNames(chosen.victims);
  deps_.scheduler->events().Record(
      pod.meta, "PreemptionVictimsEvicted",
      fmt::format("to free a GPU share on {}, Tessera evicted: {}", chosen.node, names),
      EventType::kNormal);
  TESSERA_LOGS(kInfo, "self-preemption", "pod", pod.Key(), "priority", pod.priority, "node",
               chosen.node, "evicted", names);
  MutexLock l(&mu_);
  counts_.evicted += evicted;
  ++counts_.preempted;
  return true;
}

}  // namespace tessera::extender
