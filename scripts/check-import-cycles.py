#!/usr/bin/env python3
"""Fail when the crate's modules import each other in a circle.

    scripts/check-import-cycles.py [SRC_DIR]     (default: mlx-backend)

A node is one source file (a `mod.rs` is its folder's module). File A
depends on file B when A names an item of B through a `crate::`, `super::`
or `self::` path, in a `use` declaration or inline in code; a name that a
module only imports or re-exports is followed to the module that defines
it. A parent's `pub use child::..` is its facade, not a dependency, and
`mod child;` declarations are not edges. Every strongly connected
component of more than one file is printed, and the exit status is 1 if
there is one. Python 3 standard library only; a heuristic (no macro
expansion, no trait resolution) that errs towards reporting edges.
"""
import os
import re
import sys


def strip_comments_and_strings(text):
    """Blank out comments, string and char literals, keeping offsets."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i:i + 8]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(b?r)(#*)"', text[i:])
            close = '"' + m.group(2)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_files(src):
    """{module path tuple: file} for every .rs file under src."""
    modules = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
            if rel == ["lib"] or rel == ["main"]:
                rel = []
            elif rel[-1] == "mod":
                rel = rel[:-1]
            modules[tuple(rel)] = os.path.join(root, f)
    return modules


def inline_scopes(code):
    """[(start, end, names)]: the inline `mod name { .. }` blocks."""
    scopes = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        scopes.append((m.start(), j, m.group(1)))
    return scopes


def scope_at(scopes, pos):
    return tuple(name for start, end, name in scopes if start <= pos < end)


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]] (aliases dropped)."""
    tree = re.sub(r"\s+", " ", tree).strip()

    def parse(s, prefix):
        s = s.strip()
        if not s:
            return []
        brace = s.find("{")
        if brace < 0:
            s = re.sub(r"\s+as\s+\w+$", "", s)
            return [prefix + [p.strip() for p in s.split("::") if p.strip()]]
        head = [p.strip() for p in s[:brace].split("::") if p.strip()]
        inner = s[brace + 1:s.rfind("}")]
        parts, depth, cur = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        parts.append(cur)
        out = []
        for p in parts:
            out.extend(parse(p, prefix + head))
        return out

    return parse(tree, [])


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "mlx-backend"
    modules = module_files(src)
    parsed = {}
    # Per module: name -> (absolute path, is_pub) for its `use` declarations.
    imports = {mod: {} for mod in modules}
    for mod, path in modules.items():
        with open(path, encoding="utf-8") as f:
            code = strip_comments_and_strings(f.read())
        scopes = inline_scopes(code)
        uses, spans = [], []
        for m in re.finditer(r"\b(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);", code):
            scope = scope_at(scopes, m.start())
            spans.append((m.start(), m.end()))
            for p in expand_use_tree(m.group(2)):
                uses.append((p, scope, bool(m.group(1))))
        inline = []
        for m in re.finditer(r"\b(?:crate|super|self)(?:\s*::\s*\w+)+", code):
            if any(s <= m.start() < e for s, e in spans):
                continue
            p = [s.strip() for s in m.group(0).split("::")]
            inline.append((p, scope_at(scopes, m.start())))
        parsed[mod] = (uses, inline)

    def absolute(mod, scope, p):
        """A path's segments from the crate root, or None (an outside crate)."""
        if not p:
            return None
        if p[0] == "crate":
            return list(p[1:])
        base = list(mod) + list(scope)
        if p[0] not in ("super", "self"):
            return None
        i = 0
        while i < len(p) and p[i] in ("super", "self"):
            if p[i] == "super":
                base = base[:-1]
            i += 1
        return base + list(p[i:])

    for mod, (uses, _) in parsed.items():
        for p, scope, is_pub in uses:
            full = absolute(mod, scope, p)
            if full is None and p and len(p) > 1 and tuple(list(mod) + [p[0]]) in modules:
                full = list(mod) + p  # `use child::x` (2015-style relative)
            if full and not scope and full[-1] != "*":
                imports[mod][full[-1]] = (full, is_pub)

    def resolve(full, seen=()):
        """The file module that defines what `full` names."""
        i, cur = 0, ()
        while i < len(full) and cur + (full[i],) in modules:
            cur += (full[i],)
            i += 1
        if i < len(full) and full[i] in imports.get(cur, {}) and (cur, full[i]) not in seen:
            target, _ = imports[cur][full[i]]
            return resolve(target + full[i + 1:], seen + ((cur, full[i]),))
        return cur

    edges = {mod: set() for mod in modules}
    for mod, (uses, inline) in parsed.items():
        refs = [(p, scope, is_pub) for p, scope, is_pub in uses]
        refs += [(p, scope, False) for p, scope in inline]
        for p, scope, is_pub in refs:
            full = absolute(mod, scope, p)
            if full is None and p and tuple(list(mod) + [p[0]]) in modules:
                full = list(mod) + p
            if full is None:
                continue
            target = resolve([s for s in full if s != "*"])
            if target == mod:
                continue
            if is_pub and target[: len(mod)] == mod:
                continue  # a facade re-export of a descendant
            edges[mod].add(target)

    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
            sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    cycles = [sorted(c) for c in sccs if len(c) > 1]
    name = lambda m: os.path.relpath(modules[m])
    for comp in sorted(cycles, key=len, reverse=True):
        print(f"import cycle of {len(comp)} files:")
        members = set(comp)
        for m in comp:
            inside = sorted(name(t) for t in edges[m] if t in members)
            print(f"  {name(m)} -> {', '.join(inside)}")
    if cycles:
        return 1
    print(f"no import cycles among {len(modules)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
