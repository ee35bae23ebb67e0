#include "tessera/serve/role_labels.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include <fmt/format.h>

#include "tessera/base/logging.h"

namespace tessera::serve {

RoleLabeler::RoleLabeler(kube::ApiClient* client, RoleLabelOptions options)
    : client_(client),
      options_(std::move(options)),
      retry_(Backoff::Options{
          .initial = options_.min_interval, .cap = options_.period, .factor = 2, .jitter = 0}) {}

RoleLabelStats RoleLabeler::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void RoleLabeler::Warn(const std::string& message) {
  if (logged_.insert(message).second) {
    TESSERA_LOG(kWarning, "role labels: {}", message);
  }
}

void RoleLabeler::Tick(absl::Time now, bool leader, uint64_t generation) {
  if (!enabled()) {
    return;
  }
  const bool gained = leader && (!was_leader_ || generation != generation_);
  was_leader_ = leader;
  generation_ = generation;
  if (!leader) {
    return;
  }
  uint64_t failing = 0;
  {
    MutexLock lock(&mu_);
    failing = stats_.consecutive_failed_passes;
  }
  const bool due = gained || now >= next_pass_ ||
                   (failing == 0 && now >= last_pass_ + options_.min_interval && ObservedDiffers());
  if (due) {
    Pass(now);
  }
}

bool RoleLabeler::ObservedDiffers() const {
  if (!options_.observed) {
    return false;
  }
  for (const auto& [name, known] : known_) {
    std::optional<kube::Pod> pod = options_.observed(name);
    if (!pod) {
      continue;  // deleted, or not delivered yet
    }
    if (pod->meta.labels.Get(kSchedulerRoleLabel) == known.want) {
      continue;
    }
    if (known.listed_rv != known.current_rv && pod->meta.resource_version == known.listed_rv) {
      continue;  // the informer has not seen our PATCH yet
    }
    TESSERA_VLOG(1, "role labels: pod {}/{} now has {}=\"{}\" (want {}): relabelling", options_.ns,
                 name, kSchedulerRoleLabel, pod->meta.labels.Get(kSchedulerRoleLabel), known.want);
    return true;
  }
  return false;
}

bool RoleLabeler::Pass(absl::Time now) {
  last_pass_ = now;
  std::vector<kube::Pod> pods;
  absl::Status error;
  kube::ListOptions list;
  list.ns = options_.ns;
  list.label_selector = options_.selector;
  list.limit = 500;
  do {
    absl::StatusOr<kube::PodList> page = client_->ListPods(list);
    if (!page.ok()) {
      error = page.status();
      break;
    }
    for (kube::Pod& pod : page->items) {
      pods.push_back(std::move(pod));
    }
    list.continue_token = page->meta.continue_token;
  } while (!list.continue_token.empty());

  uint64_t patched = 0, unchanged = 0, failures = 0;
  std::string last_error;
  if (!error.ok()) {
    ++failures;
    last_error = fmt::format("listing the pods {} in namespace {}: {}", options_.selector,
                             options_.ns, std::string(error.message()));
    Warn(last_error);
  } else {
    const bool self_found = std::any_of(pods.begin(), pods.end(), [&](const kube::Pod& p) {
      return p.meta.name == options_.pod_name;
    });
    if (!self_found && !missing_self_logged_) {
      missing_self_logged_ = true;
      TESSERA_LOG(kWarning,
                  "role labels: this replica's pod {}/{} ($POD_NAME) is not among the pods "
                  "labelled {}: it is not labelled {} (check POD_NAME and the pod's labels)",
                  options_.ns, options_.pod_name, options_.selector, kRoleLeader);
    } else if (self_found) {
      missing_self_logged_ = false;
    }
    std::map<std::string, Known> known;
    std::vector<std::string> written;
    for (const kube::Pod& pod : pods) {
      const std::string& name = pod.meta.name;
      const std::string want(name == options_.pod_name ? kRoleLeader : kRoleFollower);
      Known& k = known[name];
      k.want = want;
      k.listed_rv = pod.meta.resource_version;
      k.current_rv = pod.meta.resource_version;
      if (pod.meta.labels.Get(kSchedulerRoleLabel) == want) {
        ++unchanged;
        continue;
      }
      if (options_.is_leader && !options_.is_leader()) {
        TESSERA_LOG(kInfo, "role labels: leadership ended during the pass; {} left to the leader",
                    name);
        break;
      }
      kube::MetadataPatch patch;
      patch.labels.emplace_back(std::string(kSchedulerRoleLabel), want);
      absl::StatusOr<kube::Pod> done = client_->PatchPodMetadata(options_.ns, name, patch);
      if (done.ok()) {
        ++patched;
        k.current_rv = done->meta.resource_version;
        written.push_back(fmt::format("{}={}", name, want));
      } else if (absl::IsNotFound(done.status())) {
        known.erase(name);
        TESSERA_VLOG(1, "role labels: pod {}/{} was deleted before its label was written",
                     options_.ns, name);
      } else {
        ++failures;
        last_error = fmt::format("setting {}={} on pod {}/{}: {}", kSchedulerRoleLabel, want,
                                 options_.ns, name, std::string(done.status().message()));
        Warn(last_error);
      }
    }
    known_ = std::move(known);
    if (!written.empty()) {
      TESSERA_LOG(kInfo, "role labels: {} in namespace {} ({} already right)",
                  fmt::join(written, ", "), options_.ns, unchanged);
    }
  }

  const bool ok = failures == 0;
  MutexLock lock(&mu_);
  ++stats_.passes;
  stats_.patches += patched;
  stats_.unchanged += unchanged;
  stats_.failures += failures;
  stats_.last_pass = now;
  stats_.last_error = last_error;
  if (ok) {
    stats_.consecutive_failed_passes = 0;
    logged_.clear();
    retry_.Reset();
    next_pass_ = now + options_.period;
    stats_.roles.clear();
    for (const auto& [name, k] : known_) {
      stats_.roles[name] = k.want;
    }
  } else {
    ++stats_.consecutive_failed_passes;
    next_pass_ = now + retry_.Next();
  }
  return ok;
}

}  // namespace tessera::serve
