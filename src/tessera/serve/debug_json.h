// File: tessera/serve/debug_json.h
//
// The JSON documents of the metrics listener's /debug/ledger and /debug/audit, one function per
// part (docs/self-healing.md describes every field). The service gathers the values; these
// functions only render them, so each part's shape is stated once.
//
// A report that has not run yet (its `at` is InfinitePast) renders as null. Times are UTC RFC
// 3339. Pure functions: safe from any thread.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include <nlohmann/json.hpp>

#include "tessera/accounting/auditor.h"
#include "tessera/accounting/node_registry.h"
#include "tessera/accounting/pod_feed.h"
#include "tessera/accounting/resyncer.h"
#include "tessera/ledger/ledger.h"
#include "tessera/serve/leader.h"
#include "tessera/serve/role_labels.h"

namespace tessera::serve {

// "2026-12-04T21:30:00.123Z": the millisecond UTC time of the /debug documents.
std::string DebugTime(absl::Time t);

nlohmann::json ProblemsJson(const ledger::Problems& problems);
nlohmann::json AuditJson(const accounting::AuditReport& report);
nlohmann::json ResyncJson(const accounting::ResyncReport& report, absl::Duration period);
// Every node of the snapshot with its devices, their usage and holders, and the registry's
// view of the node (format, availability, detail) when it knows it.
nlohmann::json NodesJson(const ledger::FullSnapshot& full,
                         const accounting::NodeRegistry& registry);
nlohmann::json ReservationsJson(const std::vector<ledger::Reservation>& reservations);
nlohmann::json PodFeedJson(const accounting::PodFeedStats& feed);
nlohmann::json LeadershipJson(const ElectorStatus& status, const std::string& detail,
                              const accounting::HandshakeWriter& writer);
nlohmann::json RoleLabelsJson(bool enabled, const RoleLabelStats& stats);

}  // namespace tessera::serve
