#!/usr/bin/env python3
"""Rooms of a Rust tree: source files over a line limit, and functions over a line limit
whose doc comment gives no reason (a doc line with "long", "lines" or "one piece" in it
counts as one).

usage: scripts/dev/rooms.py [--file-max N] [--fn-max N] DIR...     exit status 1 when any is found"""
import os, re, sys

args = sys.argv[1:]
file_max, fn_max = 1000, 150
while args and args[0].startswith('--'):
    k, v = args[0], int(args[1]); args = args[2:]
    if k == '--file-max': file_max = v
    elif k == '--fn-max': fn_max = v
bad = 0
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
for root in args:
    for d, _, fs in os.walk(root):
        if '/target' in d or '/.git' in d: continue
        for f in sorted(fs):
            if not f.endswith('.rs'): continue
            p = os.path.join(d, f)
            text = open(p, encoding='utf-8').read()
            lines = text.split('\n')
            # Strings, chars and comments blanked, newlines kept, so braces inside them don't count.
            def blank(m):
                return re.sub(r'[^\n]', ' ', m.group(0))
            code = re.sub(r'r(#*)"(?:.|\n)*?"\1|"(?:\\.|[^"\\])*"|//[^\n]*|\'(?:\\.|[^\'\\])\'', blank, text, flags=re.S).split('\n')
            if len(lines) > file_max:
                print(f"file {p}: {len(lines)} lines"); bad += 1
            i = 0
            while i < len(lines):
                m = fn_re.match(lines[i])
                if not m: i += 1; continue
                # find the opening brace and match it
                depth, j, started = 0, i, False
                while j < len(lines):
                    s = code[j]
                    if not started and ';' in s and '{' not in s: break
                    for c in s:
                        if c == '{': depth += 1; started = True
                        elif c == '}': depth -= 1
                    if started and depth == 0: break
                    j += 1
                n = j - i + 1
                if started and n > fn_max:
                    k, doc = i - 1, []
                    while k >= 0 and (lines[k].strip().startswith('///') or lines[k].strip().startswith('#[')):
                        doc.append(lines[k]); k -= 1
                    reason = any(re.search(r'\blong\b|\blines\b|\bone piece\b', x) for x in doc)
                    if not reason:
                        print(f"fn {p}:{i+1} {m.group(7)}: {n} lines"); bad += 1
                i += 1
print(f"{bad} over the limits")
sys.exit(1 if bad else 0)
