"""The README states what the registry declares: its catalog is generated (``ksctl list --markdown``) and
must equal the registry's; each declared signature names the public function's parameters; every op
family folder has its README."""
from __future__ import annotations

import inspect
import os
import re

import kernelset as ks
from kernelset.core import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- catalog:begin", "<!-- catalog:end -->"


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_catalog_is_the_registry():
    text = _readme()
    assert BEGIN in text and END in text, "README.md lost its catalog markers"
    body = text.split(BEGIN, 1)[1].split("\n", 1)[1].split(END, 1)[0]
    assert body == registry.catalog_markdown(), (
        "README.md's catalog differs from the registry: regenerate it with `ksctl list --markdown`")


def _declared_params(signature: str) -> list[str]:
    inner = signature[signature.index("(") + 1:]
    depth, part, parts = 0, "", []
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += ch
    parts.append(part)
    return [p.split("=")[0].strip() for p in parts if p.strip()]


def _public(name: str):
    return getattr(ks, name, None) or getattr(ks.optim, name, None)


def test_declared_signatures_match_the_public_functions():
    wrong = []
    for e in ks.catalog():
        name = e.spec.signature.split("(")[0]
        fn = _public(name)
        assert fn is not None, f"{e.name}: declared signature names {name}, which kernelset does not export"
        params, star = [], False
        for p in inspect.signature(fn).parameters.values():
            if p.name == "self":
                continue
            if p.kind is p.KEYWORD_ONLY and not star:
                params.append("*")
                star = True
            params.append(p.name)
        if _declared_params(e.spec.signature) != params:
            wrong.append(f"{e.name}: declared {_declared_params(e.spec.signature)}, public {params}")
    assert not wrong, "\n".join(wrong)


def test_every_family_folder_has_a_readme():
    families = {e.spec.family for e in ks.catalog()}
    ops = os.path.join(ROOT, "src", "kernelset", "ops")
    missing = [f for f in sorted(families) if not os.path.exists(os.path.join(ops, f, "README.md"))]
    assert not missing, f"op family folders without a README.md: {missing}"


def test_readme_names_no_undeclared_op_in_the_catalog():
    # the catalog once listed rope_cache (a host helper, not a registry op) and missed five declared ops
    body = _readme().split(BEGIN, 1)[1].split(END, 1)[0]
    named = set(re.findall(r"^\| \w+ \| `(\w+)\(", body, flags=re.M))
    declared = {e.spec.signature.split("(")[0] for e in ks.catalog()}
    assert named == declared
