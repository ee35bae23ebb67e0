#include "tessera/base/limits.h"

#include <cerrno>
#include <string>

#include <sys/resource.h>

#include "absl/status/status.h"

#include "tessera/base/status_macros.h"

namespace tessera {

absl::StatusOr<uint64_t> RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(std::string("getrlimit(RLIMIT_NOFILE): ") + ErrnoText(errno));
  }
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return absl::InternalError(std::string("setrlimit(RLIMIT_NOFILE): ") + ErrnoText(errno));
    }
    limit = raised;
  }
  return static_cast<uint64_t>(limit.rlim_cur);
}

}  // namespace tessera
