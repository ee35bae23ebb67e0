#include "tessera/serve/leadership.h"

#include <optional>
#include <utility>

#include "tessera/base/logging.h"
#include "tessera/base/status_macros.h"
#include "tessera/serve/debug_json.h"

namespace tessera::serve {

absl::StatusOr<std::unique_ptr<Leadership>> Leadership::Create(ElectorOptions elector,
                                                               RoleLabelOptions labels,
                                                               std::string_view default_namespace,
                                                               Parts parts) {
  elector.clock = parts.clock;
  elector.on_change = nullptr;  // the housekeeping loop polls generation()
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Elector> e,
                           Elector::Create(parts.client, std::move(elector)));
  std::unique_ptr<Leadership> leadership(new Leadership(parts, std::move(e)));
  Leadership* self = leadership.get();
  // Only the leader writes; the check is repeated at each write (leadership can end between
  // the loop's check and the PATCH).
  leadership->writer_ = std::make_unique<accounting::HandshakeWriter>(
      parts.client,
      accounting::HandshakeWriter::Options{.is_leader = [self] { return self->IsLeader(); }});

  if (labels.ns.empty()) {
    labels.ns = std::string(default_namespace);
  }
  labels.is_leader = [self] { return self->IsLeader(); };
  labels.observed = [pods = parts.pods,
                     ns = labels.ns](std::string_view name) -> std::optional<kube::Pod> {
    auto pod = pods->store().Get(ns + "/" + std::string(name));
    return pod == nullptr ? std::nullopt : std::optional<kube::Pod>(*pod);
  };
  if (!labels.enabled) {
    TESSERA_LOG(kInfo, "serve: scheduler-role pod labels off (--scheduler-role-labels=false)");
  } else if (labels.pod_name.empty()) {
    TESSERA_LOG(kInfo,
                "serve: scheduler-role pod labels off: POD_NAME is not set (give the pod its "
                "name through the downward API to have the leader label the scheduler pods)");
  } else {
    TESSERA_LOG(kInfo,
                "serve: the leader labels the pods {} in namespace {} with {}=leader (this pod: "
                "{}) or {}",
                labels.selector, labels.ns, kSchedulerRoleLabel, labels.pod_name, kRoleFollower);
  }
  leadership->role_labels_ = std::make_unique<RoleLabeler>(parts.client, std::move(labels));
  return leadership;
}

Leadership::Leadership(Parts parts, std::unique_ptr<Elector> elector)
    : parts_(parts), elector_(std::move(elector)) {}

nlohmann::json Leadership::DebugJson() const {
  const ElectorStatus status = elector_->status();
  nlohmann::json doc = LeadershipJson(status, elector_->Describe(), *writer_);
  doc["role_labels"] = RoleLabelsJson(role_labels_->enabled(), role_labels_->stats());
  return doc;
}

void Leadership::Begin() {
  elector_->Step();
  parts_.metrics->SetLeader(elector_->IsLeader());
  TESSERA_LOG(kInfo, "serve: leadership: {}", elector_->Describe());
  elector_->Start();
}

bool Leadership::Tick(absl::Time now) {
  const bool leader = elector_->IsLeader();
  parts_.metrics->SetLeader(leader);
  const uint64_t gen = elector_->generation();
  if (gen != generation_) {
    generation_ = gen;
    if (leader) {
      parts_.registry->ResetAsks();  // what was asked for as a follower was dropped
    }
  }
  // HAMi's scheduler-role labels: at each gain, every minute and on a difference seen.
  role_labels_->Tick(now, leader, gen);
  return leader;
}

void Leadership::WriteHandshakes(const std::vector<accounting::NodePatch>& patches, bool leader) {
  if (patches.empty()) {
    return;
  }
  if (leader) {
    writer_->WriteAll(patches);
  } else {
    TESSERA_VLOG(2, "follower: {} handshake writes left to the leader", patches.size());
  }
}

void Leadership::Stop() {
  elector_->Stop();  // after the last write: releases an own Lease for a quick takeover
  parts_.metrics->SetLeader(false);
}

}  // namespace tessera::serve
