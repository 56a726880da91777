"""The C ABI's declaration (ops.py) and the generators of its per-op surface (see capi/abi/generate.py).

Standard library only: a C user regenerates without torch. Imported as the package ``ksabi`` with
capi/abi on sys.path (a distinct name: capi/aot puts its own ``ops`` and ``emit`` on sys.path)."""
