#include "tessera/kube/api_calls.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace tessera::kube {
namespace {

constexpr ApiScope kCluster = ApiScope::kCluster;
constexpr ApiScope kOwn = ApiScope::kOwnNamespace;

// Keep in step with the "RBAC:" comments in client.cc.
constexpr ApiCall kCalls[] = {
    {"get", "", "pods", "", kCluster,
     "bind re-reads a pod missing from the informer, the NUMA refit reads the pod it moves "
     "(ApiClient::GetPod)"},
    {"list", "", "pods", "", kCluster,
     "the pod informer's list and relists, the resync, and the leader's list of the scheduler "
     "pods of its namespace for hami.io/scheduler-role, and preemption's list of the pods a "
     "disruption budget selects on a node (ApiClient::ListPods)"},
    {"watch", "", "pods", "", kCluster, "the pod informer (ApiClient::Watch<Pod>)"},
    {"patch", "", "pods", "", kCluster,
     "filter writes the allocation annotations, bind writes hami.io/bind-phase, the NUMA refit "
     "rewrites one container's allocation, the leader "
     "labels the scheduler pods hami.io/scheduler-role (ApiClient::PatchPodMetadata, "
     "JsonPatchPod)"},
    {"create", "", "pods", "binding", kCluster, "bind posts the Binding (ApiClient::BindPod)"},
    {"create", "", "pods", "eviction", kCluster,
     "--preemption=self evicts the victims that free a GPU share for a pending pod of higher "
     "priority, through the API server's disruption budget check (ApiClient::EvictPod)"},
    {"get", "", "nodes", "", kCluster,
     "the node lock reads the node it locks (ApiClient::GetNode)"},
    {"list", "", "nodes", "", kCluster, "the node informer's list (ApiClient::ListNodes)"},
    {"watch", "", "nodes", "", kCluster, "the node informer (ApiClient::Watch<Node>)"},
    {"patch", "", "nodes", "", kCluster,
     "the node lock hami.io/mutex.lock and the handshake annotation "
     "(ApiClient::PatchNodeMetadata, JsonPatchNode)"},
    {"list", "", "resourcequotas", "", kCluster,
     "the ResourceQuota informer's list: namespace quota on GPU memory and cores "
     "(ApiClient::ListAsync<ResourceQuota>)"},
    {"watch", "", "resourcequotas", "", kCluster,
     "the ResourceQuota informer (ApiClient::Watch<ResourceQuota>)"},
    {"list", "policy", "poddisruptionbudgets", "", kCluster,
     "preemption: the budgets of the victims' namespaces, so that an eviction that would take "
     "one below its minimum is avoided and counted (ApiClient::ListPodDisruptionBudgets)"},
    {"create", "", "events", "", kCluster,
     "FilteringSucceed/FilteringFailed/BindingSucceed/BindingFailed/NumaRefitSucceed/"
     "NumaRefitFailed events on pods "
     "(ApiClient::CreateEvent)"},
    {"create", "authentication.k8s.io", "tokenreviews", "", kCluster,
     "--debug-auth=kubernetes: who sent the bearer token of a /debug request "
     "(serve/debug_auth.cc, NewKubeDebugReviewer)"},
    {"create", "authorization.k8s.io", "subjectaccessreviews", "", kCluster,
     "--debug-auth=kubernetes: whether that user may get the /debug path "
     "(serve/debug_auth.cc, NewKubeDebugReviewer)"},
    {"get", "coordination.k8s.io", "leases", "", kOwn,
     "leadership follows kube-scheduler's Lease (--leader-elect-resource-name) "
     "(ApiClient::GetLease)"},
    {"create", "coordination.k8s.io", "leases", "", kOwn,
     "--leader-elect-mode=lease: the first leader creates the Lease (ApiClient::CreateLease)"},
    {"update", "coordination.k8s.io", "leases", "", kOwn,
     "--leader-elect-mode=lease: acquire and renew (ApiClient::UpdateLease)"},
};

std::string Quote(std::string_view s) { return fmt::format("\"{}\"", s); }

// Rules of one scope: (group, resource) -> verbs and reasons, in table order.
struct Rule {
  std::string group;
  std::string resource;
  std::set<std::string> verbs;
  std::vector<std::string> why;
};

std::vector<Rule> RulesOf(ApiScope scope) {
  std::vector<Rule> rules;
  for (const ApiCall& call : ApiCalls()) {
    if (call.scope != scope) {
      continue;
    }
    const std::string resource = RbacResource(call);
    auto it = std::find_if(rules.begin(), rules.end(), [&](const Rule& r) {
      return r.group == call.group && r.resource == resource;
    });
    if (it == rules.end()) {
      rules.push_back(Rule{std::string(call.group), resource, {}, {}});
      it = rules.end() - 1;
    }
    it->verbs.insert(std::string(call.verb));
    it->why.push_back(fmt::format("{}: {}", call.verb, call.why));
  }
  return rules;
}

void AppendRules(const std::vector<Rule>& rules, std::string* out) {
  *out += "rules:\n";
  for (const Rule& r : rules) {
    for (const std::string& why : r.why) {
      *out += fmt::format("  # {}\n", why);
    }
    std::vector<std::string> verbs;
    for (const std::string& v : r.verbs) {
      verbs.push_back(Quote(v));
    }
    *out += fmt::format("  - apiGroups: [{}]\n    resources: [{}]\n    verbs: [{}]\n",
                        Quote(r.group), Quote(r.resource), fmt::join(verbs, ", "));
  }
}

}  // namespace

std::span<const ApiCall> ApiCalls() { return kCalls; }

std::string RbacResource(const ApiCall& call) {
  std::string out(call.resource);
  if (!call.subresource.empty()) {
    out += "/";
    out += call.subresource;
  }
  return out;
}

std::string RbacYaml(const RbacNames& n) {
  std::string out =
      "# Generated by `tessera rbac` from the table of API calls in "
      "src/tessera/kube/api_calls.cc.\n"
      "# Do not edit: change the table and regenerate.\n";
  out += fmt::format(
      "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {}\n",
      n.name);
  AppendRules(RulesOf(ApiScope::kCluster), &out);
  out += fmt::format(
      "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n"
      "  name: {0}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n"
      "  name: {0}\nsubjects:\n  - kind: ServiceAccount\n    name: {1}\n    namespace: {2}\n",
      n.name, n.service_account, n.ns);
  out += fmt::format(
      "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: {}\n"
      "  namespace: {}\n",
      n.name, n.ns);
  AppendRules(RulesOf(ApiScope::kOwnNamespace), &out);
  out += fmt::format(
      "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n"
      "  name: {0}\n  namespace: {3}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n"
      "  kind: Role\n  name: {0}\nsubjects:\n  - kind: ServiceAccount\n    name: {1}\n"
      "    namespace: {2}\n",
      n.name, n.service_account, n.ns, n.ns);
  return out;
}

}  // namespace tessera::kube
