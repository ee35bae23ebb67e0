// Any bytes decode to FilterArgs / PreemptArgs / BindArgs or to an error with a message, never a
// crash; what decodes re-encodes, and a filter reply built from it is well formed enough to decode
// its names; a preempt reply decodes back to the same victims.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tessera/extender/wire.h"
#include "tessera/kube/objects.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::extender::FilterArgs> args = tessera::extender::DecodeFilterArgs(json);
  if (!args.ok() && args.status().message().empty()) {
    std::abort();
  }
  if (args.ok()) {
    tessera::extender::FilterResult result;
    result.node_names = args->CandidateNames();
    if (args->nodes.has_value()) {
      result.nodes.emplace();
      for (const auto& n : *args->nodes) {
        result.nodes->push_back(n.raw);
      }
    }
    std::string reply = tessera::extender::EncodeFilterResult(result);
    // The reply (with the request's pod) decodes back to the same names.
    std::string again = "{\"Pod\":" + args->raw_pod + "," + reply.substr(1);
    absl::StatusOr<tessera::extender::FilterArgs> back = tessera::extender::DecodeFilterArgs(again);
    if (!back.ok() || back->CandidateNames() != args->CandidateNames()) {
      std::abort();
    }
  }
  absl::StatusOr<tessera::extender::PreemptArgs> preempt =
      tessera::extender::DecodePreemptArgs(json);
  if (!preempt.ok() && preempt.status().message().empty()) {
    std::abort();
  }
  if (preempt.ok()) {
    // Every node name is a Kubernetes name and every victim has a uid.
    for (const auto& [node, victims] : preempt->victims) {
      if (!tessera::kube::IsDnsSubdomain(node) || victims.num_pdb_violations < 0) {
        std::abort();
      }
      for (const std::string& uid : victims.pod_uids) {
        if (uid.empty()) {
          std::abort();
        }
      }
    }
    // The reply (with the request's pod) decodes back to the same victims, in the meta form.
    tessera::extender::PreemptResult result{preempt->victims};
    std::string reply = tessera::extender::EncodePreemptResult(result);
    std::string again = "{\"Pod\":" + preempt->raw_pod + "," + reply.substr(1);
    absl::StatusOr<tessera::extender::PreemptArgs> back =
        tessera::extender::DecodePreemptArgs(again);
    if (!back.ok() || !back->meta || back->victims != preempt->victims) {
      std::abort();
    }
  }
  absl::StatusOr<tessera::extender::BindArgs> bind = tessera::extender::DecodeBindArgs(json);
  if (!bind.ok() && bind.status().message().empty()) {
    std::abort();
  }
  if (bind.ok()) {
    // No API path is ever built from a name that is not a Kubernetes name.
    if (!tessera::kube::IsDnsSubdomain(bind->pod_name) ||
        !tessera::kube::IsDnsLabel(bind->pod_namespace) ||
        !tessera::kube::IsDnsSubdomain(bind->node)) {
      std::abort();
    }
    tessera::extender::BindResult r{bind->pod_name + bind->node};
    if (tessera::extender::EncodeBindResult(r).empty()) {
      std::abort();
    }
  }
  return 0;
}
