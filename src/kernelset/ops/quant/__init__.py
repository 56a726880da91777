"""Quantized number formats, shared by the op families that store or read them (no ops of its own:
nothing is declared in the registry here). ``formats``: the FP8 formats and their fp32 quantize /
dequantize references."""
