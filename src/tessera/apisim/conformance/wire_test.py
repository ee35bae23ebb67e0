#!/usr/bin/python3
"""Response bodies as a client sees them, compared with what kube-apiserver v1.37.2 sends.

    /usr/bin/python3 wire_test.py TESSERA_BINARY      `tessera apisim` (http), started here
    /usr/bin/python3 wire_test.py --kubeconfig FILE [--etcd URL]
        an existing server, e.g. the real kube-apiserver of tools/controlplane.sh; with its
        etcd's client URL, the 410 checks compact etcd at its current revision (apisim:
        /simulator/v1/compact)

The expected values below were taken from kube-apiserver v1.37.2 (test/controlplane/
apisim_conformance_test.sh runs this file against it), and apisim must give the same: error
Status objects (404, 409 AlreadyExists and Conflict, 422 with causes, 400) field by field, the
Status of a deletion, list metadata (resourceVersion, continue, remainingItemCount only without a
selector, none on the last page, a negative limit), ListOptions validation, which kinds carry
metadata.generation, the watch framing (one JSON object per line, exactly "type" and "object"),
a watch list's closing bookmark, a selector watch's DELETED/ADDED on a label change, and 410
Expired for an exact list at a compacted revision and for a continue token from before it (whose
Status offers a token for the rest at the latest revision). Where only the wording of a message
differs (decoder errors), the code, reason and shape are compared and docs/apisim.md says so.
Runs in a namespace of its own (wire-<pid>), which it removes from an existing server.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

import urllib3

from kubernetes import client, config

FAILURES = []


def check(what, got, want):
    if got != want:
        FAILURES.append("%s:\n  got  %r\n  want %r" % (what, got, want))


class Server:
    def __init__(self, kc):
        config.load_kube_config(config_file=kc)
        self.cfg = client.Configuration.get_default_copy()
        self.pool = client.ApiClient(self.cfg).rest_client.pool_manager

    def request(self, method, path, body=None, ctype="application/json", raw_body=None):
        headers = {"Accept": "application/json"}
        token = self.cfg.api_key.get("authorization")
        if token:
            headers["Authorization"] = token
        data = raw_body if raw_body is not None else (None if body is None else json.dumps(body))
        if data is not None:
            headers["Content-Type"] = ctype
        r = self.pool.request(method, self.cfg.host + path, body=data, headers=headers,
                              timeout=20, preload_content=True)
        return r.status, r.headers, r.data.decode()

    def json(self, method, path, body=None, want=None, **kw):
        status, _, text = self.request(method, path, body, **kw)
        if want is not None and status != want:
            FAILURES.append("%s %s: HTTP %d, want %d: %s" % (method, path, status, want, text[:300]))
        try:
            return status, json.loads(text)
        except ValueError:
            FAILURES.append("%s %s: not JSON: %r" % (method, path, text[:300]))
            return status, {}


def etcd_compact(url):
    """Compacts etcd (its JSON gateway) at its current revision: every earlier one is gone."""
    pool = urllib3.PoolManager()
    head = json.loads(pool.request("POST", url + "/v3/kv/range", body=json.dumps({"key": "AA=="}),
                                   timeout=10).data)["header"]
    r = pool.request("POST", url + "/v3/kv/compaction",
                     body=json.dumps({"revision": head["revision"], "physical": True}), timeout=30)
    if r.status != 200:
        sys.exit("FAIL: etcd compaction: HTTP %d %s" % (r.status, r.data[:200]))


def status_object(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason, "code": code}
    if details is not None:
        s["details"] = details
    return s


SUBDOMAIN = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
             "'-' or '.', and must start and end with an alphanumeric character (e.g. "
             "'example.com', regex used for validation is "
             "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def pod(name):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def run(s, existing, compact=None):
    ns = "wire-%d" % os.getpid()
    base = "/api/v1/namespaces/" + ns
    s.json("POST", "/api/v1/namespaces",
           {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, want=201)
    if existing:  # no kube-controller-manager: the ServiceAccount admission plugin needs it
        s.json("POST", base + "/serviceaccounts", {"metadata": {"name": "default"}}, want=201)
    try:
        checks(s, ns, base)
        if compact is not None:
            expiry(s, base, compact)
        else:
            print("SKIPPED: 410 for compacted revisions (no --etcd URL to compact with)")
    finally:
        if existing:
            for name in ("x", "y"):
                s.request("DELETE", base + "/pods/" + name, {"gracePeriodSeconds": 0})
            s.request("DELETE", "/api/v1/namespaces/" + ns)


def checks(s, ns, base):
    # --- error Status objects ------------------------------------------------------------
    _, got = s.json("GET", base + "/pods/nope", want=404)
    check("404 pod", got, status_object(404, "NotFound", 'pods "nope" not found',
                                        {"name": "nope", "kind": "pods"}))
    _, got = s.json("GET", "/api/v1/namespaces/no-such-ns-%d/pods/nope" % os.getpid(), want=404)
    check("404 pod in a missing namespace", got,
          status_object(404, "NotFound", 'pods "nope" not found', {"name": "nope", "kind": "pods"}))
    _, got = s.json("GET", "/api/v1/nodes/nope-%d" % os.getpid(), want=404)
    check("404 node", got["details"], {"name": "nope-%d" % os.getpid(), "kind": "nodes"})
    _, got = s.json("GET", "/apis/coordination.k8s.io/v1/namespaces/%s/leases/nope" % ns, want=404)
    check("404 lease", got, status_object(
        404, "NotFound", 'leases.coordination.k8s.io "nope" not found',
        {"name": "nope", "group": "coordination.k8s.io", "kind": "leases"}))

    _, created = s.json("POST", base + "/pods", pod("x"), want=201)
    _, got = s.json("POST", base + "/pods", pod("x"), want=409)
    check("409 AlreadyExists", got, status_object(409, "AlreadyExists", 'pods "x" already exists',
                                                  {"name": "x", "kind": "pods"}))
    stale = dict(pod("x"), metadata={"name": "x", "resourceVersion": "1"})
    _, got = s.json("PUT", base + "/pods/x", stale, want=409)
    check("409 Conflict", got, status_object(
        409, "Conflict", 'Operation cannot be fulfilled on pods "x": the object has been '
        "modified; please apply your changes to the latest version and try again",
        {"name": "x", "kind": "pods"}))

    _, got = s.json("POST", base + "/configmaps", {"metadata": {"name": "Bad_Name"}}, want=422)
    cause = 'Invalid value: "Bad_Name": ' + SUBDOMAIN
    check("422 Invalid", got, status_object(
        422, "Invalid", 'ConfigMap "Bad_Name" is invalid: metadata.name: ' + cause,
        {"name": "Bad_Name", "kind": "ConfigMap",
         "causes": [{"reason": "FieldValueInvalid", "message": cause, "field": "metadata.name"}]}))
    _, got = s.json("GET", base + "/pods?resourceVersionMatch=Exact", want=422)
    msg = "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
    check("422 ListOptions", got, status_object(
        422, "Invalid", 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: ' + msg,
        {"group": "meta.k8s.io", "kind": "ListOptions",
         "causes": [{"reason": "FieldValueForbidden", "message": msg,
                     "field": "resourceVersionMatch"}]}))
    _, got = s.json("GET", base + "/pods?fieldSelector=spec.bogus%3Dx", want=400)
    check("400 field selector", got,
          status_object(400, "BadRequest", "field label not supported: spec.bogus"))
    # Decoder errors: the same code, reason and shape; the words after the prefix differ
    # (Go's decoder explains the byte it stopped at).
    _, got = s.json("POST", base + "/configmaps", raw_body="{not json", want=400)
    check("400 malformed JSON: shape", sorted(got), sorted(status_object(400, "BadRequest", "")))
    check("400 malformed JSON: reason", (got.get("reason"), got.get("code")), ("BadRequest", 400))
    _, got = s.json("GET", base + "/pods?limit=1&continue=garbage", want=400)
    check("400 bad continue token: prefix", got.get("message", "")[:22], "invalid continue token")
    _, got = s.json("PATCH", base + "/pods/x",
                    [{"op": "test", "path": "/metadata/name", "value": "y"}],
                    ctype="application/json-patch+json", want=422)
    check("422 failing JSON-patch test", (got.get("kind"), got.get("reason"), got.get("code")),
          ("Status", "Invalid", 422))

    # --- deletion answers ----------------------------------------------------------------
    _, cm = s.json("POST", base + "/configmaps", {"metadata": {"name": "c1"}}, want=201)
    check("a ConfigMap has no metadata.generation", "generation" in cm.get("metadata", {}), False)
    _, got = s.json("DELETE", base + "/configmaps/c1", want=200)
    check("DELETE of a ConfigMap answers a Status", got, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": "c1", "kind": "configmaps", "uid": cm["metadata"]["uid"]}})
    check("a pod starts at generation 1", created["metadata"].get("generation"), 1)
    _, got = s.json("DELETE", base + "/pods/x", want=200)
    md = got.get("metadata", {})
    check("DELETE of an unbound pod answers the pod as deleted",
          (got.get("kind"), md.get("deletionGracePeriodSeconds"), "deletionTimestamp" in md,
           md.get("generation")), ("Pod", 0, True, 2))

    # --- list metadata ---------------------------------------------------------------------
    for n in ("l1", "l2", "l3"):
        s.json("POST", base + "/configmaps", {"metadata": {"name": n}}, want=201)
    _, page = s.json("GET", base + "/configmaps?limit=2", want=200)
    meta = page.get("metadata", {})
    check("first page: metadata keys", sorted(meta), ["continue", "remainingItemCount",
                                                      "resourceVersion"])
    check("first page: remainingItemCount", meta.get("remainingItemCount"), 1)
    check("first page: items", [i["metadata"]["name"] for i in page.get("items", [])],
          ["l1", "l2"])
    check("a list item has no kind", "kind" in (page.get("items") or [{}])[0], False)
    token = urllib.parse.quote(meta.get("continue", ""), safe="")
    _, last = s.json("GET", base + "/configmaps?limit=2&continue=" + token, want=200)
    check("last page: metadata keys", sorted(last.get("metadata", {})), ["resourceVersion"])
    check("last page: the first page's snapshot",
          last.get("metadata", {}).get("resourceVersion"), meta.get("resourceVersion"))
    _, got = s.json("GET", base + "/configmaps?limit=2&resourceVersion=5&continue=" + token,
                    want=400)
    check("400 continue with resourceVersion", got, status_object(
        400, "BadRequest", "specifying resource version is not allowed when using continue"))
    _, sel = s.json("GET", base + "/configmaps?limit=2&labelSelector=x%21%3Dy", want=200)
    check("with a selector: no remainingItemCount", sorted(sel.get("metadata", {})),
          ["continue", "resourceVersion"])
    _, zero = s.json("GET", base + "/configmaps?limit=2&resourceVersion=0", want=200)
    check("resourceVersion=0 ignores limit", (sorted(zero.get("metadata", {})),
                                              len(zero.get("items", []))),
          (["resourceVersion"], 3))
    check("list kind and apiVersion", (page.get("kind"), page.get("apiVersion")),
          ("ConfigMapList", "v1"))
    _, neg = s.json("GET", base + "/configmaps?limit=-1", want=200)
    check("a negative limit is no limit", (sorted(neg.get("metadata", {})),
                                           len(neg.get("items", []))), (["resourceVersion"], 3))
    _, got = s.json("GET", base + "/configmaps?limit=abc", want=400)
    check("400 limit not a number", got,
          status_object(400, "BadRequest", 'strconv.ParseInt: parsing "abc": invalid syntax'))
    for query, field, msg in [
            ("watch=true&sendInitialEvents=true", "resourceVersionMatch",
             "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"),
            ("watch=true&resourceVersionMatch=NotOlderThan", "resourceVersionMatch",
             "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents "
             "is provided"),
            ("sendInitialEvents=true", "sendInitialEvents",
             "Forbidden: sendInitialEvents is forbidden for list")]:
        _, got = s.json("GET", base + "/configmaps?" + query, want=422)
        check("422 " + query, got, status_object(
            422, "Invalid", 'ListOptions.meta.k8s.io "" is invalid: %s: %s' % (field, msg),
            {"group": "meta.k8s.io", "kind": "ListOptions",
             "causes": [{"reason": "FieldValueForbidden", "message": msg, "field": field}]}))

    # --- watch framing ---------------------------------------------------------------------
    rv = meta.get("resourceVersion")
    s.json("POST", base + "/pods", pod("y"), want=201)
    status, headers, text = s.request(
        "GET", base + "/pods?watch=true&timeoutSeconds=1&resourceVersion=%s" % rv)
    check("watch: HTTP status", status, 200)
    check("watch: Content-Type", headers.get("Content-Type", "").split(";")[0],
          "application/json")
    check("watch: Transfer-Encoding", headers.get("Transfer-Encoding"), "chunked")
    lines = [l for l in text.split("\n") if l.strip()]
    check("watch: ends with a newline", text.endswith("\n"), True)
    events = [json.loads(l) for l in lines]
    check("watch: event keys", [sorted(e) for e in events], [["object", "type"]])
    check("watch: the event", [(e["type"], e["object"].get("kind"), e["object"].get("apiVersion"),
                                e["object"]["metadata"]["name"]) for e in events],
          [("ADDED", "Pod", "v1", "y")])

    # A watch list: ADDED for each object, then the BOOKMARK that ends the initial events (and
    # no other bookmark: the watch ends within 2 s).
    _, now_list = s.json("GET", base + "/configmaps", want=200)
    now_rv = now_list.get("metadata", {}).get("resourceVersion")
    _, _, text = s.request("GET", base + "/configmaps?watch=true&sendInitialEvents=true&"
                           "resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&"
                           "timeoutSeconds=1")
    events = [json.loads(l) for l in text.split("\n") if l.strip()]
    check("watch list: events", [(e["type"], e["object"]["metadata"].get("name")) for e in events],
          [("ADDED", "l1"), ("ADDED", "l2"), ("ADDED", "l3"), ("BOOKMARK", None)])
    if events:
        bookmark = events[-1]["object"]
        rv_end = bookmark.get("metadata", {}).get("resourceVersion")
        check("watch list: the bookmark", bookmark, {
            "kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"resourceVersion": rv_end,
                         "annotations": {"k8s.io/initial-events-end": "true"}}})
        check("watch list: the bookmark is at least the list's revision",
              int(rv_end or 0) >= int(now_rv or 0), True)

    # A label-selector watch: an object that stops matching is DELETED (its last matching
    # state, stamped with the revision of the change), one that starts matching ADDED.
    s.json("POST", base + "/configmaps", {"metadata": {"name": "sel", "labels": {"app": "a"}}},
           want=201)
    _, lst = s.json("GET", base + "/configmaps?labelSelector=app%3Da", want=200)
    sel_rv = lst.get("metadata", {}).get("resourceVersion")
    merge = "application/merge-patch+json"
    _, off = s.json("PATCH", base + "/configmaps/sel", {"metadata": {"labels": {"app": "b"}}},
                    ctype=merge, want=200)
    _, on = s.json("PATCH", base + "/configmaps/sel", {"metadata": {"labels": {"app": "a"}}},
                   ctype=merge, want=200)
    _, _, text = s.request("GET", base + "/configmaps?watch=true&labelSelector=app%%3Da&"
                           "timeoutSeconds=1&resourceVersion=%s" % sel_rv)
    events = [json.loads(l) for l in text.split("\n") if l.strip()]
    check("selector watch: events", [(e["type"], e["object"]["metadata"].get("labels"),
                                      e["object"]["metadata"].get("resourceVersion"))
                                     for e in events],
          [("DELETED", {"app": "a"}, off.get("metadata", {}).get("resourceVersion")),
           ("ADDED", {"app": "a"}, on.get("metadata", {}).get("resourceVersion"))])


def expiry(s, base, compact):
    """410 Expired for a list at a compacted revision and for a continue token from before the
    compaction; the latter's Status offers a token for the rest at the latest revision."""
    _, first = s.json("GET", base + "/configmaps?limit=2", want=200)
    meta = first.get("metadata", {})
    old_rv, token = meta.get("resourceVersion"), meta.get("continue", "")
    check("expiry: the first page", [i["metadata"]["name"] for i in first.get("items", [])],
          ["l1", "l2"])
    _, m1 = s.json("POST", base + "/configmaps", {"metadata": {"name": "m1"}}, want=201)
    compact()
    exact = base + "/configmaps?resourceVersionMatch=Exact&resourceVersion=%s" % old_rv
    deadline = time.time() + 30
    status, got = s.json("GET", exact)
    while status != 410 and time.time() < deadline:  # the watch cache learns of a compaction
        time.sleep(0.5)
        status, got = s.json("GET", exact)
    check("410 list at a compacted revision", got, {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "The resourceVersion for the provided list is too old.", "reason": "Expired",
        "code": 410})
    _, got = s.json("GET", base + "/configmaps?limit=2&continue=" +
                    urllib.parse.quote(token, safe=""), want=410)
    rest = got.get("metadata", {}).get("continue", "")
    got.get("metadata", {}).pop("continue", None)
    check("410 continue token from before a compaction", got, status_object(
        410, "Expired", "The provided continue parameter is too old to display a consistent "
        "list result. You can start a new list without the continue parameter, or use the "
        "continue token in this response to retrieve the remainder of the results. Continuing "
        "with the provided token results in an inconsistent list - objects that were created, "
        "modified, or deleted between the time the first chunk was returned and now may show "
        "up in the list."))
    check("the 410 offers a continue token", bool(rest), True)
    _, page = s.json("GET", base + "/configmaps?limit=10&continue=" +
                     urllib.parse.quote(rest, safe=""), want=200)
    check("its token lists the rest at the latest revision",
          ([i["metadata"]["name"] for i in page.get("items", [])],
           int(page.get("metadata", {}).get("resourceVersion", 0)) >=
           int(m1.get("metadata", {}).get("resourceVersion", 1))),
          (["l3", "m1", "sel"], True))


def main():
    if len(sys.argv) in (3, 5) and sys.argv[1] == "--kubeconfig":
        signal.signal(signal.SIGALRM, lambda *_: sys.exit("FAIL: not done within 120 s"))
        signal.alarm(120)
        compact = None
        if len(sys.argv) == 5 and sys.argv[3] == "--etcd":
            compact = lambda: etcd_compact(sys.argv[4])  # noqa: E731
        elif len(sys.argv) == 5:
            sys.exit("usage: wire_test.py --kubeconfig FILE [--etcd URL]")
        run(Server(sys.argv[2]), existing=True, compact=compact)
        name = "existing server"
    elif len(sys.argv) == 2:
        tmp = tempfile.mkdtemp()
        kc = os.path.join(tmp, "kc")
        proc = subprocess.Popen([sys.argv[1], "apisim", "--listen", "127.0.0.1:0",
                                 "--write-kubeconfig", kc],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        watchdog = threading.Timer(120, proc.kill)
        watchdog.start()
        try:
            first = proc.stdout.readline().strip()
            if not re.fullmatch(r"listening on http://127\.0\.0\.1:\d+", first):
                sys.exit("FAIL: first line %r" % first)
            server = Server(kc)
            run(server, existing=False,
                compact=lambda: server.json("POST", "/simulator/v1/compact", want=200))
        finally:
            watchdog.cancel()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            shutil.rmtree(tmp, ignore_errors=True)
        name = "apisim"
    else:
        sys.exit("usage: wire_test.py TESSERA_BINARY | wire_test.py --kubeconfig FILE")
    if FAILURES:
        print("\n".join("FAIL: " + f for f in FAILURES), file=sys.stderr)
        sys.exit(1)
    print("wire conformance (%s): ok" % name)


if __name__ == "__main__":
    main()
