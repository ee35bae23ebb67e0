#include "tessera/testing/apisim_process.h"

#include <unistd.h>

#include "absl/status/statusor.h"

namespace tessera::testing {

std::string ApisimProcess::Start(const std::string& binary, const std::vector<std::string>& args,
                                 absl::Duration timeout) {
  Stop();
  if (binary.empty() || access(binary.c_str(), X_OK) != 0) {
    return "";
  }
  std::vector<std::string> argv = {"apisim"};
  bool has_listen = false;
  for (const std::string& a : args) {
    has_listen = has_listen || a == "--listen";
  }
  if (!has_listen) {
    argv.push_back("--listen");
    argv.push_back("127.0.0.1:0");
  }
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<std::string> line = process_.Start(binary, argv, /*log_path=*/"", timeout);
  const std::string prefix = "listening on ";
  if (!line.ok() || line->rfind(prefix, 0) != 0) {
    process_.Kill();
    return "";
  }
  return line->substr(prefix.size());
}

}  // namespace tessera::testing
