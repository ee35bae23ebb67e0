// Any bytes parse as a kubeconfig or give an error with a message: never a crash, an escaped
// exception or a hang. Referenced files are served from memory, so the input never reaches the
// file system.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

#include "tessera/kube/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 1 << 16) {
    return 0;
  }
  std::string_view text(reinterpret_cast<const char*>(data), size);
  tessera::kube::KubeconfigOptions options;
  options.getenv = [](const std::string&) { return std::nullopt; };
  options.read_file = [](const std::string& path) -> absl::StatusOr<std::string> {
    if (path.find("missing") != std::string::npos) {
      return absl::NotFoundError(path + ": no such file");
    }
    return "contents of " + path;
  };
  absl::StatusOr<tessera::kube::RestConfig> config =
      tessera::kube::ParseKubeconfig(text, "/fuzz/kubeconfig", options);
  if (!config.ok()) {
    if (config.status().message().empty()) {
      std::abort();
    }
    return 0;
  }
  // A resolved config always names an http(s) server and a context.
  if (config->server.rfind("https://", 0) != 0 && config->server.rfind("http://", 0) != 0) {
    std::abort();
  }
  if (config->client_cert_pem.empty() != config->client_key_pem.empty()) {
    std::abort();
  }
  (void)config->DebugString();
  return 0;
}
