#!/usr/bin/env python3
"""The house has no circles: checks that no file imports a file that imports it back, and that
no crate depends on a crate above it.

Why this exists: a circle of files is a place where a reader cannot tell which file is the lower
one, and it only grows once it exists (DESIGN.md: "No file imports a file that imports it back").
The compiler allows both, so this script is what keeps them out. It runs first in
scripts/test.sh (cheap, fails fast) and needs only Python 3 and its standard library.

    python3 scripts/check_circles.py              # check crates/*; exit 1 with the circles
    python3 scripts/check_circles.py --self-test  # prove the check finds a synthetic circle
    python3 scripts/check_circles.py --graph ferrite-tensor   # print one crate's file arrows

Files: for every crate under crates/, the module tree is read from its roots (src/lib.rs,
src/main.rs, src/bin/*.rs) through `mod name;` declarations. A file's arrows are its `use`
items (trees expanded: `use crate::{a::B, c::*}`) and the paths written in code
(`crate::x::f()`, `super::Y`, `child::Z`, or `alias::Z` after `use crate::alias;`), resolved to
the file that defines the item: `crate::Tensor` is followed through lib.rs's `pub use
tensor::Tensor` to tensor.rs, so a re-export is not mistaken for a dependency on lib.rs. `mod`
declarations are not arrows (a parent names its children; that is the tree, not a use).
Comments, doc comments (examples included) and string literals are ignored. A strongly
connected component of more than one file is a circle: the script prints one cycle through it
with the line that makes each arrow, and the other files of the component.

Crates: the order below is DESIGN.md's "memory ← tensor ← nn ← optim/data/io ← models ←
plan/parallel ← train ← cli", with the `ferrite` facade on top. A crate may depend
([dependencies], [build-dependencies], [dev-dependencies], target-specific ones too) on crates at
its own level or below, never above. `ferrite-test-support` is the tests' toolbox beside the
house: every crate may dev-depend on it, and it may depend on any library crate.

Known circles that are being removed elsewhere are listed, one arrow per line, in
scripts/check_circles.allow (see that file); an allowed arrow is dropped before the search, so
every other circle still fails, and an allowed arrow that no longer exists is reported so that
its line is deleted.
"""

import argparse
import os
import re
import sys
import tempfile

# DESIGN.md's order, lowest first. Same level: may depend on each other (one way, as Cargo
# requires); higher level: may depend on anything lower.
LEVELS = {
    "ferrite-memory": 0,
    "ferrite-tensor": 1,
    "ferrite-cuda": 1,
    "ferrite-nn": 2,
    "ferrite-optim": 3,
    "ferrite-data": 3,
    "ferrite-io": 3,
    "ferrite-models": 4,
    "ferrite-conformance": 4,
    "ferrite-plan": 5,
    "ferrite-parallel": 5,
    "ferrite-train": 6,
    "ferrite-cli": 7,
    "ferrite": 8,
}
# The tests' toolbox: anything may dev-depend on it, it may depend on any library crate.
TEST_SUPPORT = "ferrite-test-support"

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ROOT = os.path.dirname(HERE)
DEFAULT_ALLOW = os.path.join(HERE, "check_circles.allow")

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# ---------------------------------------------------------------------------------------------
# Reading Rust: blank out comments and literals, keeping offsets and line numbers.


def strip_rust(text):
    """Returns `text` with comments, string and char literals replaced by spaces (newlines kept),
    so that the regular expressions below only ever see code."""
    out = list(text)
    n = len(text)
    i = 0

    def blank(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(?:br|r|b)(#*)"', text[i:])
            if m and (m.group(0).startswith("r") or m.group(0).startswith("br")):
                close = '"' + m.group(1)
                j = text.find(close, i + len(m.group(0)))
                j = n if j < 0 else j + len(close)
                blank(i, j)
                i = j
            elif m:  # b"..." is an ordinary escaped string
                i += 1
            elif text.startswith("b'", i):
                i += 1
            else:
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a): only the first ends
            # with a quote right after one (escaped) character.
            if i + 1 < n and text[i + 1] == "\\":
                j = i + 2
                while j < n and text[j] != "'":
                    j += 1
                blank(i, j + 1)
                i = j + 1
            elif i + 2 < n and text[i + 2] == "'":
                blank(i, i + 3)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def matching_brace(code, open_pos):
    depth = 0
    for j in range(open_pos, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code)


def split_top(s):
    """Splits a use-tree list on commas that are not inside braces."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_use_tree(tree, prefix=()):
    """`a::{b::C, d@E, f::*, self}` → [(path, None, is_glob)]; expand_use binds the names."""
    tree = re.sub(r"\s+", "", tree)
    results = []
    brace = tree.find("{")
    if brace >= 0:
        head = tree[:brace].rstrip(":")
        head_segs = [s for s in head.split("::") if s] if head else []
        inner = tree[brace + 1 : tree.rfind("}")]
        for part in split_top(inner):
            results.extend(expand_use_tree(part, prefix + tuple(head_segs)))
        return results
    if tree.endswith("*"):
        segs = [s for s in tree[:-1].split("::") if s]
        return [(prefix + tuple(segs), None, True)]
    # Aliases arrive marked as `name@alias` (see expand_use), so a path is segments only.
    segs = [s for s in tree.split("::") if s]
    path = prefix + tuple(segs)
    return [(path, None, False)] if path else []


def expand_use(raw):
    """Expands a `use` item's tree, keeping `as` aliases (whitespace matters for those)."""
    # Mark aliases before whitespace is squeezed: `foo as bar` → `foo@bar`.
    marked = re.sub(r"\s+as\s+", "@", raw.strip())
    out = []
    for path, _alias, glob in expand_use_tree(marked):
        alias = None
        if path and "@" in path[-1]:
            last, alias = path[-1].split("@", 1)
            path = path[:-1] + (last,)
        if path and path[-1] == "self":
            path = path[:-1]
        if not path:
            continue
        bound = None if glob else (alias if alias else path[-1])
        if bound == "_":
            bound = None
        out.append((path, bound, glob))
    return out


DEF_RE = r"\b(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+{name}\b"


class RustFile:
    def __init__(self, path, rel, mod_path):
        self.path = path
        self.rel = rel
        self.mod_path = mod_path  # tuple of segments from the crate root
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        code = strip_rust(self.text)
        # `pub(in crate::a)` is a visibility, not a use of `a`.
        code = re.sub(r"pub\s*\(\s*in\s+[^)]*\)", lambda m: " " * len(m.group(0)), code)
        self.code = code
        # Inline modules: (start, end, name), positions of their braces.
        self.inline = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", code):
            open_pos = m.end() - 1
            self.inline.append((open_pos, matching_brace(code, open_pos), m.group(1)))
        # Out-of-line child modules declared here: `mod name;` (at any inline depth).
        self.decls = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*;", code):
            self.decls.append((m.group(1), self.module_at(m.start())))
        # `use` items: (module they sit in, line, [(path, bound, glob)], span).
        self.uses = []
        self.public_uses = set()  # indices into uses of `pub use` items (re-exports)
        for m in re.finditer(r"(?<![A-Za-z0-9_])use\s+", code):
            end = code.find(";", m.end())
            if end < 0:
                continue
            raw = code[m.end() : end]
            if raw.lstrip().startswith("::"):
                continue  # an absolute path: an external crate
            public = re.search(r"\bpub\s*(\([^)]*\))?\s*$", code[max(0, m.start() - 40) : m.start()])
            self.uses.append(
                (self.module_at(m.start()), line_of(code, m.start()), expand_use(raw), (m.start(), end))
            )
            if public:
                self.public_uses.add(len(self.uses) - 1)

    def module_at(self, pos):
        names = [name for (a, b, name) in sorted(self.inline) if a < pos < b]
        return self.mod_path + tuple(names)

    def inline_modules(self):
        return {self.module_at(a + 1) for (a, _b, _n) in self.inline}

    def defines(self, name):
        return re.search(DEF_RE.format(name=re.escape(name)), self.code) is not None


class Crate:
    """One crate root's module tree (lib.rs and main.rs are separate trees)."""

    def __init__(self, crate_dir, root_rel):
        self.crate_dir = crate_dir
        self.files = {}  # rel path -> RustFile
        self.modules = {}  # module path -> rel path of the file holding it
        self._alias_cache = {}
        self._load(root_rel, ())
        for f in list(self.files.values()):
            for mp in f.inline_modules():
                self.modules.setdefault(mp, f.rel)

    def _load(self, rel, mod_path):
        if rel in self.files:
            return
        f = RustFile(os.path.join(self.crate_dir, rel), rel, mod_path)
        self.files[rel] = f
        self.modules[mod_path] = rel
        base = os.path.basename(rel)
        d = os.path.dirname(rel)
        if base in ("lib.rs", "main.rs", "mod.rs") or (
            os.path.dirname(rel) == "src/bin" and mod_path == ()
        ):
            child_dir = d
        else:
            child_dir = os.path.join(d, base[:-3])
        for name, in_mod in f.decls:
            sub = in_mod[len(mod_path) :]
            cdir = os.path.join(child_dir, *sub)
            for cand in (os.path.join(cdir, name + ".rs"), os.path.join(cdir, name, "mod.rs")):
                if os.path.isfile(os.path.join(self.crate_dir, cand)):
                    self._load(cand, in_mod + (name,))
                    break

    # -- resolution ---------------------------------------------------------------------------

    def start(self, seg, here, aliases):
        """Where a path's first segment points: a module path, or None (external/std)."""
        if seg == "crate":
            return ()
        if seg == "self":
            return here
        if seg == "super":
            return here[:-1]
        if here + (seg,) in self.modules:
            return here + (seg,)
        if seg in aliases:
            return aliases[seg]
        return None

    def resolve(self, path, here, aliases, depth=0):
        """The file an imported or written path lands in, or None outside this crate."""
        if not path or depth > 12:
            return None
        mod = self.start(path[0], here, aliases)
        if mod is None:
            return None
        rest = list(path[1:])
        while rest and rest[0] == "super":
            mod = mod[:-1]
            rest.pop(0)
        while rest and mod + (rest[0],) in self.modules:
            mod = mod + (rest.pop(0),)
        if mod not in self.modules:
            return None
        if not rest:
            return self.modules[mod]
        return self.item_file(mod, rest[0], depth + 1, set())

    def item_file(self, mod, name, depth, seen):
        """The file defining `name` as seen from module `mod`: re-exports are followed."""
        rel = self.modules[mod]
        if (mod, name) in seen or depth > 12:
            return rel
        seen.add((mod, name))
        f = self.files[rel]
        if f.defines(name):
            return rel
        for (umod, _line, items, _span) in f.uses:
            if umod != mod:
                continue
            for path, bound, glob in items:
                if not glob and bound == name:
                    # None: a re-export of another crate's item (`pub use ferrite_memory::Device`).
                    return self.resolve_in(path, umod, f, depth)
        for (umod, _line, items, _span) in f.uses:
            if umod != mod:
                continue
            for path, _bound, glob in items:
                if glob:
                    gmod = self.module_of(path, umod, f)
                    if gmod is not None and gmod != mod:
                        gfile = self.files[self.modules[gmod]]
                        if gfile.defines(name) or any(
                            b == name for (um, _l, its, _s) in gfile.uses if um == gmod for (_p, b, _g) in its
                        ):
                            return self.item_file(gmod, name, depth + 1, seen)
        if mod == ():
            # `crate::name!`: a `#[macro_export]` macro sits at the root wherever it is written.
            for other in self.files.values():
                if re.search(r"\bmacro_rules!\s*" + re.escape(name) + r"\b", other.code):
                    return other.rel
        return rel

    def module_of(self, path, here, f):
        mod = self.start(path[0], here, self.aliases(f, here))
        if mod is None:
            return None
        for seg in path[1:]:
            if seg == "super":
                mod = mod[:-1]
            elif mod + (seg,) in self.modules:
                mod = mod + (seg,)
            else:
                return None
        return mod if mod in self.modules else None

    def aliases(self, f, here):
        """Names that `use` binds to modules in module `here` of file f (`use crate::ops;`)."""
        key = (f.rel, here)
        cache = self._alias_cache
        if key in cache:
            return cache[key]
        cache[key] = {}
        out = {}
        for (umod, _line, items, _span) in f.uses:
            if umod != here:
                continue
            for path, bound, glob in items:
                if glob or bound is None:
                    continue
                mod = self.start(path[0], here, {})
                if mod is None:
                    continue
                ok = True
                for seg in path[1:]:
                    if seg == "super":
                        mod = mod[:-1]
                    elif mod + (seg,) in self.modules:
                        mod = mod + (seg,)
                    else:
                        ok = False
                        break
                if ok and mod in self.modules:
                    out[bound] = mod
        cache[key] = out
        return out

    def resolve_in(self, path, here, f, depth=0):
        return self.resolve(path, here, self.aliases(f, here), depth)

    def below(self, rel, f):
        """Whether file `rel` holds a module strictly inside file f's module."""
        if rel is None or rel not in self.files:
            return False
        mp = self.files[rel].mod_path
        return len(mp) > len(f.mod_path) and mp[: len(f.mod_path)] == f.mod_path

    # -- the graph ----------------------------------------------------------------------------

    def edges(self):
        """{(from_rel, to_rel): first line} over every file of this tree."""
        edges = {}

        def add(a, b, line):
            if b and a != b and (a, b) not in edges:
                edges[(a, b)] = line

        for f in self.files.values():
            spans = []
            for k, (umod, line, items, span) in enumerate(f.uses):
                spans.append(span)
                for path, _bound, _glob in items:
                    target = self.resolve_in(path, umod, f)
                    if k in f.public_uses and self.below(target, f):
                        continue  # a parent re-exporting its own child's item: the tree
                    add(f.rel, target, line)
            spans.sort()
            for m in re.finditer(
                r"(?<![A-Za-z0-9_:$])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)", f.code
            ):
                if any(a <= m.start() < b for (a, b) in spans):
                    continue
                segs = [m.group(1)] + re.findall(IDENT, m.group(2))
                here = f.module_at(m.start())
                add(f.rel, self.resolve_in(segs, here, f), line_of(f.code, m.start()))
        return edges


def crate_roots(crate_dir):
    roots = []
    for r in ("src/lib.rs", "src/main.rs"):
        if os.path.isfile(os.path.join(crate_dir, r)):
            roots.append(r)
    bindir = os.path.join(crate_dir, "src/bin")
    if os.path.isdir(bindir):
        for name in sorted(os.listdir(bindir)):
            if name.endswith(".rs"):
                roots.append("src/bin/" + name)
            elif os.path.isfile(os.path.join(bindir, name, "main.rs")):
                roots.append("src/bin/%s/main.rs" % name)
    return roots


def tarjan(nodes, succ):
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(succ.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def one_cycle(comp, succ):
    """A shortest cycle through the component's first file (breadth-first, inside it)."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(succ.get(v, ())):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp + [comp[0]]


# ---------------------------------------------------------------------------------------------
# Cargo.toml: crate-level direction.


def cargo_deps(toml_path):
    """[(section, dependency name)] for every dependency table in one Cargo.toml."""
    deps, section = [], None
    with open(toml_path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.match(r"^\[(.+)\]$", line)
            if m:
                head = m.group(1).strip()
                kind = re.search(r"(^|\.)(dependencies|dev-dependencies|build-dependencies)(\.(.+))?$", head)
                if kind and kind.group(4):  # [dependencies.ferrite-x]
                    deps.append((kind.group(2), kind.group(4).strip().strip('"')))
                    section = None
                elif kind:
                    section = kind.group(2)
                else:
                    section = None
                continue
            if section:
                m = re.match(r'^"?([A-Za-z0-9_-]+)"?\s*(\.|=)', line)
                if m:
                    deps.append((section, m.group(1)))
    return deps


def package_name(toml_path):
    section = None
    with open(toml_path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            m = re.match(r"^\[(.+)\]$", line)
            if m:
                section = m.group(1).strip()
                continue
            if section == "package":
                m = re.match(r'^name\s*=\s*"([^"]+)"', line)
                if m:
                    return m.group(1)
    return os.path.basename(os.path.dirname(toml_path))


def check_crate_order(crate_dirs):
    problems = []
    for d in crate_dirs:
        toml = os.path.join(d, "Cargo.toml")
        if not os.path.isfile(toml):
            continue
        name = package_name(toml)
        if name != TEST_SUPPORT and name not in LEVELS:
            problems.append(
                "%s: not in the crate order; add it to LEVELS in scripts/check_circles.py at its "
                "place in DESIGN.md's map" % name
            )
            continue
        for section, dep in cargo_deps(toml):
            if not dep.startswith("ferrite"):
                continue
            if dep == TEST_SUPPORT:
                if section != "dev-dependencies" and name != TEST_SUPPORT:
                    problems.append(
                        "%s: [%s] on %s; the tests' toolbox is a dev-dependency only"
                        % (name, section, dep)
                    )
                continue
            if name == TEST_SUPPORT:
                continue
            if dep not in LEVELS:
                problems.append("%s: [%s] on %s, which is not in the crate order" % (name, section, dep))
            elif LEVELS[dep] > LEVELS[name]:
                problems.append(
                    "%s (level %d): [%s] on %s (level %d), a crate above it"
                    % (name, LEVELS[name], section, dep, LEVELS[dep])
                )
    return problems


# ---------------------------------------------------------------------------------------------
# The check.


def read_allow(path):
    """Allowed arrows: `crate-name path/a.rs -> path/b.rs` per line, `#` comments."""
    allowed = []
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for n, raw in enumerate(f, 1):
                line = raw.split("#", 1)[0].strip()
                if not line:
                    continue
                m = re.match(r"^(\S+)\s+(\S+)\s*->\s*(\S+)$", line)
                if not m:
                    raise SystemExit("%s:%d: expected `crate from.rs -> to.rs`" % (path, n))
                allowed.append(m.groups())
    return allowed


def crate_dirs_under(root):
    base = os.path.join(root, "crates")
    return [os.path.join(base, n) for n in sorted(os.listdir(base)) if os.path.isdir(os.path.join(base, n))]


def check(root, allow_path, out=sys.stdout, graph_of=None):
    """Prints what it finds; returns the number of problems (circles + order violations)."""
    allowed = read_allow(allow_path)
    used_allow = set()
    problems = 0
    total_files = 0
    for d in crate_dirs_under(root):
        cname = os.path.basename(d)
        if os.path.isfile(os.path.join(d, "Cargo.toml")):
            cname = package_name(os.path.join(d, "Cargo.toml"))
        for root_rel in crate_roots(d):
            crate = Crate(d, root_rel)
            total_files += len(crate.files)
            edges = crate.edges()
            for a in allowed:
                if a[0] == cname and (a[1], a[2]) in edges:
                    del edges[(a[1], a[2])]
                    used_allow.add(a)
            if graph_of == cname:
                for (a, b), line in sorted(edges.items()):
                    print("%s:%d -> %s" % (a, line, b), file=out)
            succ = {}
            for (a, b) in edges:
                succ.setdefault(a, set()).add(b)
            for comp in tarjan(crate.files.keys(), succ):
                if len(comp) < 2:
                    continue
                problems += 1
                cyc = one_cycle(comp, succ)
                print("circle in %s (%d files):" % (cname, len(comp)), file=out)
                for a, b in zip(cyc, cyc[1:]):
                    line = edges[(a, b)]
                    text = crate.files[a].text.splitlines()[line - 1].strip()
                    print("    %s:%d  -> %s    %s" % (a, line, b, text[:100]), file=out)
                rest = [c for c in comp if c not in cyc]
                if rest:
                    print("    also in the circle: %s" % ", ".join(rest), file=out)
    for a in allowed:
        if a not in used_allow:
            print(
                "note: allowed arrow no longer exists, delete its line from %s: %s %s -> %s"
                % (os.path.relpath(allow_path, root), a[0], a[1], a[2]),
                file=out,
            )
    for p in check_crate_order(crate_dirs_under(root)):
        problems += 1
        print("crate order: " + p, file=out)
    if used_allow:
        crates = sorted({a[0] for a in used_allow})
        print(
            "allowed: %d known arrow(s) in %s, listed with their reasons in %s"
            % (len(used_allow), ", ".join(crates), os.path.relpath(allow_path, root)),
            file=out,
        )
    if problems == 0:
        print("no circles: %d files, every crate depends downwards only" % total_files, file=out)
    return problems


# ---------------------------------------------------------------------------------------------
# Self-test: a check that cannot fail is worthless.


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def self_test():
    import io

    def run(root, allow=None):
        buf = io.StringIO()
        n = check(root, allow, out=buf)
        return n, buf.getvalue()

    failures = []

    def expect(cond, what, output):
        if not cond:
            failures.append("%s\n--- output ---\n%s" % (what, output))

    with tempfile.TemporaryDirectory() as tmp:
        # A clean tree: re-exports through lib.rs, a child module, comments and strings naming
        # other files, a test module using super::*, a glob re-export.
        mem = os.path.join(tmp, "clean")
        write(mem, "crates/ferrite-memory/Cargo.toml", '[package]\nname = "ferrite-memory"\n')
        write(
            mem,
            "crates/ferrite-memory/src/lib.rs",
            "mod device;\nmod gpu;\npub mod low;\npub use device::Device;\npub use low::*;\n",
        )
        write(mem, "crates/ferrite-memory/src/low.rs", "pub struct Low;\n")
        write(
            mem,
            "crates/ferrite-memory/src/device.rs",
            "//! Uses crate::gpu::Adapter only in this comment.\n"
            "use crate::Low;\npub struct Device;\n"
            'const S: &str = "crate::gpu::Adapter";\n'
            "#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::device::Device as D;\n}\n",
        )
        write(
            mem,
            "crates/ferrite-memory/src/gpu/mod.rs",
            "mod adapter;\nuse crate::Device;\npub use adapter::Adapter;\n",
        )
        write(mem, "crates/ferrite-memory/src/gpu/adapter.rs", "use crate::low::Low;\npub struct Adapter;\n")
        n, out = run(mem)
        expect(n == 0, "a clean tree reported problems", out)

        # A circle of three files through re-exports, an inline path and `super::`; and a
        # parent that calls its child while the child imports the parent's trait.
        circ = os.path.join(tmp, "circle")
        write(circ, "crates/ferrite-tensor/Cargo.toml", '[package]\nname = "ferrite-tensor"\n')
        write(
            circ,
            "crates/ferrite-tensor/src/lib.rs",
            "pub mod ops;\npub mod backend;\nmod kernels;\npub use ops::Plan;\n",
        )
        write(circ, "crates/ferrite-tensor/src/ops/mod.rs", "mod reduce;\npub use reduce::Plan;\n")
        write(
            circ,
            "crates/ferrite-tensor/src/ops/reduce.rs",
            "pub struct Plan;\nfn f() { crate::backend::cpu::run(); }\n",
        )
        write(circ, "crates/ferrite-tensor/src/backend/mod.rs", "pub mod cpu;\nuse crate::Plan;\npub trait Kernel {}\n")
        write(circ, "crates/ferrite-tensor/src/backend/cpu.rs", "use super::Kernel;\npub fn run() {}\n")
        write(circ, "crates/ferrite-tensor/src/kernels.rs", "mod avx;\npub trait Micro {}\nfn go() { avx::tile(); }\n")
        write(circ, "crates/ferrite-tensor/src/kernels/avx.rs", "use super::Micro;\npub fn tile() {}\n")
        n, out = run(circ)
        expect(n == 2, "the three-file circle and the parent/child circle were not both reported", out)
        expect(
            all(f in out for f in ("src/backend/mod.rs", "src/ops/reduce.rs", "src/backend/cpu.rs")),
            "the circle's files are not named",
            out,
        )
        expect("src/kernels/avx.rs" in out, "a parent calling the child that imports it was missed", out)
        expect("src/lib.rs" not in out and "src/ops/mod.rs" not in out, "a re-export was taken for a use", out)

        # The same tree with its closing arrow allowed passes; a stale allow is reported.
        allow = os.path.join(tmp, "allow")
        write(
            tmp,
            "allow",
            "ferrite-tensor src/ops/reduce.rs -> src/backend/cpu.rs\n"
            "ferrite-tensor src/kernels.rs -> src/kernels/avx.rs\n"
            "ferrite-tensor src/a.rs -> src/b.rs\n",
        )
        n, out = run(circ, allow)
        expect(n == 0, "an allowed arrow still failed", out)
        expect("no longer exists" in out and "src/a.rs" in out, "a stale allow line was not reported", out)

        # A crate that depends on a crate above it, and an unknown crate.
        write(mem, "crates/ferrite-memory/Cargo.toml",
              '[package]\nname = "ferrite-memory"\n[dependencies]\nferrite-nn.workspace = true\n'
              '[dev-dependencies]\nferrite-test-support = { path = "../x" }\n')
        write(mem, "crates/ferrite-widgets/Cargo.toml", '[package]\nname = "ferrite-widgets"\n')
        write(mem, "crates/ferrite-widgets/src/lib.rs", "")
        n, out = run(mem)
        expect(n == 2, "the upward dependency and the unknown crate were not both reported", out)
        expect("a crate above it" in out and "ferrite-widgets" in out, "crate-order messages missing", out)

    if failures:
        for f in failures:
            print("self-test FAILED: " + f)
        return 1
    print("self-test passed: circles, allowed arrows and upward crate dependencies are found")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=DEFAULT_ROOT, help="the workspace (default: this repository)")
    ap.add_argument("--allow", default=DEFAULT_ALLOW, help="allowed arrows (default: %(default)s)")
    ap.add_argument("--self-test", action="store_true", help="check the checker on synthetic trees")
    ap.add_argument("--graph", metavar="CRATE", help="also print CRATE's file arrows")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    return 1 if check(args.root, args.allow, graph_of=args.graph) else 0


if __name__ == "__main__":
    sys.exit(main())
