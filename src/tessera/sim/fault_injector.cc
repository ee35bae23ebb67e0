#include "tessera/sim/fault_injector.h"

#include <algorithm>
#include <cstddef>

#include <signal.h>

#include "absl/time/clock.h"
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "tessera/base/logging.h"
#include "tessera/sim/emulators.h"

namespace tessera::sim {
namespace {

using nlohmann::json;

}  // namespace

void FaultInjector::Repair() {
  {
    MutexLock l(&mutex_);
    drop_.reset();
    fail_.reset();
  }
  if (options_.real) {
    RealControlPlane* control_plane = options_.control_plane;
    if (!control_plane->Alive(control_plane->env().extender)) {
      (void)control_plane->Restart(control_plane->env().extender,
                                   false);  // a kill whose restart is due
    }
  } else {
    PushFaults();
    options_.children->EnsureServe();  // a kill whose restart is due
  }
  MutexLock l(&options_.book->mutex);
  for (SimNode& n : options_.book->nodes) {
    n.stopped = false;
  }
}

void FaultInjector::PushFaults() {
  json cfg = json::object();
  {
    MutexLock l(&mutex_);
    if (drop_.has_value()) {
      cfg["dropWatchEvents"] = {{{"resource", "pods"},
                                 {"type", drop_->first},
                                 {"probability", drop_->second},
                                 {"count", -1}}};
    }
    if (fail_.has_value()) {
      cfg["failRequests"] = {
          {"probability", fail_->probability}, {"code", fail_->code}, {"verbs", fail_->verbs}};
    }
  }
  kube::Request r;
  r.path = "/simulator/v1/faults";
  if (cfg.empty()) {
    r.method = "DELETE";
  } else {
    cfg["seed"] = options_.scenario->seed;
    r.method = "PUT";
    r.body = cfg.dump();
    r.content_type = "application/json";
  }
  absl::Status s = kube::Do(*options_.api, r, QuickRetry()).status();
  if (!s.ok()) {
    TESSERA_LOG(kWarning, "simulate: {} /simulator/v1/faults: {}", r.method, s.ToString());
  }
}

void FaultInjector::Inject(const FaultSpec& f) {
  if (options_.real && f.kind != FaultKind::kNodeDelete && f.kind != FaultKind::kPluginStop) {
    RealFault(f);  // the emulators' own faults (node, plugin) run below on both
    return;
  }
  const std::string kind(FaultKindName(f.kind));
  auto simulator = [this](const char* path) {
    kube::Request r;
    r.method = "POST";
    r.path = path;
    return kube::Do(*options_.api, r, QuickRetry()).status();
  };
  switch (f.kind) {
    case FaultKind::kDropEvents: {
      {
        MutexLock l(&mutex_);
        drop_ = std::make_pair(f.event_type, f.probability);
      }
      PushFaults();
      RecordFault(kind, fmt::format("{} pod events dropped (p={}) for {}",
                                    f.event_type.empty() ? "all" : f.event_type, f.probability,
                                    absl::FormatDuration(f.duration)));
      DeleteRandomLive(f.delete_burst, f.force);
      options_.later->Post(Now() + f.duration, [this] {
        {
          MutexLock l(&mutex_);
          drop_.reset();
        }
        PushFaults();
      });
      break;
    }
    case FaultKind::kSeverWatches:
      (void)simulator("/simulator/v1/sever-watches");
      RecordFault(kind, "every watch stream cut");
      DeleteRandomLive(f.delete_burst);
      break;
    case FaultKind::kCompact:
      (void)simulator("/simulator/v1/compact");
      (void)simulator("/simulator/v1/sever-watches");
      RecordFault(kind, "watch history compacted and every watch cut: informers relist");
      DeleteRandomLive(f.delete_burst);
      break;
    case FaultKind::kWatchOutage: {
      {
        MutexLock l(&mutex_);
        fail_ = RequestFailure{500, 1.0, {"watch"}};
      }
      PushFaults();
      (void)simulator("/simulator/v1/sever-watches");
      RecordFault(kind,
                  fmt::format("watches cut and refused for {}{}", absl::FormatDuration(f.duration),
                              f.compact ? ", then history compacted (relist)"
                                        : ", then resumed from the history"));
      DeleteRandomLive(f.delete_burst);
      const bool compact = f.compact;
      options_.later->Post(Now() + f.duration, [this, simulator, compact] {
        {
          MutexLock l(&mutex_);
          fail_.reset();
        }
        if (compact) {
          (void)simulator("/simulator/v1/compact");
        }
        PushFaults();
      });
      break;
    }
    case FaultKind::kApisimRestart: {
      RecordFault(kind, "apisim stopped (state saved) and started again");
      absl::Status s = options_.children->RestartApisim();
      if (!s.ok()) {
        TESSERA_LOG(kError, "simulate: {}", s.ToString());
      }
      PushFaults();
      break;
    }
    case FaultKind::kTesseraKill: {
      RecordFault(kind, fmt::format("tessera serve SIGKILLed, restarted after {}",
                                    absl::FormatDuration(f.duration)));
      options_.children->KillServe();
      options_.later->Post(Now() + f.duration, [this] {
        absl::Status s = options_.children->RestartServe();
        if (!s.ok()) {
          TESSERA_LOG(kError, "simulate: {}", s.ToString());
        }
      });
      break;
    }
    case FaultKind::kNodeDelete: {
      std::vector<std::string> victims;
      std::vector<std::string> pods;
      {
        MutexLock l(&options_.book->mutex);
        std::vector<size_t> alive;
        for (size_t i = 0; i < options_.book->nodes.size(); ++i) {
          if (options_.book->nodes[i].alive) {
            alive.push_back(i);
          }
        }
        for (int k = 0; k < f.count && alive.size() > 1; ++k) {
          const size_t pick = options_.random() % alive.size();
          options_.book->nodes[alive[pick]].alive = false;
          victims.push_back(options_.book->nodes[alive[pick]].name);
          alive.erase(alive.begin() + static_cast<std::ptrdiff_t>(pick));
        }
        for (auto& [name, p] : options_.book->pods) {
          if (p.stage != Stage::kGone && p.stage != Stage::kPending &&
              p.stage != Stage::kCreating &&
              std::find(victims.begin(), victims.end(), p.node) != victims.end()) {
            pods.push_back(name);
          }
        }
      }
      for (const std::string& v : victims) {
        (void)DeleteNode(*options_.api, v);
      }
      // The node lifecycle controller's eviction, done at once.
      for (const std::string& name : pods) {
        if (DeletePod(*options_.api, options_.scenario->NamespaceOf(name), name, 0).ok()) {
          MutexLock l(&options_.book->mutex);
          if (options_.book->pods[name].stage != Stage::kGone) {
            options_.book->pods[name].stage = Stage::kGone;
            ++options_.book->result.deleted;
          }
        }
      }
      std::string names;
      for (const std::string& v : victims) {
        names += (names.empty() ? "" : ", ") + v;
      }
      RecordFault(kind, fmt::format("{} deleted with {} pods", names, pods.size()));
      break;
    }
    case FaultKind::kPluginStop: {
      std::string victim;
      {
        MutexLock l(&options_.book->mutex);
        for (int attempt = 0; attempt < 50 && victim.empty(); ++attempt) {
          SimNode& n = options_.book->nodes[options_.random() % options_.book->nodes.size()];
          if (n.alive && !n.stopped) {
            n.stopped = true;
            victim = n.name;
          }
        }
      }
      if (victim.empty()) {
        break;
      }
      RecordFault(kind, fmt::format("device plugin of {} silent for {}", victim,
                                    absl::FormatDuration(f.duration)));
      options_.later->Post(Now() + f.duration, [this, victim] {
        MutexLock l(&options_.book->mutex);
        if (SimNode* n = options_.book->NodeByName(victim); n != nullptr) {
          n->stopped = false;
          n->next_report = Now();
        }
      });
      break;
    }
    case FaultKind::kErrorStorm: {
      {
        MutexLock l(&mutex_);
        fail_ = RequestFailure{f.code, f.probability, {}};
      }
      PushFaults();
      RecordFault(kind, fmt::format("{} of requests answered {} for {}", f.probability, f.code,
                                    absl::FormatDuration(f.duration)));
      options_.later->Post(Now() + f.duration, [this] {
        {
          MutexLock l(&mutex_);
          fail_.reset();
        }
        PushFaults();
      });
      break;
    }
  }
}

bool FaultInjector::WaitApiserver(absl::Duration limit) {
  const absl::Time deadline = Now() + limit;
  while (Now() < deadline) {
    kube::Request r;
    r.path = "/readyz";
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    if (kube::Do(*options_.api, r, std::move(once)).ok()) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return false;
}

void FaultInjector::RealWatchLoss(const FaultSpec& f, bool force) {
  const std::string kind(FaultKindName(f.kind));
  const absl::Time t0 = Now();
  const std::string target = options_.control_plane->env().extender;  // the scheduler under test
  absl::Status frozen = options_.control_plane->Signal(target, SIGSTOP);
  if (!frozen.ok()) {
    TESSERA_LOG(kError, "simulate: {}: cannot freeze {}: {}", kind, target, frozen.ToString());
    return;
  }
  // A write while the scheduler is frozen: the revision the new API server's watch cache starts
  // at is then past the last one the scheduler saw, even when the cluster was quiet (else its
  // watches would resume from that cache and get the deletions as events, not a 410).
  {
    kube::Request r;
    r.method = "POST";
    r.path = fmt::format("/api/v1/namespaces/{}/configmaps", kNamespace);
    r.content_type = "application/json";
    r.body = R"({"metadata":{"generateName":"sim-fault-"},"data":{"fault":"watch loss"}})";
    absl::Status wrote = kube::Do(*options_.api, r, QuickRetry()).status();
    if (!wrote.ok()) {
      TESSERA_LOG(kWarning, "simulate: {}: the write before the restart failed: {}", kind,
                  wrote.ToString());
    }
  }
  // Every watch cut while serve cannot reconnect; the new API server's watch cache starts at
  // the current revision.
  absl::Status restarted = options_.control_plane->Restart("kube-apiserver", true);
  const bool ready = restarted.ok() && WaitApiserver(absl::Seconds(60));
  if (!ready) {
    TESSERA_LOG(kError, "simulate: {}: kube-apiserver not ready again after its restart: {}", kind,
                restarted.ToString());
  }
  // The revision before the deletions.
  std::string rv;
  {
    kube::Request r;
    r.path = fmt::format("/api/v1/namespaces/{}/pods?limit=1", kNamespace);
    absl::StatusOr<kube::Response> resp = kube::Do(*options_.api, r, QuickRetry());
    if (resp.ok()) {
      json j = json::parse(resp->body, nullptr, false);
      if (j.is_object()) {
        rv = j["metadata"].value("resourceVersion", "");
      }
    }
  }
  const std::vector<std::string> victims = options_.pick_live(f.delete_burst, /*bound_only=*/force);
  RecordFault(kind, "");  // the detail follows below, once known
  for (const std::string& name : victims) {
    options_.delete_pod(name, force);
  }
  // Until an exact LIST at that revision is refused (410): it is compacted (bounded).
  bool compacted = false;
  const absl::Time deadline = Now() + absl::Seconds(30);
  while (!rv.empty() && Now() < deadline) {
    kube::Request r;
    r.path = fmt::format(
        "/api/v1/namespaces/{}/pods?resourceVersion={}&resourceVersionMatch=Exact&limit=1",
        kNamespace, rv);
    kube::DoOptions once;
    once.retry.max_attempts = 1;
    absl::StatusOr<kube::Response> resp = kube::Do(*options_.api, r, std::move(once));
    if (!resp.ok() && absl::IsOutOfRange(resp.status())) {
      compacted = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  if (Now() < t0 + f.duration) {
    absl::SleepFor(t0 + f.duration - Now());
  }
  const absl::Status thawed = options_.control_plane->Signal(target, SIGCONT);
  const std::string detail = fmt::format(
      "{} frozen (SIGSTOP) for {:.1f} s; kube-apiserver SIGKILLed and restarted{} "
      "while frozen (every watch cut); {} pods deleted{}; {}; {} thawed{}: its watches "
      "resume into 410 and relist",
      target == "tessera" ? "tessera serve" : target, absl::ToDoubleSeconds(Now() - t0),
      ready ? "" : " (NOT ready again within 60 s)", victims.size(), force ? " with grace 0" : "",
      compacted ? fmt::format("revision {} (before the deletions) compacted", rv)
                : fmt::format("revision {} NOT compacted within 30 s", rv),
      target, thawed.ok() ? "" : " (SIGCONT failed: " + thawed.ToString() + ")");
  MutexLock l(&options_.book->mutex);
  for (auto it = options_.book->result.faults.rbegin(); it != options_.book->result.faults.rend();
       ++it) {
    if (it->kind == kind && it->detail.empty()) {
      it->detail = detail;
      break;
    }
  }
}

void FaultInjector::RealFault(const FaultSpec& f) {
  const std::string kind(FaultKindName(f.kind));
  auto skip = [&](const std::string& why) {
    MutexLock l(&options_.book->mutex);
    options_.book->result.skipped_faults.push_back(
        {Now() - options_.book->result.start, kind, why});
  };
  auto restart_apiserver = [&](bool kill) {
    absl::Status s = options_.control_plane->Restart("kube-apiserver", kill);
    if (!s.ok() || !WaitApiserver(absl::Seconds(60))) {
      TESSERA_LOG(kError, "simulate: {}: kube-apiserver not ready again after its restart: {}",
                  kind, s.ToString());
    }
  };
  switch (f.kind) {
    case FaultKind::kDropEvents:
      if (f.event_type != "DELETED" && !f.event_type.empty()) {
        skip(fmt::format("a real kube-apiserver does not drop {} events on demand (apisim only)",
                         f.event_type));
        break;
      }
      // The real way to lose DELETED events: deletions while serve's watches are down, past a
      // compaction, so that its watches resume into 410 (the seed path).
      RealWatchLoss(f, f.force);
      break;
    case FaultKind::kWatchOutage:
      RealWatchLoss(f, false);
      break;
    case FaultKind::kSeverWatches:
    case FaultKind::kCompact:
      RecordFault(kind, f.kind == FaultKind::kSeverWatches
                            ? "kube-apiserver SIGKILLed and restarted: every watch cut"
                            : "kube-apiserver SIGKILLed and restarted: every watch cut, the new "
                              "watch cache starts at the current revision (compaction every 2 s)");
      restart_apiserver(true);
      DeleteRandomLive(f.delete_burst);
      break;
    case FaultKind::kApisimRestart:
      RecordFault(kind, "kube-apiserver restarted (SIGTERM, graceful), etcd kept");
      restart_apiserver(false);
      break;
    case FaultKind::kTesseraKill: {
      absl::Status s =
          options_.control_plane->Signal(options_.control_plane->env().extender, SIGKILL);
      if (!s.ok()) {
        TESSERA_LOG(kError, "simulate: tessera_kill: {}", s.ToString());
        break;
      }
      RecordFault(kind, fmt::format("tessera serve SIGKILLed, restarted after {}",
                                    absl::FormatDuration(f.duration)));
      options_.later->Post(Now() + f.duration, [this] {
        absl::Status r =
            options_.control_plane->Restart(options_.control_plane->env().extender, false);
        if (!r.ok()) {
          TESSERA_LOG(kError, "simulate: restarting serve: {}", r.ToString());
        }
      });
      break;
    }
    case FaultKind::kErrorStorm:
      skip(fmt::format("a real kube-apiserver does not answer {} on demand (apisim only)", f.code));
      break;
    case FaultKind::kNodeDelete:
    case FaultKind::kPluginStop:
      break;  // not reached: the emulators' own faults run in Fault()
  }
}

}  // namespace tessera::sim
