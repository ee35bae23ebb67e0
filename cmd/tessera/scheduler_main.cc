// The `tessera-scheduler` binary, the one the image ships (as /usr/local/bin/tessera):
// serve | explain | decode | rbac | version. No apisim, simulator or benchmark
// (test/deploy/production_binary_test.py checks what it links).
#include "cmd/tessera/commands.h"

int main(int argc, char** argv) {
  namespace cmd = tessera::cmd;
  return cmd::RunCli(
      argc, argv,
      {cmd::AddServeCommand, cmd::AddExplainCommand, cmd::AddWhyCommand, cmd::AddTopCommand,
       cmd::AddDecodeCommand, cmd::AddRbacCommand, cmd::AddVersionCommand});
}
