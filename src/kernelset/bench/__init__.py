"""The benchmark harness (``ksctl bench``): byte/FLOP models from the registry, CUDA-event timing,
ceilings measured in the same run, peers side by side, correctness before speed."""
