#!/usr/bin/env python3
"""Checks that the code keeps the layering docs/architecture.md draws, and the fence around the
scaffolding.

  layering_test.py <source dir> [<architecture.md>]   (default: <source dir>/docs/architecture.md)
  layering_test.py --self-test <source dir>   (each check fails on a copy with one mistake)

The folders are every directory under src/tessera/, each cmd/<name>/, and bench/ (with its
subfolders). A folder's edges are the tessera:: targets its product targets link: the DEPS of
its tessera_cc_library calls and the target_link_libraries of the libraries and executables its
CMakeLists.txt defines (tests and fuzz targets are not counted: they may link testing/).

1. The drawing ("Folders and their dependencies", the fenced block): every line
   `row N  <label>  <folder> ...` (cells apart by two or more spaces; a cell's first word is the
   folder, trailing ':' or '/' dropped; other lines are comments) places its folders in row N.
   Every folder is placed once; a folder uses only folders in rows below its own.
2. The table of folder edges (`| folder | uses |`): one row per folder, naming exactly the
   folders it uses (comma or semicolon separated; parentheses are comments; "—" is none).
3. The table "Libraries (CMake targets)": every tessera_cc_library target appears once, in the
   directory that defines it, and below every library it uses.
4. Includes: a product source (a .h/.cc that is not a test, a test helper or a fuzz target)
   includes headers only of its own folder and of the folders its folder links, directly or
   through their DEPS.
5. The fence: no product source under src/tessera outside apisim/, sim/ and testing/ includes a
   header of tessera/apisim, tessera/sim, tessera/testing or bench/, and no library declared
   outside those folders depends on tessera::apisim, tessera::sim*, tessera::testing* or
   tessera::bench_*. cmd/ and the tests may reach them; test/deploy/production_binary_test.py
   checks the binary.

Each failure names the file, the folder or target, and what to change.
"""

import os
import re
import sys

DOC = "docs/architecture.md"
SCAFFOLD_DIRS = {"apisim", "sim", "testing"}
TEST_FILE = re.compile(r"(_test\.cc|_fuzz\.cc|_testutil\.h)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"(tessera/(apisim|sim|testing)/[^"]+|bench/[^"]+)"', re.M)
FOLDER_INCLUDE = re.compile(r'^\s*#\s*include\s+"(tessera/(\w+)/[^"]+|bench/[^"]+)"', re.M)
SCAFFOLD_DEP = re.compile(r"^tessera::(apisim$|sim\w*|testing\w*|bench_\w+)")
CALL = re.compile(r"\b(tessera_cc_library|add_library|add_executable|target_link_libraries)"
                  r"\s*\(([^()]*)\)", re.S)
TARGET_REF = re.compile(r"\btessera::\w+")
SWAP = object()  # a self-test edit that swaps two lines


class Target:
    def __init__(self, name, folder, file, is_library):
        self.name = name          # "tessera::ledger", or a plain CMake target name
        self.folder = folder      # "ledger", "bench", "cmd/tessera"
        self.file = file          # the CMakeLists.txt that defines it, relative to the root
        self.is_library = is_library  # declared with tessera_cc_library
        self.deps = []            # tessera:: targets it links


def cmake_files(root):
    """(folder, CMakeLists.txt relative path) for every folder, and the set of folders."""
    folders, files = set(), []
    src = os.path.join(root, "src", "tessera")
    for name in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, name)):
            folders.add(name)
            files.append((name, f"src/tessera/{name}/CMakeLists.txt"))
    cmd = os.path.join(root, "cmd")
    for name in sorted(os.listdir(cmd)) if os.path.isdir(cmd) else []:
        if os.path.isdir(os.path.join(cmd, name)):
            folders.add(f"cmd/{name}")
            files.append((f"cmd/{name}", f"cmd/{name}/CMakeLists.txt"))
    bench = os.path.join(root, "bench")
    if os.path.isdir(bench):
        folders.add("bench")
        for dirpath, _, names in sorted(os.walk(bench)):
            if "CMakeLists.txt" in names:
                files.append(("bench", os.path.relpath(os.path.join(dirpath, "CMakeLists.txt"),
                                                       root)))
    return folders, [(f, p) for f, p in files if os.path.isfile(os.path.join(root, p))]


def strip_comments(text):
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.split("\n"))


def read_targets(root, files):
    """Every product target (tessera_cc_library, add_library, add_executable) by name."""
    targets = {}
    for folder, path in files:
        with open(os.path.join(root, path)) as f:
            text = strip_comments(f.read())
        local = {}  # CMake target name -> Target
        for m in CALL.finditer(text):
            command, args = m.group(1), m.group(2).split()
            if not args:
                continue
            if command == "tessera_cc_library":
                name = args[args.index("NAME") + 1] if "NAME" in args else "?"
                t = Target(f"tessera::{name}", folder, path, True)
                t.deps = TARGET_REF.findall(m.group(2))
                targets[t.name] = t
                local[f"tessera_{name}"] = t
            elif command in ("add_library", "add_executable"):
                if "ALIAS" in args:
                    continue
                t = Target(args[0], folder, path, False)
                targets[f"{path}:{args[0]}"] = t
                local[args[0]] = t
            elif command == "target_link_libraries" and args[0] in local:
                local[args[0]].deps += TARGET_REF.findall(m.group(2))
    return targets


def read_doc_section(doc_text, heading):
    """The lines of the section under `## heading` (up to the next `## `)."""
    lines = doc_text.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == f"## {heading}":
            out = []
            for rest in lines[i + 1:]:
                if rest.startswith("## "):
                    break
                out.append(rest)
            return out
    return None


def table_rows(lines, first_header_cell):
    """The cells of every body row of the first table whose header starts with the given cell."""
    rows, inside = [], False
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") \
            else None
        if cells is None:
            if inside:
                break
            continue
        if not inside:
            inside = cells[0] == first_header_cell
            continue
        if not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return rows


def without_parentheses(text):
    while True:
        stripped = re.sub(r"\([^()]*\)", "", text)
        if stripped == text:
            return text
        text = stripped


def reachable(folder, edges):
    """The folders `folder` links, directly or through their DEPS."""
    seen, todo = set(), list(edges[folder])
    while todo:
        used = todo.pop()
        if used not in seen:
            seen.add(used)
            todo += list(edges.get(used, {}))
    return seen


def product_sources(root, folder):
    """The .h/.cc files of `folder` (relative to root) that are not tests or fuzz targets."""
    base = os.path.join(root, folder if "/" in folder or folder == "bench" else
                        os.path.join("src", "tessera", folder))
    for dirpath, _, names in sorted(os.walk(base)):
        for name in sorted(names):
            if name.endswith((".h", ".cc")) and not TEST_FILE.search(name):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def with_rows(names, row_of):
    """"a (row 1), b (row 3)", or "nothing"."""
    return ", ".join(f"{n} (row {row_of.get(n, '?')})" for n in names) or "nothing"


def main():
    root = sys.argv[1]
    doc_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, DOC)
    with open(doc_path) as f:
        doc = f.read()
    failures = []
    fail = failures.append

    folders, files = cmake_files(root)
    targets = read_targets(root, files)

    # Folder edges from the link lines: edges[folder][used folder] = [(file, target, dep)].
    edges = {folder: {} for folder in folders}
    for t in targets.values():
        for dep in t.deps:
            used = targets.get(dep)
            if used is None:
                fail(f"{t.file}: {t.name} links {dep}, which no tessera_cc_library defines; "
                     f"fix the name or define the library")
                continue
            if used.folder != t.folder:
                edges[t.folder].setdefault(used.folder, []).append((t.file, t.name, dep))
            if SCAFFOLD_DEP.match(dep) and t.is_library and t.folder not in SCAFFOLD_DIRS \
                    and t.folder != "bench" and not t.folder.startswith("cmd/"):
                fail(f"{t.file}: library {t.name} depends on {dep}: a product library may not "
                     f"link apisim, sim, testing or bench; move the code that needs it to a test "
                     f"or to cmd/")

    # 1. The drawing.
    section = read_doc_section(doc, "Folders and their dependencies")
    if section is None:
        fail(f"{DOC}: no section '## Folders and their dependencies'; the drawing of the rows "
             f"and the table of folder edges belong there")
        section = []
    block = "\n".join(section).split("```")
    drawing = block[1].split("\n") if len(block) > 2 else []
    row_of = {}
    for line in drawing:
        m = re.match(r"\s*row\s+(\d+)\s{2,}(.*)$", line)
        if not m:
            continue
        cells = re.split(r"\s{2,}", m.group(2).strip())
        for cell in cells[1:]:
            name = cell.split()[0].rstrip(":").rstrip("/")
            if name in row_of:
                fail(f"{DOC}: the drawing places {name} twice (rows {row_of[name]} and "
                     f"{m.group(1)}); keep one")
            elif name not in folders:
                fail(f"{DOC}: the drawing places {name} (row {m.group(1)}), which is not a "
                     f"folder (src/tessera/*, cmd/*, bench); remove it or fix its name")
            row_of[name] = int(m.group(1))
    for folder in sorted(folders):
        if folder not in row_of:
            users = sorted(f for f in folders if folder in edges[f])
            low = max([row_of[u] for u in edges[folder] if u in row_of], default=-1) + 1
            high = min([row_of[u] for u in users if u in row_of], default=99) - 1
            where = (f"row {low}" if low == high else f"a row from {low} to {high}") \
                if low <= high else f"a new row between row {low - 1} and row {high + 1}"
            fail(f"{DOC}: folder {folder} is not in the drawing. It uses "
                 f"{with_rows(sorted(edges[folder]), row_of)}; it is used by "
                 f"{with_rows(users, row_of)}. Place it in {where}, and add its row to the table "
                 f"of folder edges")
    for folder in sorted(folders):
        for used, via in sorted(edges[folder].items()):
            if folder in row_of and used in row_of and row_of[used] >= row_of[folder]:
                file, target, dep = via[0]
                fail(f"{file}: {target} (folder {folder}, row {row_of[folder]}) links {dep} "
                     f"(folder {used}, row {row_of[used]}): a folder may use only folders in "
                     f"rows below its own; drop the dependency, or redraw the rows in {DOC}")

    # 2. The table of folder edges.
    table = {}
    for cells in table_rows(section, "folder"):
        name = cells[0].strip("`")
        if name in table:
            fail(f"{DOC}: the table of folder edges has two rows for {name}; keep one")
        if name not in folders:
            fail(f"{DOC}: the table of folder edges has a row for {name}, which is not a folder; "
                 f"remove it or fix its name")
        uses = set()
        for word in re.split(r"[,;]", without_parentheses(cells[1] if len(cells) > 1 else "")):
            word = word.strip().strip("`")
            if word in ("", "—"):
                continue
            if word not in folders:
                fail(f"{DOC}: the row of {name} in the table of folder edges names '{word}', "
                     f"which is not a folder; put comments in parentheses")
            uses.add(word)
        table[name] = uses
    for folder in sorted(folders):
        if folder not in table:
            fail(f"{DOC}: the table of folder edges has no row for {folder}; add "
                 f"| `{folder}` | {', '.join(sorted(edges[folder])) or '—'} |")
            continue
        for used in sorted(set(edges[folder]) - table[folder]):
            file, target, dep = edges[folder][used][0]
            fail(f"{DOC}: the table of folder edges misses {folder} -> {used} ({file}: {target} "
                 f"links {dep}); add {used} to the row of {folder}")
        for used in sorted(table[folder] - set(edges[folder])):
            fail(f"{DOC}: the table of folder edges has {folder} -> {used}, but no product target "
                 f"of {folder} links a library of {used}; remove {used} from the row of {folder}")

    # 3. The table of libraries.
    libraries = {n: t for n, t in targets.items() if t.is_library}
    lib_section = read_doc_section(doc, "Libraries (CMake targets)") or []
    position = {}
    for index, cells in enumerate(table_rows(lib_section, "library (CMake target)")):
        names = re.findall(r"`(tessera::\w+)`", cells[0])
        directory = cells[1].strip("`") if len(cells) > 1 else ""
        for sub, name in enumerate(names):
            if name in position:
                fail(f"{DOC}: the table of libraries lists {name} twice; keep one")
            position[name] = (index, sub)
            if name not in libraries:
                fail(f"{DOC}: the table of libraries lists {name}, which no tessera_cc_library "
                     f"defines; remove its row or fix the name")
            elif libraries[name].file != f"{directory}/CMakeLists.txt":
                fail(f"{DOC}: the table of libraries puts {name} in {directory}, but "
                     f"{libraries[name].file} defines it; fix the directory column")
    for name, t in sorted(libraries.items()):
        if name not in position:
            fail(f"{DOC}: the table of libraries misses {name} ({t.file}); add a row (directory "
                 f"{os.path.dirname(t.file)}, what it holds, its I/O) below every library it "
                 f"uses: {', '.join(sorted(set(t.deps))) or 'none'}")
            continue
        for dep in sorted(set(t.deps)):
            if dep in position and position[dep] >= position[name]:
                fail(f"{DOC}: the table of libraries lists {name} above {dep}, which it links "
                     f"({t.file}); move {name} below {dep}")

    # 4. and 5. Includes: of the folder itself and the folders it links, and outside cmd/ and
    # bench/ none of the scaffolding.
    reach = {folder: reachable(folder, edges) for folder in folders}
    for folder in sorted(folders):
        for path in product_sources(root, folder):
            with open(os.path.join(root, path)) as f:
                text = f.read()
            for m in FOLDER_INCLUDE.finditer(text):
                used = m.group(2) or "bench"
                if used != folder and used in folders and used not in reach[folder]:
                    fail(f"{path} includes {m.group(1)}, but {folder} links no library of "
                         f"{used}; add the library to the DEPS of {folder}'s target (if the rows "
                         f"allow it) or drop the include")
            if folder not in SCAFFOLD_DIRS and folder != "bench" and not folder.startswith("cmd/"):
                for m in INCLUDE.finditer(text):
                    fail(f"{path} includes {m.group(1)}: a product source may not include "
                         f"apisim, sim, testing or bench")

    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} layering failures ({len(folders)} folders, {len(libraries)} libraries, "
          f"{sum(len(e) for e in edges.values())} folder edges checked against {doc_path})")
    return 1 if failures else 0


def self_test(root):
    """Runs the checks on copies of the tree with one mistake each; every copy must fail with
    the failure that names the mistake, and the unchanged copy must pass."""
    import shutil
    import subprocess
    import tempfile

    def edit(path, old, new):
        with open(path) as f:
            text = f.read()
        if old not in text:
            raise SystemExit(f"self-test: {path} no longer holds {old!r}; update the self-test")
        with open(path, "w") as f:
            f.write(text.replace(old, new, 1))

    def swap_lines(path, first, second):
        with open(path) as f:
            lines = f.read().split("\n")
        at = [next((i for i, line in enumerate(lines) if line.startswith(p)), None)
              for p in (first, second)]
        if None in at:
            raise SystemExit(f"self-test: {path} no longer has lines starting {first!r} and "
                             f"{second!r}; update the self-test")
        lines[at[0]], lines[at[1]] = lines[at[1]], lines[at[0]]
        with open(path, "w") as f:
            f.write("\n".join(lines))

    # A folder the drawing does not place, between base (row 0) and json (row 1), the rows no
    # change is expected to move; the other mistakes also touch only stable lines.
    probe_cmake = "tessera_cc_library(NAME layering_probe SRCS probe.cc DEPS tessera::base)\n"
    json_cmake = "src/tessera/json/CMakeLists.txt"
    cases = [
        ("unchanged", [], "0 layering failures"),
        ("an edge to a row above",
         [(json_cmake, "DEPS tessera::base", "DEPS tessera::base tessera::ledger")],
         "tessera::json (folder json, row 1) links tessera::ledger (folder ledger, row 4): a "
         "folder may use only folders in rows below its own"),
        ("an edge within a row",
         [("src/tessera/http/CMakeLists.txt", "DEPS tessera::base",
           "DEPS tessera::base tessera::json")],
         "(folder json, row 1): a folder may use only folders in rows below its own"),
        ("an edge missing from the table",
         [(DOC, "| `json` | base |", "| `json` | — |")],
         "the table of folder edges misses json -> base"),
        ("an extra edge in the table",
         [(DOC, "| `json` | base |", "| `json` | http, base |")],
         "the table of folder edges has json -> http, but no product target of json links"),
        ("a folder the drawing does not place",
         [("src/tessera/layering_probe/CMakeLists.txt", None, probe_cmake),
          (json_cmake, "DEPS tessera::base", "DEPS tessera::base tessera::layering_probe")],
         "folder layering_probe is not in the drawing. It uses base (row 0); it is used by json "
         "(row 1). Place it in a new row between row 0 and row 1"),
        ("a library missing from the table, one the build does not define",
         [(DOC, "| `tessera::json` |", "| `tessera::jsonx` |")],
         ("the table of libraries misses tessera::json (src/tessera/json/CMakeLists.txt)",
          "the table of libraries lists tessera::jsonx, which no tessera_cc_library defines")),
        ("a library above one it uses",
         [(DOC, SWAP, ("| `tessera::base` |", "| `tessera::json` |"))],
         "the table of libraries lists tessera::json above tessera::base, which it links"),
        ("an include of a folder not linked",
         [("src/tessera/json/frame_splitter.cc", "#include",
           '#include "tessera/serve/service.h"\n#include')],
         "src/tessera/json/frame_splitter.cc includes tessera/serve/service.h, but json links no "
         "library of serve"),
        ("a product library linking the scaffolding",
         [(json_cmake, "DEPS tessera::base", "DEPS tessera::base tessera::testing_objects")],
         "library tessera::json depends on tessera::testing_objects"),
    ]
    failed = 0
    for name, edits, expected in cases:
        with tempfile.TemporaryDirectory() as tmp:
            for part in ("src", "cmd", "bench"):
                shutil.copytree(os.path.join(root, part), os.path.join(tmp, part),
                                ignore=shutil.ignore_patterns("*_test.cc", "*_fuzz.cc", "*.yaml",
                                                              "*.json", "*.sh", "*.py"))
            os.makedirs(os.path.join(tmp, "docs"))
            shutil.copy(os.path.join(root, DOC), os.path.join(tmp, DOC))
            for path, old, new in edits:
                full = os.path.join(tmp, path)
                if old is SWAP:
                    swap_lines(full, *new)
                elif old is None:
                    os.makedirs(os.path.dirname(full), exist_ok=True)
                    with open(full, "w") as f:
                        f.write(new)
                else:
                    edit(full, old, new)
            run = subprocess.run([sys.executable, os.path.abspath(__file__), tmp],
                                 capture_output=True, text=True)
            expected = (expected,) if isinstance(expected, str) else expected
            ok = all(e in run.stdout for e in expected) and (run.returncode == 0) == (not edits)
            print(f"{'ok  ' if ok else 'FAIL'} {name}")
            if not ok:
                failed += 1
                print(f"  expected (exit {0 if not edits else 1}): {' / '.join(expected)}\n"
                      f"  got (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--self-test":
        sys.exit(self_test(sys.argv[2]))
    sys.exit(main())
