"""Benchmark history as data (kernelset.bench.history): the conversion of each tool's JSON into
records, the append-only file, the rendering, and the repository's results file and README."""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re

import pytest

from kernelset.bench import history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "benchmarks", "results.jsonl")
README = os.path.join(ROOT, "docs", "benchmarks", "README.md")

ENV = {"date": "2026-11-28 03:43 UTC", "device": "NVIDIA H200", "sm": "sm_90", "sms": 132, "l2_mb": 60.0,
       "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "python": "3.12.3",
       "liger_kernel": None, "flash_attn": None, "flashinfer": None}


def _bench_doc() -> dict:
    """The shape of ``ksctl bench --json``: two cases, one of them graph-timed, a peer not installed,
    a peer that failed its check, and the host-time extra."""
    return {
        "environment": dict(ENV),
        "ceilings": {"copy_gbs": 4000.0, "matmul_tflops": 700.0},
        "summary": {},
        "extra": {"rms_norm_1x4096": {"kernelset_host_us": 12.0, "F.rms_norm_host_us": 10.0,
                                      "torch-eager_host_us": 60.0, "kernelset_graph_replay_us_per_call": 1.9,
                                      "kernelset_kernel_us": 1.8}},
        "cases": [
            {"op": "rms_norm", "shape": [32768, 4096], "mode": "fwd", "dtype": "bfloat16", "bytes": 536879104,
             "model": "read x, write y", "bar_pct": 95.0, "sweep": True, "ceiling": "copy",
             "speedup_vs_best_peer": 1.25, "best_peer": "torch.compile", "bar_met": True,
             "results": [
                 {"impl": "kernelset", "ms": 0.1, "gbs": 3900.0, "pct": 97.5, "copy_pct": 97.5, "tflops": None,
                  "correct": True, "error": 0.003, "note": ""},
                 {"impl": "torch.compile", "ms": 0.125, "gbs": 3120.0, "pct": 78.0, "copy_pct": 78.0,
                  "tflops": None, "correct": True, "error": 0.002, "note": ""},
                 {"impl": "torch-eager", "ms": None, "gbs": None, "pct": None, "copy_pct": None, "tflops": None,
                  "correct": False, "error": 0.5, "note": "y rel err 5.00e-01 > 1e-02"},
                 {"impl": "liger", "ms": None, "gbs": None, "pct": None, "copy_pct": None, "tflops": None,
                  "correct": False, "error": None, "note": "liger not importable (ModuleNotFoundError)"}]},
            {"op": "rms_norm", "shape": [32768, 4096], "mode": "fwd+bwd", "dtype": "bfloat16", "bytes": 1342201856,
             "model": "m", "bar_pct": 80.0, "sweep": False, "ceiling": "copy",
             "results": [
                 {"impl": "kernelset", "ms": 0.4, "gbs": 3355.5, "pct": 83.9, "tflops": None,
                  "correct": True, "error": 0.004, "note": "CUDA graph (10 calls per replay)"},
                 {"impl": "torch.compile", "ms": 0.5, "gbs": 2684.4, "pct": 67.1, "tflops": None,
                  "correct": True, "error": 0.004, "note": "CUDA graph (10 calls per replay)"}]},
        ],
    }


def test_bench_json_to_records_exact_fields():
    recs = history.records_from_bench_json(_bench_doc(), commit="c0ffee")
    fwd = [r for r in recs if r.case == "32768x4096 fwd bf16"]
    assert [r.impl for r in fwd] == ["kernelset", "torch.compile", "torch-eager"]  # liger never ran: left out
    ours = fwd[0]
    assert dataclasses.asdict(ours) == {
        "date": "2026-11-28 03:43 UTC", "commit": "c0ffee", "gpu": "NVIDIA H200", "sms": 132, "driver": None,
        "cuda": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0", "op": "rms_norm", "case": "32768x4096 fwd bf16",
        "impl": "kernelset", "ms": 0.1, "gbs": 3900.0, "tflops": None, "pct_of_roofline": 97.5, "roofline": "copy",
        "copy_pct": 97.5, "ratio_vs_best_peer": 1.25, "best_peer": "torch.compile", "bar_pct": 95.0, "correct": True,
        "rel_err": 0.003, "copy_gbs": 4000.0, "matmul_tflops": 700.0, "source": "ksctl bench",
        "run": "2026-11-28 03:43 UTC NVIDIA H200", "note": "", "versions": {"python": "3.12.3"}}
    assert ours.bar_met() is True
    assert fwd[1].ratio_vs_best_peer == 1.0 and fwd[1].bar_met() is False  # the best peer itself; 78% < 95%
    wrong = fwd[2]
    assert not wrong.correct and wrong.ms is None and wrong.ratio_vs_best_peer is None and "rel err" in wrong.note
    # the graph-timed case is its own case; copy_pct derived from GB/s and the run's copy ceiling
    g = next(r for r in recs if r.case == "32768x4096 fwd+bwd bf16 graph" and r.impl == "kernelset")
    assert g.copy_pct == pytest.approx(100 * 3355.5 / 4000.0) and g.ratio_vs_best_peer == pytest.approx(1.25)
    assert g.bar_met() is True
    # host time: kernelset against F.rms_norm (the faster peer) and the graph replay
    host = {r.impl: r for r in recs if r.case == "1x4096 bf16 host per eager call"}
    assert sorted(host) == ["F.rms_norm", "kernelset", "torch-eager"]
    assert host["kernelset"].ms == pytest.approx(0.012)
    assert host["kernelset"].ratio_vs_best_peer == pytest.approx(10 / 12)
    assert host["kernelset"].roofline is None and host["kernelset"].best_peer == "F.rms_norm"
    replay = next(r for r in recs if r.case == "1x4096 bf16 graph replay per call")
    assert replay.ms == pytest.approx(0.0019) and "kernel 1.80 us" in replay.note
    assert len(recs) == 3 + 2 + 3 + 1


def test_forced_backend_names_the_implementation():
    recs = history.records_from_bench_json(_bench_doc(), commit="x", backend="triton", run="r1")
    assert {r.impl for r in recs if r.op == "rms_norm" and "host" not in r.case and "replay" not in r.case} == \
        {"kernelset[triton]", "torch.compile", "torch-eager"}
    assert {r.run for r in recs} == {"r1"}


def test_hf_capi_lce_documents():
    hf = {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "transformers": "5.17.0", "layers": 32, "seq": 2048,
          "bars": {}, "prefill_ms": {"eager": 110.0, "sdpa": 64.0, "kernelset": 52.0},
          "decode_b1_ms": {"unpatched": 26.0, "kernelset": 20.0, "rounds_kernelset": [1.0]},
          "train_1b": {"unpatched": {"ms": 62.0, "peak_gib": 13.3}, "kernelset": {"ms": 42.0, "peak_gib": 10.5},
                       "kernelset_fp32_states": {"ms": 46.0}, "unpatched_foreach_adamw": {"ms": 66.0},
                       "counts": {"rms_norm": 7}}}
    assert history.kind_of(hf) == history.HF
    recs = {(r.op, r.impl): r for r in history.records_from_json(hf, date="2026-11-27", commit="c")}
    assert recs[("hf.prefill", "kernelset")].ratio_vs_best_peer == pytest.approx(64 / 52)
    assert recs[("hf.prefill", "kernelset")].best_peer == "hf-sdpa"
    assert recs[("hf.decode_step", "kernelset")].case == "llama-3-8b shape 32 layers B1 bf16"
    assert recs[("hf.train_step", "hf+adamw-fused")].ms == 62.0  # fused, since foreach is reported beside it
    assert recs[("hf.train_step", "kernelset")].ratio_vs_best_peer == pytest.approx(62 / 42)
    assert recs[("hf.train_step", "kernelset")].note == "peak 10.5 GiB"
    old = dict(hf, train_1b={"unpatched": {"ms": 80.0}, "kernelset": {"ms": 70.0}})  # before state_dtype
    impls = {r.impl for r in history.records_from_json(old, date="2026-11-22") if r.op == "hf.train_step"}
    assert impls == {"hf+adamw-foreach", "kernelset-fp32-states"}

    capi = {"smoke_rc": 0, "device": "NVIDIA H100 80GB HBM3", "results": [
        {"case_id": "rms_norm", "c_op": "ks_rms_norm", "status": "ok", "detail": "bitwise", "python_us": 100.0,
         "capi_us": 101.0, "gbytes": 0.5, "timing": "graph", "ratio": 1.01}]}
    c = {r.impl: r for r in history.records_from_json(capi, date="2026-11-28")}
    assert c["capi"].op == "rms_norm" and c["capi"].ms == pytest.approx(0.101)
    assert c["capi"].ratio_vs_best_peer == pytest.approx(100 / 101) and c["capi"].gbs == pytest.approx(0.5 / 101e-6)
    assert "bitwise" in c["capi"].note and c["capi"].correct

    lce = {"device": "NVIDIA H100 80GB HBM3", "shape": [8192, 4096, 128256], "dtype": "bf16", "rows": [
        {"impl": "kernelset chunk<=256MiB", "ms": 41.0, "extra_bytes": 1.29 * 2**30, "predicted_bytes": 1, "err": 0.003,
         "note": ""},
        {"impl": "torch.compile", "ms": 38.0, "extra_bytes": 3 * 2**30, "predicted_bytes": None, "err": 0.002,
         "note": ""},
        {"impl": "liger", "ms": None, "extra_bytes": None, "predicted_bytes": None, "err": None, "note": "absent"}]}
    recs = history.records_from_json(lce, date="2026-11-25")
    assert [r.impl for r in recs] == ["kernelset chunk<=256MiB", "torch.compile"]
    assert recs[0].case == "8192x4096x128256 fwd+bwd bf16" and recs[0].note == "extra memory 1.29 GiB"
    assert history.kind_of({"build": "x", "rows": [{"op": "a", "case": "b", "status": "ok"}]}) is None
    with pytest.raises(ValueError, match="date"):
        history.records_from_json(capi)


def test_append_only(tmp_path):
    path = tmp_path / "results.jsonl"
    recs = history.records_from_bench_json(_bench_doc(), commit="a")
    assert history.append(path, recs[:3]) == 3
    first = path.read_bytes()
    assert history.append(path, recs[3:]) == len(recs) - 3
    after = path.read_bytes()
    assert after.startswith(first)  # the earlier lines are never rewritten
    lines = after.decode().splitlines()
    assert len(lines) == len(recs)
    for line, rec in zip(lines, recs):
        d = json.loads(line)
        assert list(d) == sorted(d)  # sorted keys, one record per line
        assert history.from_dict(d) == rec
    assert history.load(path) == recs
    assert history.append(path, []) == 0 and path.read_bytes() == after
    # a file whose last line lost its newline (an edit by hand) still gets one record per line
    path.write_bytes(after.rstrip(b"\n"))
    history.append(path, recs[:1])
    assert history.load(path) == recs + recs[:1]


def test_load_names_the_bad_line(tmp_path):
    path = tmp_path / "r.jsonl"
    rec = history.records_from_bench_json(_bench_doc(), commit="a")[0]
    d = dataclasses.asdict(rec)
    del d["gpu"]
    path.write_text(rec.to_json() + "\n" + json.dumps(d) + "\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:2: .*gpu"):
        history.load(path)


def test_latest_record_supersedes_and_render_is_deterministic():
    old = history.records_from_bench_json(_bench_doc(), commit="aaaaaaa1")
    doc = _bench_doc()
    doc["environment"]["date"] = "2026-11-29 10:00 UTC"
    doc["cases"][0]["results"][0]["ms"] = 0.11
    new = history.records_from_bench_json(doc, commit="bbbbbbb2")
    text = history.render_markdown(old + new)
    assert text == history.render_markdown(old + new)
    assert "0.110 ms" in text and "bbbbbbb" in text and "0.100 ms" not in text
    # the newer date wins whatever the order of the lines
    shuffled = old + new
    random.Random(0).shuffle(shuffled)
    assert history.render_markdown(shuffled) == text
    assert "bar 95% met" in text and "1x4096 bf16 host per eager call" in text
    # a record's ratio and bar come from its own run
    cur = history.latest(old + new)
    r = cur[("ksctl bench", "NVIDIA H200", "rms_norm", "32768x4096 fwd bf16", "kernelset")]
    assert r.commit == "bbbbbbb2" and r.ratio_vs_best_peer == pytest.approx(0.125 / 0.11, rel=1e-5)


def test_readme_block_round_trip():
    text = f"a\n{history.BEGIN}\nold\n{history.END}\nb\n"
    new = history.replace_block(text, "new\n")
    assert new == f"a\n{history.BEGIN}\nnew\n{history.END}\nb\n" and history.block_of(new) == "new\n"
    with pytest.raises(ValueError):
        history.replace_block("no markers", "x")


def test_cli_import_and_render_check(tmp_path, capsys):
    run = tmp_path / "bench.json"
    run.write_text(json.dumps(_bench_doc()))
    results, readme = tmp_path / "results.jsonl", tmp_path / "README.md"
    assert history.main(["import", str(run), "--results", str(results), "--commit", "c1"]) == 0
    assert {r.commit for r in history.load(results)} == {"c1"}
    readme.write_text(f"# x\n{history.BEGIN}\n{history.END}\n")
    assert history.main(["render", "--results", str(results), "--readme", str(readme), "--check"]) == 1
    assert history.main(["render", "--results", str(results), "--readme", str(readme)]) == 0
    assert history.main(["render", "--results", str(results), "--readme", str(readme), "--check"]) == 0
    assert history.block_of(readme.read_text()) == history.render_markdown(history.load(results))


# ---- the repository's results file and README ----------------------------------------------------


def test_results_file_parses_with_every_field():
    assert os.path.exists(RESULTS)
    with open(RESULTS, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    assert lines
    for n, line in enumerate(lines, 1):
        d = json.loads(line)
        assert set(d) == set(history.FIELDS), f"line {n}: {sorted(set(history.FIELDS) ^ set(d))}"
    recs = history.load(RESULTS)
    for r in recs:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2} UTC)?", r.date), r
        assert r.gpu and r.op and r.case and r.impl and r.run and r.source, r
        assert r.commit and re.fullmatch(r"[0-9a-f]{7,40}", r.commit), r
        assert r.roofline in ("copy", "matmul", None), r
        assert isinstance(r.correct, bool), r
        assert r.ms is None or r.ms > 0, r
        assert r.ms is not None or not r.correct, r  # a time for every correct result
        if r.source == history.BENCH and r.roofline:
            assert r.copy_gbs and r.matmul_tflops and r.torch and r.triton, r


def test_readme_tables_equal_the_rendering_of_the_results_file():
    with open(README, encoding="utf-8") as f:
        text = f.read()
    assert history.block_of(text) == history.render_markdown(history.load(RESULTS)), (
        "docs/benchmarks/README.md is stale: python -m kernelset.bench.history render --readme "
        "docs/benchmarks/README.md")


def test_docs_hold_no_raw_logs():
    for dirpath, _, files in os.walk(os.path.join(ROOT, "docs")):
        for name in files:
            assert not name.endswith((".log", ".err", ".txt", ".csv", ".png")), os.path.join(dirpath, name)
