// File: tessera/apisim/patch.h
//
// The three PATCH flavours the Kubernetes API server accepts for built-in types, applied to a
// JSON document held as text:
//   kJson       application/json-patch+json            RFC 6902 (add remove replace move copy test)
//   kMerge      application/merge-patch+json           RFC 7386 (null deletes, lists replace)
//   kStrategic  application/strategic-merge-patch+json RFC 7386 plus merge-by-key for the
//               well-known lists (containers by name, conditions by type, ...) and the directives
//               $patch (replace|delete|merge), $retainKeys, $setElementOrder/<list>,
//               $deleteFromPrimitiveList/<list>.
//
// Pure functions; thread-safe. Errors carry the HTTP status the API server answers with:
// InvalidArgument (400: the patch is not JSON or has the wrong shape), FailedPrecondition (422:
// the patch is well-formed but cannot be applied, e.g. a failing `test` or a missing path),
// ResourceExhausted (413: more than 10,000 JSON-patch operations).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tessera::apisim {

enum class PatchType { kJson, kMerge, kStrategic };

// Maps a request Content-Type (parameters ignored) to a patch type; nullopt when unsupported
// (the server answers 415).
std::optional<PatchType> PatchTypeFromContentType(std::string_view content_type);

// The deepest nesting a body or patch may have (json::ExceedsDepth, checked before parsing).
inline constexpr int kMaxJsonDepth = 1000;

// Applies `patch` to `original` (a JSON object) and returns the compact result.
absl::StatusOr<std::string> ApplyPatch(PatchType type, std::string_view original,
                                       std::string_view patch);

// The same on a parsed document (a JSON object); the result is a JSON object. The store uses
// it so that a PATCH parses the stored object once and serialises the result once.
absl::StatusOr<nlohmann::ordered_json> ApplyPatchToDocument(PatchType type,
                                                            nlohmann::ordered_json doc,
                                                            std::string_view patch);

}  // namespace tessera::apisim
