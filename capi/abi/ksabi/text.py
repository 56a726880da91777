"""Line filling shared by the emitters, and the marked blocks of hand-written files."""
from __future__ import annotations

import re


def fill(head: str, items: list[str], tail: str, width: int, indent: str, sep: str = ", ",
         trail: bool = True) -> list[str]:
    """``head + items joined by sep + tail``, greedily filled: a line takes items while it stays within
    ``width`` (tabs counted as 4); continuation lines start with ``indent``. With ``trail`` a line
    ends with the separator ("a, b,"), else the next line's indent carries it ("| c")."""
    if not items:
        return [head + tail]
    join = " " if trail else sep
    lines, cur, on_line = [], head, 0
    for i, it in enumerate(items):
        last = i == len(items) - 1
        piece = it + (tail if last else sep.rstrip() if trail else "")
        cand = cur + (join if on_line else "") + piece
        if on_line and len(cand.expandtabs(4)) > width:
            lines.append(cur)
            cur, on_line = indent + piece, 1
        else:
            cur, on_line = cand, on_line + 1
    lines.append(cur)
    return lines


def comment_block(text: str, lead: str = "/* ", indent: str = "") -> list[str]:
    """A C comment of the given lines: '/* a\\n * b */'."""
    rows = text.split("\n")
    out = [indent + lead + rows[0]] + [indent + " * " + r for r in rows[1:]]
    out[-1] += " */"
    return out


def align_comments(rows: list[tuple[str, str]], gap: int = 1, runs: bool = False) -> list[str]:
    """(code, comment) rows with the comments in one column: of all commented rows, or (runs) of each
    run of consecutive commented rows."""
    groups: list[list[int]] = [[]]
    for i, (_, m) in enumerate(rows):
        if m:
            groups[-1].append(i)
        elif runs and groups[-1]:
            groups.append([])
    width = {i: max(len(rows[j][0]) for j in g) for g in groups for i in g}
    return [f"{c}{' ' * (width[i] - len(c) + gap)}{m}" if m else c for i, (c, m) in enumerate(rows)]


BEGIN = "BEGIN GENERATED"
END = "END GENERATED"


def replace_block(text: str, name: str, body: str, comment: str, where: str) -> str:
    """Replaces the lines between '<comment> BEGIN GENERATED: name ...' and '<comment> END GENERATED: name'."""
    pat = re.compile(rf"(^[ \t]*{re.escape(comment)} {BEGIN}: {re.escape(name)}\b[^\n]*\n)(.*?)"
                     rf"(^[ \t]*{re.escape(comment)} {END}: {re.escape(name)}\b)", re.S | re.M)
    m = pat.search(text)
    if not m:
        raise SystemExit(f"{where}: no block '{comment} {BEGIN}: {name}' ... '{comment} {END}: {name}'")
    return text[:m.start(2)] + body + text[m.end(2):]


def fmt_float(v: float) -> str:
    """Shortest repr that reads back as the same double: 1e-06 -> '1e-6', 7.0 -> '7.0'."""
    s = repr(float(v))
    m = re.fullmatch(r"(-?[\d.]+)e([+-])0*(\d+)", s)
    if m:
        s = f"{m.group(1)}e{'-' if m.group(2) == '-' else ''}{m.group(3)}"
    return s
