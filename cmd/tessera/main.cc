// The `tessera` binary, for users and tests:
// serve | apisim | simulate | emulate | explain | decode | bench | rbac | version.
#include "cmd/tessera/commands.h"

int main(int argc, char** argv) {
  namespace cmd = tessera::cmd;
  return cmd::RunCli(
      argc, argv,
      {cmd::AddServeCommand, cmd::AddExplainCommand, cmd::AddWhyCommand, cmd::AddTopCommand,
       cmd::AddDecodeCommand, cmd::AddApisimCommand, cmd::AddBenchCommand, cmd::AddRbacCommand,
       cmd::AddSimulateCommand, cmd::AddEmulateCommand, cmd::AddVersionCommand});
}
