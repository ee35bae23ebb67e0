#include "tessera/cycle/cycle.h"

#include <string_view>
#include <utility>

#include "tessera/device/mig.h"

namespace tessera::cycle {

Decoded Decode(const device::Vendor& vendor, const kube::Pod& pod, DecodeMode mode) {
  Decoded out;
  absl::StatusOr<device::PodRequest> request = vendor.DecodeRequest(pod);
  if (!request.ok()) {
    out.error = request.status();
    return out;
  }
  out.request = *std::move(request);
  if (mode == DecodeMode::kFilter && out.request.Empty()) {
    out.code = DecodeCode::kPassThrough;
    return out;
  }
  absl::StatusOr<device::PodConstraints> constraints = vendor.DecodeConstraints(pod);
  if (!constraints.ok()) {
    out.error = constraints.status();
    return out;
  }
  out.constraints = *std::move(constraints);
  out.code = out.request.Empty() ? DecodeCode::kPassThrough : DecodeCode::kRequest;
  return out;
}

void Snapshot(const Input& in, std::vector<schedule::Candidate>* candidates) {
  std::vector<std::string_view> names;
  names.reserve(candidates->size());
  for (const schedule::Candidate& c : *candidates) {
    names.push_back(c.name);
  }
  std::vector<std::optional<device::NodeSnapshot>> snapshots = in.ledger->Snapshot(names);
  for (size_t i = 0; i < candidates->size(); ++i) {
    if (snapshots[i] || !in.unknown) {
      (*candidates)[i].snapshot = std::move(snapshots[i]);
    } else {
      (*candidates)[i].snapshot = in.unknown(i);
    }
  }
}

schedule::NamespaceQuota PreCheck(const Config& config, const Input& in) {
  // Read from the same view as the devices: under the live filter's lock, concurrent filters of
  // one namespace see each other's reservations in its usage, so together they cannot pass it.
  return config.quotas != nullptr ? config.quotas->Quota(in.pod->meta.ns, *in.ledger)
                                  : schedule::NamespaceQuota();
}

schedule::Decision Place(const Config& config, const Input& in,
                         const std::vector<schedule::Candidate>& candidates,
                         const schedule::NamespaceQuota& quota) {
  return schedule::Decide(candidates, *in.request, *in.constraints, config.node_policy,
                          config.gpu_policy, quota.Limited() ? &quota : nullptr);
}

absl::Status Reserve(const Input& in, const std::vector<schedule::Candidate>& candidates,
                     const schedule::Decision& decision) {
  if (in.reserve_in == nullptr || !decision.winner) {
    return absl::OkStatus();
  }
  const kube::ObjectMeta& pod = in.pod->meta;
  return in.reserve_in->Reserve(pod.uid, pod.ns, pod.name, candidates[*decision.winner].name,
                                decision.devices, in.expiry,
                                static_cast<int32_t>(in.request->init_count),
                                device::MigAllocationsOf(decision.devices, decision.mig));
}

Result Run(const Config& config, const Input& in, std::vector<schedule::Candidate>* candidates) {
  Result r;
  Snapshot(in, candidates);
  r.quota = PreCheck(config, in);
  r.decision = Place(config, in, *candidates, r.quota);
  r.reserved = Reserve(in, *candidates, r.decision);
  if (in.diagnose) {
    r.diagnosis = Diagnose(*candidates, r.decision, r.quota);
  }
  return r;
}

}  // namespace tessera::cycle
