#include "tessera/extender/preempt.h"

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#include "tessera/cycle/preempt.h"

namespace tessera::extender {

std::string VictimNames(const std::vector<cycle::PotentialVictim>& victims) {
  std::string out;
  for (const cycle::PotentialVictim& v : victims) {
    absl::StrAppend(&out, out.empty() ? "" : ",", v.ns, "/", v.name);
  }
  return out;
}

std::string PreemptionNote(const PreemptOutcome& outcome, const PreemptResult& result) {
  if (outcome.never) {
    return "preemptionPolicy Never: it may not evict pods of lower priority";
  }
  if (outcome.pass_through || !result.victims.empty() || outcome.dropped.empty()) {
    return "";
  }
  return absl::StrCat("no eviction of lower-priority pods frees a GPU share on ",
                      outcome.dropped.size(), outcome.dropped.size() == 1 ? " node" : " nodes");
}

Preemptor::Preemptor(Deps deps) : deps_(std::move(deps)) {}

namespace {

// The device holders bound to `node` that the informer knows as that very pod, still running, not
// being deleted and of lower priority than `priority`; with the budgets they would violate, by
// kube-scheduler's count. The uids of those being deleted go to *leaving: they count as gone
// (kube-scheduler waits for them rather than preempt again), so a second call while an earlier
// victim terminates adds nobody.
absl::StatusOr<cycle::PotentialVictims> PotentialOn(const cycle::HoldersByNode::OnNode& on,
                                                    std::string_view node, int32_t priority,
                                                    const Preemptor::Deps& deps,
                                                    absl::flat_hash_set<std::string>* leaving) {
  cycle::PotentialVictims out;
  if (!deps.lookup) {
    return out;
  }
  std::vector<kube::Pod> pods;
  for (const ledger::PodAllocation& r : on.records) {
    if (r.bound_node != node) {
      continue;
    }
    std::optional<kube::Pod> pod = deps.lookup(r.ns, r.name);
    if (!pod || pod->meta.uid != r.uid || pod->node_name != node || pod->Terminal()) {
      continue;
    }
    if (pod->Deleting()) {
      leaving->insert(r.uid);
      continue;
    }
    if (pod->priority >= priority) {
      continue;
    }
    pods.push_back(*std::move(pod));
  }
  // kube-scheduler's importance: priority descending, then the earlier start.
  std::sort(pods.begin(), pods.end(), [](const kube::Pod& a, const kube::Pod& b) {
    return std::make_tuple(-static_cast<int64_t>(a.priority), a.start_unix, a.meta.uid) <
           std::make_tuple(-static_cast<int64_t>(b.priority), b.start_unix, b.meta.uid);
  });
  std::vector<bool> violating(pods.size(), false);
  if (deps.budget_violations && !pods.empty()) {
    std::vector<const kube::Pod*> order;
    order.reserve(pods.size());
    for (const kube::Pod& p : pods) {
      order.push_back(&p);
    }
    absl::StatusOr<std::vector<bool>> v = deps.budget_violations(node, order);
    if (!v.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot read the PodDisruptionBudgets: ", v.status().message()));
    }
    if (v->size() == pods.size()) {
      violating = *std::move(v);
    }
  }
  for (size_t i = 0; i < pods.size(); ++i) {
    const kube::Pod& p = pods[i];
    out[p.meta.uid] = {.uid = p.meta.uid,
                       .ns = p.meta.ns,
                       .name = p.meta.name,
                       .priority = p.priority,
                       .start_unix = p.start_unix,
                       .violates_pdb = violating[i]};
  }
  return out;
}

}  // namespace

absl::StatusOr<PreemptResult> Preemptor::Preempt(const PreemptArgs& args,
                                                 PreemptOutcome* outcome) const {
  PreemptOutcome local;
  PreemptOutcome& out = outcome != nullptr ? *outcome : local;
  out = PreemptOutcome();

  // The stored pod, when the informer has this very one: a body may be stale or forged.
  kube::Pod pod = args.pod;
  if (deps_.lookup) {
    if (std::optional<kube::Pod> stored = deps_.lookup(args.pod.meta.ns, args.pod.meta.name);
        stored && stored->meta.uid == args.pod.meta.uid) {
      pod = *std::move(stored);
      out.stored = true;
    }
  }
  PreemptResult result;
  if (pod.preempt_never) {
    out.never = true;
    return result;
  }
  cycle::Decoded decoded = cycle::Decode(*deps_.vendor, pod, cycle::DecodeMode::kFilter);
  if (decoded.code == cycle::DecodeCode::kError) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod ", pod.Key(), ": ", decoded.error.message()));
  }
  if (decoded.code == cycle::DecodeCode::kPassThrough) {
    out.pass_through = true;
    result.victims = args.victims;
    return result;
  }

  const cycle::HoldersByNode holders = cycle::HoldersByNode::Of(*deps_.ledger);
  const cycle::Input in{.pod = &pod,
                        .request = &decoded.request,
                        .constraints = &decoded.constraints,
                        .ledger = deps_.ledger};
  for (const auto& [node, offered] : args.victims) {
    const cycle::HoldersByNode::OnNode* on = holders.Find(node);
    if (on == nullptr || on->devices == nullptr) {
      out.dropped.push_back(node);
      continue;
    }
    // Gone already: kube-scheduler's victims, and pods being deleted (an earlier preemption's
    // victims among them), which are leaving whatever is decided here.
    absl::flat_hash_set<std::string> evicted(offered.pod_uids.begin(), offered.pod_uids.end());
    absl::StatusOr<cycle::PotentialVictims> potential =
        PotentialOn(*on, node, pod.priority, deps_, &evicted);
    if (!potential.ok()) {
      return potential.status();
    }
    std::optional<cycle::NodeVictims> mine =
        cycle::VictimsOn(deps_.config, in, holders, node, *potential, evicted);
    if (!mine) {
      out.dropped.push_back(node);
      continue;
    }
    WireVictims& reply = result.victims[node];
    reply = offered;
    reply.num_pdb_violations += mine->pdb_violations;
    for (const cycle::PotentialVictim& v : mine->victims) {
      reply.pod_uids.push_back(v.uid);
    }
    out.added.emplace_back(node, std::move(mine->victims));
  }
  return result;
}

}  // namespace tessera::extender
