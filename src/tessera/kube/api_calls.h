// File: tessera/kube/api_calls.h
//
// Every Kubernetes API call Tessera makes, in one table (api_calls.cc), and the RBAC objects
// derived from it. Each ApiClient method in client.cc names the table rows it uses in a
// comment; a new call must add its row here, and deploy/base/rbac.yaml is regenerated with
// `tessera rbac` (test/deploy checks that the rendered manifests grant exactly these calls).
//
//   for (const ApiCall& call : ApiCalls()) { ... call.verb, call.resource ... }
//   std::string yaml = RbacYaml(RbacNames{});  // ClusterRole, Role and their bindings
//
// Scope: calls on pods, nodes, bindings and events reach every namespace (a GPU pod can live
// anywhere) and go into a ClusterRole; the Lease calls only ever address Tessera's own
// namespace (leader election follows kube-scheduler's Lease there) and go into a Role in that
// namespace.
//
// Thread safety: immutable data and pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace tessera::kube {

enum class ApiScope {
  kCluster,       // any namespace, or cluster-scoped objects: a ClusterRole rule
  kOwnNamespace,  // only Tessera's namespace: a Role rule
};

struct ApiCall {
  std::string_view verb;         // RBAC verb: get, list, watch, create, update, patch
  std::string_view group;        // API group; "" is the core group
  std::string_view resource;     // plural resource name
  std::string_view subresource;  // e.g. "binding"; empty for the object itself
  ApiScope scope;
  std::string_view why;  // which component makes the call, and what for
};

// The table, in a stable order.
std::span<const ApiCall> ApiCalls();

// "pods" or "pods/binding": the RBAC resource string.
std::string RbacResource(const ApiCall& call);

struct RbacNames {
  std::string name = "tessera";  // ClusterRole, Role, bindings
  std::string ns = "tessera-system";
  std::string service_account = "tessera";
};

// The RBAC manifests derived from the table: one rule per (group, resource) with the union of
// its verbs (sorted), a ClusterRole for kCluster calls and a Role in `names.ns` for
// kOwnNamespace calls, plus a ClusterRoleBinding and a RoleBinding to the ServiceAccount.
// YAML documents separated by "---", each rule preceded by comments giving the reasons.
std::string RbacYaml(const RbacNames& names);

}  // namespace tessera::kube
