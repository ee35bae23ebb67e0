#include "tessera/serve/debug_json.h"

#include <optional>
#include <string>
#include <utility>

#include "tessera/device/codec.h"
#include "tessera/device/mig.h"

namespace tessera::serve {

std::string DebugTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

namespace {

nlohmann::json DecisionJson(const ledger::Decision& d) {
  return {{"node", d.node},
          {"devices", d.unreadable ? "" : device::EncodePodDevices(d.devices)},
          {"mig_allocations", device::EncodeMigAllocations(d.mig)},
          {"unreadable", d.unreadable},
          {"text", ledger::DecisionText(d)}};
}

}  // namespace

nlohmann::json ProblemsJson(const ledger::Problems& problems) {
  nlohmann::json conflicts = nlohmann::json::array();
  for (const ledger::Conflict& c : problems.conflicts) {
    conflicts.push_back({{"namespace", c.ns},
                         {"name", c.name},
                         {"uid", c.uid},
                         {"annotated_node", c.node},
                         {"bound_node", c.bound_node}});
  }
  nlohmann::json orphans = nlohmann::json::array();
  for (const ledger::Orphan& o : problems.orphans) {
    orphans.push_back({{"namespace", o.ns},
                       {"name", o.name},
                       {"uid", o.uid},
                       {"node", o.node},
                       {"uuid", o.uuid},
                       {"container", o.container},
                       {"reserved", o.reserved}});
  }
  nlohmann::json unregistered = nlohmann::json::array();
  for (const ledger::Unregistered& u : problems.unregistered) {
    unregistered.push_back({{"namespace", u.ns},
                            {"name", u.name},
                            {"uid", u.uid},
                            {"node", u.node},
                            {"reserved", u.reserved}});
  }
  nlohmann::json unreadable = nlohmann::json::array();
  for (const ledger::Unreadable& u : problems.unreadable) {
    unreadable.push_back({{"namespace", u.ns}, {"name", u.name}, {"uid", u.uid}, {"node", u.node}});
  }
  nlohmann::json rewritten = nlohmann::json::array();
  for (const ledger::Rewritten& r : problems.rewritten) {
    rewritten.push_back({{"namespace", r.ns},
                         {"name", r.name},
                         {"uid", r.uid},
                         {"kept", DecisionJson(r.kept)},
                         {"rewritten", DecisionJson(r.observed)}});
  }
  return {{"conflicts", std::move(conflicts)},
          {"orphans", std::move(orphans)},
          {"unregistered", std::move(unregistered)},
          {"unreadable", std::move(unreadable)},
          {"rewritten", std::move(rewritten)}};
}

namespace {

nlohmann::json ForeignJson(const std::vector<accounting::ForeignAllocation>& foreign) {
  nlohmann::json out = nlohmann::json::array();
  for (const accounting::ForeignAllocation& f : foreign) {
    out.push_back({{"namespace", f.ns},
                   {"name", f.name},
                   {"uid", f.uid},
                   {"scheduler", f.scheduler},
                   {"node", f.node}});
  }
  return out;
}

nlohmann::json MigProblemsJson(const std::vector<ledger::MigProblem>& problems) {
  nlohmann::json out = nlohmann::json::array();
  for (const ledger::MigProblem& p : problems) {
    out.push_back({{"kind", ledger::MigProblemKindName(p.kind)},
                   {"namespace", p.ns},
                   {"name", p.name},
                   {"uid", p.uid},
                   {"node", p.node},
                   {"uuid", p.uuid},
                   {"why", p.why}});
  }
  return out;
}

nlohmann::json QuotaJson(const std::vector<accounting::QuotaCorrection>& quota) {
  nlohmann::json out = nlohmann::json::array();
  auto usage = [](const ledger::NamespaceUsage& u) {
    return nlohmann::json{{"mem_mib", u.usedmem}, {"cores", u.usedcores}, {"holders", u.holders}};
  };
  for (const accounting::QuotaCorrection& q : quota) {
    out.push_back({{"namespace", q.ns},
                   {"filter_used", usage(q.filter)},
                   {"truth", usage(q.truth)},
                   {"after", usage(q.after)}});
  }
  return out;
}

}  // namespace

nlohmann::json ResyncJson(const accounting::ResyncReport& r, absl::Duration period) {
  if (r.at == absl::InfinitePast()) {
    return nullptr;  // not run yet
  }
  return {{"at", DebugTime(r.at)},
          {"took_ms", absl::ToDoubleMilliseconds(r.took)},
          {"paused_ms", absl::ToDoubleMilliseconds(r.paused)},
          {"period_s", absl::ToDoubleSeconds(period)},
          {"pods", r.pods},
          {"nodes", r.nodes},
          {"list_requests", r.requests},
          {"corrections", r.corrections},
          {"details", r.details},
          {"error", r.error}};
}

nlohmann::json AuditJson(const accounting::AuditReport& r) {
  if (r.at == absl::InfinitePast()) {
    return nullptr;  // not run yet
  }
  return {{"at", absl::FormatTime(absl::RFC3339_sec, r.at, absl::UTCTimeZone())},
          {"took_ms", absl::ToDoubleMilliseconds(r.took)},
          {"pods", r.pods},
          {"nodes", r.nodes},
          {"corrections", r.corrections},
          {"details", r.details},
          {"conflicts", r.problems.conflicts.size()},
          {"orphans", r.problems.orphans.size()},
          {"unregistered", r.problems.unregistered.size()},
          {"unreadable", r.problems.unreadable.size()},
          {"rewritten", r.problems.rewritten.size()},
          {"foreign_allocations", ForeignJson(r.foreign)},
          {"mig", MigProblemsJson(r.problems.mig)},
          {"quota", QuotaJson(r.quota)}};
}

nlohmann::json NodesJson(const ledger::FullSnapshot& full,
                         const accounting::NodeRegistry& registry) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const ledger::NodeView& view : full.nodes) {
    nlohmann::json devices = nlohmann::json::array();
    for (size_t i = 0; i < view.devices->devices.size(); ++i) {
      const device::DeviceInfo& d = view.devices->devices[i];
      const device::DeviceUsage& u = view.usage[i];
      nlohmann::json holders = nlohmann::json::array();
      for (const ledger::Holder& h : view.holders[i]) {
        holders.push_back({{"namespace", h.ns},
                           {"name", h.name},
                           {"uid", h.uid},
                           {"container", h.container},
                           {"init", h.init},
                           {"usedmem_mib", h.usedmem},
                           {"usedcores", h.usedcores},
                           {"reserved", h.reserved}});
      }
      devices.push_back({{"uuid", d.id},
                         {"index", d.index},
                         {"type", d.type},
                         {"health", d.health},
                         {"cordoned", view.devices->IsCordoned(d.id)},
                         {"count", d.count},
                         {"devmem_mib", d.devmem},
                         {"devcore", d.devcore},
                         {"used", u.used},
                         {"usedmem_mib", u.usedmem},
                         {"usedcores", u.usedcores},
                         {"pods", std::move(holders)}});
    }
    nlohmann::json node = {{"name", view.devices->node}, {"devices", std::move(devices)}};
    if (std::optional<accounting::NodeStatus> s = registry.Find(view.devices->node)) {
      node["format"] = std::string(accounting::NodeFormatName(s->format));
      node["availability"] = std::string(accounting::AvailabilityName(s->availability));
      node["detail"] = s->detail;
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

nlohmann::json ReservationsJson(const std::vector<ledger::Reservation>& reservations) {
  nlohmann::json out = nlohmann::json::array();
  for (const ledger::Reservation& r : reservations) {
    out.push_back(
        {{"namespace", r.ns},
         {"name", r.name},
         {"uid", r.uid},
         {"node", r.node},
         {"expires_at", absl::FormatTime(absl::RFC3339_sec, r.expires_at, absl::UTCTimeZone())}});
  }
  return out;
}

nlohmann::json PodFeedJson(const accounting::PodFeedStats& feed) {
  return {{"applied", feed.applied},
          {"removed", feed.removed},
          {"tombstones", feed.tombstones},
          {"uid_changes", feed.uid_changes},
          {"projection_errors", feed.projection_errors},
          {"rereserved", feed.rereserved},
          {"last_error", feed.last_error}};
}

nlohmann::json LeadershipJson(const ElectorStatus& status, const std::string& detail,
                              const accounting::HandshakeWriter& writer) {
  return {{"role", status.leader ? "leader" : "follower"},
          {"mode", std::string(LeaderModeName(status.mode))},
          {"lease", status.lease},
          {"holder", status.holder},
          {"identity", status.identity},
          {"detail", detail},
          {"handshake_writes", writer.written()},
          {"handshake_conflicts", writer.conflicts()},
          {"handshake_failures", writer.failures()}};
}

nlohmann::json RoleLabelsJson(bool enabled, const RoleLabelStats& stats) {
  return {{"enabled", enabled},
          {"passes", stats.passes},
          {"patches", stats.patches},
          {"failures", stats.failures},
          {"last_pass", stats.last_pass ? nlohmann::json(DebugTime(*stats.last_pass)) : nullptr},
          {"last_error", stats.last_error},
          {"pods", stats.roles}};
}

}  // namespace tessera::serve
