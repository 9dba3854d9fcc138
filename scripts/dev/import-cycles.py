#!/usr/bin/env python3
"""Import circles between sibling modules of a Rust crate.

usage: scripts/dev/import-cycles.py CRATE_SRC_DIR [...]

Each .rs file is a module (lib.rs/main.rs the root, a/mod.rs or a.rs `a`, a/b.rs `a::b`).
Every `crate::`, `super::` and `self::` path in code (use trees expanded; `#[cfg(test)]`
modules and comments left out) is an arrow from the file's module to the longest module
prefix it names. An arrow between two modules counts between their ancestors that are
siblings (children of the deepest common ancestor); arrows between a module and its own
ancestor are the ordinary parent/child use and do not count. A circle is a strongly
connected set of two or more siblings. Exit status 1 when any circle is found."""
import os, re, sys
from collections import defaultdict

def modpath(root, f):
    rel = os.path.relpath(f, root)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main") and len(rel) == 1: return ()
    if rel[-1] == "mod": rel = rel[:-1]
    return tuple(rel)

def strip(src):
    src = re.sub(r'//[^\n]*', '', src)
    src = re.sub(r'/\*.*?\*/', '', src, flags=re.S)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    # drop #[cfg(test)] mod NAME { ... } blocks
    out, i = [], 0
    for m in re.finditer(r'#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{', src):
        if m.start() < i: continue
        out.append(src[i:m.start()]); depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {'{': 1, '}': -1}.get(src[j], 0); j += 1
        i = j
    out.append(src[i:])
    return ''.join(out)

def expand(tree):
    tree = tree.strip()
    k = tree.find('{')
    if k < 0: return [tree]
    prefix, body = tree[:k], tree[k+1:tree.rfind('}')]
    parts, depth, cur = [], 0, ''
    for c in body:
        if c == ',' and depth == 0: parts.append(cur); cur = ''; continue
        depth += (c == '{') - (c == '}'); cur += c
    parts.append(cur)
    return [prefix + p2 for p in parts if p.strip() for p2 in expand(p)]

def paths(src):
    for m in re.finditer(r'\buse\s+([^;]+);', src):
        for p in expand(re.sub(r'\s+', '', m.group(1))):
            yield p.split(' as ')[0]
    for m in re.finditer(r'\b((?:crate|super|self)(?:::\w+)+)', src):
        yield m.group(1)

def resolve(cur, p, mods, is_modfile):
    segs = p.split('::')
    if segs[0] == 'crate': base, segs = (), segs[1:]
    elif segs[0] in ('super', 'self'):
        base = cur if is_modfile or cur == () else cur  # module path of the file
        while segs and segs[0] in ('super', 'self'):
            if segs[0] == 'super': base = base[:-1]
            segs = segs[1:]
    else: return None
    best = base
    for i in range(len(segs)):
        cand = base + tuple(segs[:i+1])
        if cand in mods: best = cand
        else: break
    return best

def check(root):
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith('.rs')]
    mods = {modpath(root, f): f for f in files}
    edges = defaultdict(set)
    for m, f in mods.items():
        src = strip(open(f, encoding='utf-8').read())
        for p in paths(src):
            t = resolve(m, p, mods, f.endswith('mod.rs'))
            if t is None or t == m: continue
            n = 0
            while n < min(len(m), len(t)) and m[n] == t[n]: n += 1
            if n == len(m) or n == len(t): continue  # ancestor/descendant
            a, b = m[:n+1], t[:n+1]
            edges[a].add((b, '::'.join(m) or 'crate', p))
    graph = defaultdict(set)
    for a, bs in edges.items():
        for b, _, _ in bs: graph[a].add(b)
    # Tarjan
    index, low, stack, on, sccs, c = {}, {}, [], set(), [], [0]
    def strong(v):
        index[v] = low[v] = c[0]; c[0] += 1; stack.append(v); on.add(v)
        for w in graph[v]:
            if w not in index: strong(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            s = []
            while True:
                w = stack.pop(); on.discard(w); s.append(w)
                if w == v: break
            if len(s) > 1: sccs.append(s)
    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index: strong(v)
    for s in sccs:
        names = sorted('::'.join(x) for x in s)
        print(f"{root}: circle {' <-> '.join(names)}")
        for a in s:
            for b, frm, p in sorted(edges[a]):
                if b in s: print(f"    {frm} uses {p}")
    return len(sccs)

n = sum(check(r) for r in sys.argv[1:])
print(f"{n} import circle(s)")
sys.exit(1 if n else 0)
