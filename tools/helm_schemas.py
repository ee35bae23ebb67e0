#!/usr/bin/env python3
"""Kubernetes JSON schemas for kubeconform, from the API server's OpenAPI v2 document.

  helm_schemas.py SWAGGER_JSON OUT_DIR

Writes OUT_DIR/<group>/<kind>-<version>.json for every definition that names a
group/version/kind (x-kubernetes-group-version-kind); <group> is the apiVersion's part before
the slash ("v1" for the core group), <kind> lower case: the path kubeconform's
-schema-location template `OUT_DIR/{{.Group}}/{{.ResourceKind}}-{{.ResourceAPIVersion}}.json`
names. Each file stands alone: the kind's definition at the root, every definition it reaches
under "definitions". Strict: an object with declared properties admits no others (a misspelt
field fails), unless the API marks it x-kubernetes-preserve-unknown-fields. Types the API
encodes as strings but accepts as numbers too are widened: int-or-string and Quantity.
"""

import json
import os
import sys

REF = "#/definitions/"
WIDENED = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": ["string", "integer"]},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": ["string", "number"]},
}


def refs(node, out):
    if isinstance(node, dict):
        r = node.get("$ref")
        if isinstance(r, str) and r.startswith(REF):
            out.add(r[len(REF):])
        for v in node.values():
            refs(v, out)
    elif isinstance(node, list):
        for v in node:
            refs(v, out)


def strict(node):
    """A copy of node where objects with properties refuse unknown ones."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items() if k != "description"}
    if out.get("format") == "int-or-string":
        out.pop("format")
        out["type"] = ["string", "integer"]
    if ("properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def closure(defs, name):
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen or n not in defs:
            continue
        seen.add(n)
        found = set()
        refs(defs[n], found)
        todo.extend(found - seen)
    return seen


def main():
    swagger, out_dir = sys.argv[1], sys.argv[2]
    with open(swagger) as f:
        defs = json.load(f)["definitions"]
    defs = {n: (WIDENED.get(n) or strict(d)) for n, d in defs.items()}
    written = 0
    for name, d in sorted(defs.items()):
        # The kinds, from the original document (strict() keeps the extension keys).
        for gvk in d.get("x-kubernetes-group-version-kind", []):
            group, version, kind = gvk["group"], gvk["version"], gvk["kind"]
            folder = group if group else "v1"
            if not group and version != "v1":
                continue
            schema = dict(d)
            schema["$schema"] = "http://json-schema.org/draft-04/schema#"
            schema["definitions"] = {n: defs[n] for n in sorted(closure(defs, name)) if n != name}
            # kubeconform reads apiVersion and kind itself; a self reference stays resolvable.
            schema["definitions"][name] = d
            path = os.path.join(out_dir, folder, f"{kind.lower()}-{version}.json")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(schema, f, sort_keys=True, separators=(",", ":"))
            written += 1
    if written < 50:
        raise SystemExit(f"only {written} kinds in {swagger}: not an API server's OpenAPI document")
    print(f"helm_schemas.py: {written} schemas in {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
