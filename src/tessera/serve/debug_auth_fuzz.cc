// Any bytes as the API server's answer to a TokenReview or a SubjectAccessReview: a user, a
// yes/no or an error with a message, never a crash; a decoded user makes an access review body.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tessera/serve/debug_auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tessera::serve::DebugUser> user = tessera::serve::DecodeTokenReview(body);
  if (!user.ok() && user.status().message().empty()) {
    std::abort();
  }
  if (user.ok()) {
    (void)tessera::serve::AccessReviewBody(*user, "/debug/ledger", "get");
  }
  std::string reason;
  absl::StatusOr<bool> allowed = tessera::serve::DecodeAccessReview(body, &reason);
  if (!allowed.ok() && allowed.status().message().empty()) {
    std::abort();
  }
  (void)tessera::serve::TokenReviewBody(body);
  return 0;
}
