// File: tessera/kube/manifest.h
//
// Loads pods, nodes and ResourceQuotas from Kubernetes manifests on disk — the input of `tessera
// explain` and of the simulators: what `kubectl get nodes,pods,resourcequotas -A -o yaml` (or
// `-o json`) writes, a `List`, `PodList`, `NodeList` or `ResourceQuotaList` with items, several
// `---` separated YAML documents, concatenated JSON objects, or single objects. Objects of other
// kinds are skipped and named in `warnings`.
//
// YAML is converted to JSON and decoded by the same decoders as the API server's responses
// (tessera/kube/decode.h), so a manifest means exactly what the same object means on the wire.
// The conversion follows the YAML 1.2 core schema for plain scalars (true/false, null/~,
// JSON-style numbers; everything else is a string); quoted scalars are always strings. Values of
// string maps — labels, annotations, nodeSelector, and the quantity maps limits, requests,
// allocatable, capacity — are kept as strings whatever they look like (`cpu: 1`, `gpu: "on"`).
//
// Errors (InvalidArgument) name the source, the document (1-based) and the object:
//   "cluster.yaml: document 3 (Pod default/x): spec.containers: expected array"
//   "cluster.yaml: document 2 items[4] (Node gpu-1): status.allocatable: expected object"
//   "cluster.yaml: line 7, column 3: <YAML syntax error>"
// LoadManifestFile returns NotFound / PermissionDenied style errors (from errno) for unreadable
// files.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "tessera/kube/objects.h"
#include "tessera/kube/resource_quota.h"

namespace tessera::kube {

struct Manifests {
  std::vector<Pod> pods;              // in input order
  std::vector<Node> nodes;            // in input order
  std::vector<ResourceQuota> quotas;  // in input order (namespace quota, docs/quota.md)
  // One line per skipped object or document, e.g.
  //   "cluster.yaml: document 4: skipped Service default/web".
  std::vector<std::string> warnings;
};

absl::StatusOr<Manifests> LoadManifests(std::string_view text, std::string_view source_name);

// Reads `path` and loads it; the path is the source name in messages.
absl::StatusOr<Manifests> LoadManifestFile(const std::string& path);

}  // namespace tessera::kube
