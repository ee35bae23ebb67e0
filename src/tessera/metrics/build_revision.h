// File: tessera/metrics/build_revision.h
//
// The source revision this binary was built from, for tessera_build_info{revision} and the
// version lines: the git commit (12 hex digits, "-dirty" when the work tree differed from it),
// or -DTESSERA_REVISION given at configure time (a build without a git checkout), or "" when
// neither is known. The definition is generated at every build by cmake/revision.cmake.
//
// Thread safety: a constant.
#pragma once

#include <string_view>

namespace tessera::metrics {

std::string_view BuildRevision();

}  // namespace tessera::metrics
