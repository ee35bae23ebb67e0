#include "tessera/base/status_macros.h"

#include <cstring>
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

std::string ErrnoText(int err) {
  char buffer[256];
  // The GNU strerror_r returns either `buffer` or a static string (_GNU_SOURCE is on with g++
  // and clang++ on glibc).
  return strerror_r(err, buffer, sizeof(buffer));
}

}  // namespace tessera
