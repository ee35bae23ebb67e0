// `tessera rbac`: the RBAC manifests derived from the table of API calls
// (src/tessera/kube/api_calls.cc). deploy/base/rbac.yaml is its output.
#include <memory>
#include <string>

#include "cmd/tessera/commands.h"
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "tessera/kube/api_calls.h"

namespace tessera::cmd {
namespace {

struct RbacFlags {
  kube::RbacNames names;
  bool calls = false;
};

int RunRbac(const RbacFlags& f) {
  if (f.calls) {
    // One call per line: verb, group ("" shown as "core"), resource[/subresource], scope.
    for (const kube::ApiCall& call : kube::ApiCalls()) {
      fmt::print("{}\t{}\t{}\t{}\n", call.verb, call.group.empty() ? "core" : call.group,
                 kube::RbacResource(call),
                 call.scope == kube::ApiScope::kCluster ? "cluster" : "namespace");
    }
    return kExitOk;
  }
  fmt::print("{}", kube::RbacYaml(f.names));
  return kExitOk;
}

}  // namespace

void AddRbacCommand(CLI::App& app, Runner* run) {
  auto flags = std::make_shared<RbacFlags>();
  CLI::App* sub = app.add_subcommand(
      "rbac",
      "Print the least-privilege RBAC of `tessera serve` (ClusterRole, Role in its namespace, "
      "bindings), derived from the table of every API call it makes");
  sub->add_option("--name", flags->names.name, "Name of the roles and bindings")
      ->capture_default_str();
  sub->add_option("--namespace", flags->names.ns, "Tessera's namespace (the Lease lives there)")
      ->capture_default_str();
  sub->add_option("--service-account", flags->names.service_account,
                  "The ServiceAccount the bindings grant to")
      ->capture_default_str();
  sub->add_flag("--calls", flags->calls,
                "Print the table instead: verb, group, resource, scope, one call per line");
  sub->callback([run, flags] { *run = [flags] { return RunRbac(*flags); }; });
}

}  // namespace tessera::cmd
