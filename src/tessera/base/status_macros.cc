#include "tessera/base/status_macros.h"

#include <string>

namespace tessera {

absl::Status Annotate(const absl::Status& status, std::string_view prefix) {
  if (status.ok()) {
    return status;
  }
  std::string message(prefix);
  message += ": ";
  message.append(status.message().data(), status.message().size());
  return absl::Status(status.code(), message);
}

}  // namespace tessera
