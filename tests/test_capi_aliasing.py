"""The C ABI (libkernelset.so) against outputs that share memory with inputs, on CPU.

Found by fuzzing: an output that shares bytes with index data (a dtype-reinterpreting view, a legal
DLTensor) let the CPU paths check the indices, overwrite them while writing the output, then read
them again -> reads and writes outside the tensors (SIGSEGV). Also: a block-id check skipped by
integer overflow (a huge block_size), self-overlapping caches written in place by copy_blocks,
norms whose out overlaps x in another layout, an empty cos_sin_cache, k given as q, and k_cache
given as v_cache. The library now refuses each with a status and a message naming both arguments.
Then outputs over float inputs (attention out over q or the caches, embedding out over weight,
activation / softmax / loss outputs over their inputs in another layout, merge out over out_a ...):
accepted with silently wrong results, now refused too; true in place stays allowed where every path
reads before it writes (norms, gelu, swiglu, softmax, out = q in attention, merge, mla_decode).

Every refused call runs in a forked subprocess, so a regression that crashes fails its test instead
of killing pytest. The legitimate cases next to them (true in-place norms, slices of one fused buffer
that do not meet, outputs and index data side by side in one allocation) still run and match.
"""
from __future__ import annotations

import multiprocessing
import shutil
import textwrap

import pytest
import torch

from kernelset import capi


if not shutil.which("gcc"):
    pytest.skip("no gcc to build the C library", allow_module_level=True)


@pytest.fixture(scope="session", autouse=True)
def built(capi_library):
    """The library, built when missing or stale (tests/conftest.py)."""
    capi.load()


def _run(body: str) -> tuple[str, str]:
    """Runs body (statements using torch and capi) in a forked child of this process (torch and the
    library already loaded: milliseconds, where a fresh interpreter takes seconds to import
    kernelset); returns (status name, message) of the KsError it raised, or ("NOERROR", ""). A
    crash (a signal) or a hang fails the test, not the session."""
    code = compile(textwrap.dedent(body).strip(), "<case>", "exec")
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        try:
            exec(code, {"torch": torch, "capi": capi})
        except capi.KsError as e:
            send.send((e.status_name, e.message))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            send.send(("EXCEPTION", f"{type(e).__name__}: {e}"))
        else:
            send.send(("NOERROR", ""))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    send.close()
    proc.join(120)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("the call hung (killed after 120 s)")
    assert proc.exitcode == 0, f"the call crashed (exit status {proc.exitcode})"
    return recv.recv()


INV, LAY = "KS_ERR_INVALID_ARGUMENT", "KS_ERR_UNSUPPORTED_LAYOUT"

# id -> (statements, expected status, texts the message contains)
REFUSED = {
    # Problem A: an output over index data
    "embedding_out_over_ids": ("""
        out = torch.zeros(2, 4)
        ids = out.view(torch.int32).view(-1)[0:2]
        ids.copy_(torch.tensor([0, 1], dtype=torch.int32))
        capi.embedding(ids, torch.ones(3, 4), out=out)
        """, INV, ["out: overlaps ids", "index data"]),
    "reshape_and_cache_cache_over_slots": ("""
        kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
        s = kc.view(torch.int32).view(-1)[0:2]
        s.copy_(torch.tensor([0, 1], dtype=torch.int32))
        capi.reshape_and_cache(torch.full((2, 1, 8), 3e9), torch.zeros(2, 1, 8), kc, vc, s)
        """, INV, ["k_cache: overlaps slot_mapping"]),
    "reshape_and_cache_v_cache_over_slots": ("""
        kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
        s = vc.view(torch.int32).view(-1)[0:2]
        s.copy_(torch.tensor([0, 1], dtype=torch.int32))
        capi.reshape_and_cache(torch.zeros(2, 1, 8), torch.full((2, 1, 8), 3e9), kc, vc, s)
        """, INV, ["v_cache: overlaps slot_mapping"]),
    "copy_blocks_cache_over_mapping": ("""
        kc, vc = torch.zeros(4, 2, 1, 8), torch.zeros(4, 2, 1, 8)
        kc[1] = 1e30
        bm = kc.view(torch.int64).view(-1)[0:4].view(2, 2)
        bm.copy_(torch.tensor([[1, 0], [2, 3]]))
        capi.copy_blocks([kc], [vc], bm)
        """, INV, ["k_caches[0]: overlaps block_mapping"]),
    "paged_attention_lse_over_seq_lens": ("""
        q, kc = torch.randn(2, 1, 8), torch.randn(4, 4, 1, 8)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        buf = torch.zeros(4)
        sl = buf.view(torch.int32)[0:2]
        sl.copy_(torch.tensor([5, 6], dtype=torch.int32))
        capi.paged_attention(q, kc, kc, bt, sl, lse=buf[1:3].view(2, 1))
        """, INV, ["lse: overlaps seq_lens"]),
    "paged_attention_out_over_block_table": ("""
        q, kc = torch.randn(2, 1, 8), torch.randn(4, 4, 1, 8)
        out = torch.zeros(2, 1, 8)
        bt = out.view(torch.int32).view(-1)[0:4].view(2, 2)
        bt.copy_(torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
        capi.paged_attention(q, kc, kc, bt, torch.tensor([5, 6], dtype=torch.int32), out=out)
        """, INV, ["out: overlaps block_table"]),
    "paged_attention_out_over_cu_seqlens_q": ("""
        q, kc = torch.randn(4, 1, 8), torch.randn(4, 4, 1, 8)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        out = torch.zeros(4, 1, 8)
        cu = out.view(torch.int32).view(-1)[0:3]
        cu.copy_(torch.tensor([0, 2, 4], dtype=torch.int32))
        capi.paged_attention(q, kc, kc, bt, torch.tensor([5, 6], dtype=torch.int32), cu, 2, out=out)
        """, INV, ["out: overlaps cu_seqlens_q"]),
    "mla_decode_lse_over_seq_lens": ("""
        qn, qp, kv = torch.randn(2, 1, 4), torch.randn(2, 1, 2), torch.randn(4, 4, 6)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        buf = torch.zeros(4)
        sl = buf.view(torch.int32)[0:2]
        sl.copy_(torch.tensor([5, 6], dtype=torch.int32))
        capi.mla_decode(qn, qp, kv, bt, sl, lse=buf[1:3].view(2, 1), scale=.5, kv_lora_rank=4, rope_dim=2)
        """, INV, ["lse: overlaps seq_lens"]),
    "mla_decode_out_over_block_table": ("""
        qn, qp, kv = torch.randn(2, 1, 4), torch.randn(2, 1, 2), torch.randn(4, 4, 6)
        out = torch.zeros(2, 1, 4)
        bt = out.view(torch.int32).view(-1)[0:4].view(2, 2)
        bt.copy_(torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
        capi.mla_decode(qn, qp, kv, bt, torch.tensor([5, 6], dtype=torch.int32), out=out, scale=.5,
                        kv_lora_rank=4, rope_dim=2)
        """, INV, ["out: overlaps block_table"]),
    "flash_varlen_lse_over_cu_seqlens_k": ("""
        q, k, v = torch.ones(4, 1, 4), -3 * torch.ones(4, 1, 4), torch.randn(4, 1, 4)
        lse = torch.zeros(1, 4)
        cuk = lse.view(torch.int32).view(-1)[0:3]
        cuk.copy_(torch.tensor([0, 2, 4], dtype=torch.int32))
        capi.flash_attention_varlen(q, k, v, torch.tensor([0, 2, 4], dtype=torch.int32), cuk, 2, 2, lse=lse)
        """, INV, ["lse: overlaps cu_seqlens_k"]),
    "flash_varlen_out_over_cu_seqlens_q": ("""
        q, k, v = torch.randn(4, 1, 4), torch.randn(4, 1, 4), torch.randn(4, 1, 4)
        out = torch.zeros(4, 1, 4)
        cuq = out.view(torch.int32).view(-1)[0:3]
        cuq.copy_(torch.tensor([0, 2, 4], dtype=torch.int32))
        capi.flash_attention_varlen(q, k, v, cuq, torch.tensor([0, 2, 4], dtype=torch.int32), 2, 2, out=out)
        """, INV, ["out: overlaps cu_seqlens_q"]),
    # Problem B: (L + bs - 1) / bs overflowed for a huge block_size, skipping the block-id check
    "paged_attention_huge_block_size": ("""
        kc = torch.as_strided(torch.randn(8), (1, 2**63 - 1, 1, 1), (1000, 0, 1, 1))
        capi.paged_attention(torch.randn(1, 1, 1), kc, kc, torch.tensor([[123456789]], dtype=torch.int32),
                             torch.tensor([2], dtype=torch.int32))
        """, INV, ["block_table: expected block ids in [0, 1)", "123456789"]),
    # Problem C: copy_blocks writes its caches in place: no self-overlapping (expanded) cache
    "copy_blocks_expanded_k_cache": ("""
        kc = torch.zeros(1, 4, 1, 8).expand(4, 4, 1, 8)
        capi.copy_blocks([kc], [torch.zeros(4, 4, 1, 8)], torch.tensor([[0, 1]]))
        """, LAY, ["k_caches[0]: elements overlap"]),
    "copy_blocks_expanded_v_cache": ("""
        vc = torch.zeros(1, 4, 1, 8).expand(4, 4, 1, 8)
        capi.copy_blocks([torch.zeros(4, 4, 1, 8)], [vc], torch.tensor([[0, 1]]))
        """, LAY, ["v_caches[0]: elements overlap"]),
    # norms: only true in-place aliasing of out and x
    "rms_norm_out_transposed_x": ("""
        x = torch.randn(4, 4)
        capi.rms_norm(x, None, out=x.t())
        """, INV, ["out: overlaps x"]),
    "layer_norm_out_shifted_x": ("""
        buf = torch.randn(5, 4)
        capi.layer_norm(buf[0:4], out=buf[1:5])
        """, INV, ["out: overlaps x"]),
    "rms_norm_out_over_weight": ("""
        buf = torch.randn(5, 4)
        capi.rms_norm(torch.randn(4, 4), buf[4], out=buf[1:5])
        """, INV, ["out: overlaps weight"]),
    "fused_add_rms_norm_out_one_row_over_residual": ("""
        buf = torch.randn(5, 4)
        capi.fused_add_rms_norm(torch.randn(4, 4), buf[0:4], None, out=buf[1:5])
        """, INV, ["out: must not alias residual"]),
    "fused_add_rms_norm_residual_over_x": ("""
        buf = torch.randn(5, 4)
        capi.fused_add_rms_norm(buf[0:4], buf[1:5], None, out=torch.empty(4, 4))
        """, INV, ["residual: must not alias x"]),
    # rope
    "rope_empty_cos_sin_cache": ("""
        capi.rotary_embedding(torch.zeros(3, dtype=torch.long), torch.randn(3, 2, 8), None, torch.randn(0, 8))
        """, INV, ["cos_sin_cache:", "max_pos >= 1"]),
    "rope_k_is_q": ("""
        q = torch.randn(3, 2, 8)
        capi.rotary_embedding(torch.zeros(3, dtype=torch.long), q, q, torch.randn(4, 8))
        """, INV, ["k: overlaps q", "different tensor from q"]),
    "rope_k_overlaps_q": ("""
        buf = torch.randn(3, 3, 8)
        capi.rotary_embedding(torch.zeros(3, dtype=torch.long), buf[:, 0:2], buf[:, 1:3], torch.randn(4, 8))
        """, INV, ["k: overlaps q"]),
    "rope_q_over_positions": ("""
        q = torch.zeros(3, 2, 8)
        pos = q.view(torch.int32).view(-1)[0:3]
        capi.rotary_embedding(pos, q, None, torch.randn(4, 8))
        """, INV, ["q: overlaps positions"]),
    "mrope_k_is_q": ("""
        q = torch.randn(3, 2, 8)
        capi.mrope(torch.zeros(3, dtype=torch.long), q, q, torch.randn(4, 8), mrope_section=(2, 1, 1))
        """, INV, ["k: overlaps q"]),
    # kv cache
    "reshape_and_cache_k_cache_is_v_cache": ("""
        kc = torch.zeros(2, 4, 1, 8)
        capi.reshape_and_cache(torch.zeros(2, 1, 8), torch.zeros(2, 1, 8), kc, kc, torch.tensor([0, 1]))
        """, INV, ["v_cache: overlaps k_cache", "different tensor from k_cache"]),
}

# Problem D: outputs over float inputs (found by fuzzing: accepted, silently wrong results). Only true
# in-place aliasing stays allowed where both paths read before they write (test_in_place_* below);
# another view of an input's memory (transposed, shifted by a row, a dtype-reinterpreting view) is
# refused with both names.
REFUSED_FLOAT = {
    # activations
    "silu_and_mul_out_over_gate_half": ("""
        x = torch.randn(4, 16)
        capi.silu_and_mul(x, out=x[:, :8])
        """, INV, ["out: overlaps x"]),
    "gelu_and_mul_out_shifted_x": ("""
        x = torch.randn(4, 16)
        capi.gelu_and_mul(x, out=x.view(-1)[8:40].view(4, 8))
        """, INV, ["out: overlaps x"]),
    "swiglu_oai_out_over_x": ("""
        x = torch.randn(4, 16)
        capi.swiglu_oai(x, out=x[:, 8:])
        """, INV, ["out: overlaps x"]),
    "gelu_out_transposed_x": ("""
        x = torch.randn(4, 4)
        capi.gelu(x, out=x.t())
        """, INV, ["out: overlaps x", "x itself, in place"]),
    "swiglu_out_shifted_up": ("""
        buf = torch.randn(5, 8)
        capi.swiglu(torch.randn(4, 8), buf[0:4], out=buf[1:5])
        """, INV, ["out: overlaps up"]),
    # softmax and cross_entropy
    "softmax_out_transposed_x": ("""
        x = torch.randn(4, 4)
        capi.softmax(x, out=x.t())
        """, INV, ["out: overlaps x", "x itself, in place"]),
    "log_softmax_out_reinterprets_x": ("""
        x = torch.randn(4, 8)
        capi.log_softmax(x, out=x.view(torch.bfloat16)[:, :8])
        """, INV, ["out: overlaps x"]),
    "cross_entropy_loss_over_logits": ("""
        logits = torch.randn(4, 8)
        capi.cross_entropy(logits, torch.tensor([0, 1, 2, 3]), reduction="none", out=logits[:, 1])
        """, INV, ["loss: overlaps logits"]),
    "cross_entropy_loss_over_target": ("""
        t = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
        capi.cross_entropy(torch.randn(4, 8), t, reduction="none", out=t.view(torch.float32))
        """, INV, ["loss: overlaps target"]),
    # embedding
    "embedding_out_over_weight": ("""
        w = torch.randn(4, 4)
        capi.embedding(torch.tensor([0, 1]), w, out=w[1:3])
        """, INV, ["out: overlaps weight"]),
    # rope (refused since 66ab9ea: q and k against every input they are rotated with)
    "qk_norm_rope_q_over_q_weight": ("""
        q = torch.randn(3, 2, 8)
        capi.qk_norm_rope(q, None, q[0, 0], None, torch.randn(4, 8), torch.zeros(3, dtype=torch.long))
        """, INV, ["q: overlaps q_weight"]),
    # kv cache
    "reshape_and_cache_k_cache_over_key": ("""
        kc, vc = torch.randn(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
        capi.reshape_and_cache(kc[1, 1:3], torch.zeros(2, 1, 8), kc, vc, torch.tensor([4, 5]))
        """, INV, ["k_cache: overlaps key"]),
    "reshape_and_cache_v_cache_over_v_scale": ("""
        kc, vc = torch.zeros(2, 4, 1, 8, dtype=torch.float8_e4m3fn), torch.zeros(2, 4, 1, 8, dtype=torch.float8_e4m3fn)
        vs = vc.view(torch.float32).view(-1)[0:1]
        vs.fill_(1.0)
        capi.reshape_and_cache(torch.randn(2, 1, 8), torch.randn(2, 1, 8), kc, vc, torch.tensor([1, 2]),
                               torch.ones(1), vs)
        """, INV, ["v_cache: overlaps v_scale"]),
    "copy_blocks_v_cache_shifted_over_k_cache": ("""
        buf = torch.randn(5, 2, 1, 8)
        capi.copy_blocks([buf[0:4]], [buf[1:5]], torch.tensor([[1, 2]]))
        """, INV, ["v_caches[0]: overlaps k_caches[0]"]),
    "copy_blocks_layers_overlap": ("""
        buf = torch.randn(5, 2, 1, 8)
        capi.copy_blocks([buf[0:4], buf[1:5]], [torch.randn(4, 2, 1, 8), torch.randn(4, 2, 1, 8)],
                         torch.tensor([[1, 2]]))
        """, INV, ["k_caches[1]: overlaps k_caches[0]"]),
    # paged attention
    "paged_attention_out_over_k_cache": ("""
        q, kc = torch.randn(2, 1, 8), torch.randn(4, 4, 1, 8)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        capi.paged_attention(q, kc, torch.randn(4, 4, 1, 8), bt, torch.tensor([5, 6], dtype=torch.int32),
                             out=kc[0, 0:2])
        """, INV, ["out: overlaps k_cache"]),
    "paged_attention_out_shifted_q": ("""
        buf, kc = torch.randn(3, 1, 8), torch.randn(4, 4, 1, 8)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        capi.paged_attention(buf[0:2], kc, kc, bt, torch.tensor([5, 6], dtype=torch.int32), out=buf[1:3])
        """, INV, ["out: overlaps q", "q itself, in place"]),
    "paged_attention_lse_over_q": ("""
        q, kc = torch.randn(2, 1, 8), torch.randn(4, 4, 1, 8)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        capi.paged_attention(q, kc, kc, bt, torch.tensor([5, 6], dtype=torch.int32), lse=q.view(-1)[0:2].view(2, 1))
        """, INV, ["lse: overlaps q"]),
    # flash attention
    "flash_attention_out_transposed_q": ("""
        q, k, v = torch.randn(1, 4, 4, 4), torch.randn(1, 4, 4, 4), torch.randn(1, 4, 4, 4)
        capi.flash_attention(q, k, v, out=q.transpose(1, 2))
        """, INV, ["out: overlaps q", "q itself, in place"]),
    "flash_attention_out_is_v": ("""
        q, k, v = torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4)
        capi.flash_attention(q, k, v, out=v)
        """, INV, ["out: overlaps v"]),
    "flash_attention_lse_over_k": ("""
        q, k, v = torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4)
        capi.flash_attention(q, k, v, lse=k.view(-1)[4:8].view(1, 1, 4))
        """, INV, ["lse: overlaps k"]),
    # varlen
    "flash_varlen_out_over_k": ("""
        q, k, v = torch.randn(4, 1, 4), torch.randn(4, 1, 4), torch.randn(4, 1, 4)
        cu = torch.tensor([0, 2, 4], dtype=torch.int32)
        capi.flash_attention_varlen(q, k, v, cu, cu, 2, 2, out=k)
        """, INV, ["out: overlaps k"]),
    "flash_varlen_out_shifted_q": ("""
        buf, k, v = torch.randn(5, 1, 4), torch.randn(4, 1, 4), torch.randn(4, 1, 4)
        cu = torch.tensor([0, 2, 4], dtype=torch.int32)
        capi.flash_attention_varlen(buf[0:4], k, v, cu, cu, 2, 2, out=buf[1:5])
        """, INV, ["out: overlaps q"]),
    # merge_attn_states
    "merge_out_shifted_out_a": ("""
        buf, ob = torch.randn(5, 1, 4), torch.randn(4, 1, 4)
        capi.merge_attn_states(buf[0:4], torch.randn(4, 1), ob, torch.randn(4, 1), out=buf[1:5])
        """, INV, ["out: overlaps out_a", "out_a or out_b itself"]),
    "merge_out_over_out_b_transposed": ("""
        oa, ob = torch.randn(4, 4, 4), torch.randn(4, 4, 4)
        capi.merge_attn_states(oa, torch.randn(4, 4), ob, torch.randn(4, 4), out=ob.transpose(0, 1))
        """, INV, ["out: overlaps out_b"]),
    "merge_lse_over_lse_b_transposed": ("""
        lb = torch.randn(4, 4)
        capi.merge_attn_states(torch.randn(4, 4, 2), torch.randn(4, 4), torch.randn(4, 4, 2), lb, lse=lb.t())
        """, INV, ["lse: overlaps lse_b"]),
    "merge_lse_over_out_a": ("""
        oa = torch.randn(4, 1, 4)
        capi.merge_attn_states(oa, torch.randn(4, 1), torch.randn(4, 1, 4), torch.randn(4, 1),
                               lse=oa.view(-1)[0:4].view(4, 1))
        """, INV, ["lse: overlaps out_a"]),
    # mla_decode
    "mla_decode_out_shifted_q_nope": ("""
        buf, qp, kv = torch.randn(3, 1, 4), torch.randn(2, 1, 2), torch.randn(4, 4, 6)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        capi.mla_decode(buf[0:2], qp, kv, bt, torch.tensor([5, 6], dtype=torch.int32), out=buf[1:3], scale=.5,
                        kv_lora_rank=4, rope_dim=2)
        """, INV, ["out: overlaps q_nope", "q_nope itself, in place"]),
    "mla_decode_out_over_kv_cache": ("""
        qn, qp, kv = torch.randn(2, 1, 4), torch.randn(2, 1, 2), torch.randn(4, 4, 6)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        capi.mla_decode(qn, qp, kv, bt, torch.tensor([5, 6], dtype=torch.int32), out=kv[1, 0:2, None, 0:4],
                        scale=.5, kv_lora_rank=4, rope_dim=2)
        """, INV, ["out: overlaps kv_cache"]),
    "mla_decode_lse_over_q_pe": ("""
        qn, qp, kv = torch.randn(2, 1, 4), torch.randn(2, 1, 2), torch.randn(4, 4, 6)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        capi.mla_decode(qn, qp, kv, bt, torch.tensor([5, 6], dtype=torch.int32), lse=qp[:, :, 0], scale=.5,
                        kv_lora_rank=4, rope_dim=2)
        """, INV, ["lse: overlaps q_pe"]),
}
REFUSED.update(REFUSED_FLOAT)


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused(case):
    body, status, texts = REFUSED[case]
    got, message = _run(body)
    assert got == status, f"{got}: {message}"
    for text in texts:
        assert text in message, message


# ---- ks_query_support runs the same checks (its tensors here carry real data pointers)


def _overlap_query_cases():
    out = torch.zeros(2, 4)
    ids = out.view(torch.int32).view(-1)[0:2]
    yield "embedding", [ids, torch.ones(3, 4), out], None, "out: overlaps ids"
    kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    yield "reshape_and_cache", [torch.zeros(2, 1, 8), torch.zeros(2, 1, 8), kc, vc,
                                kc.view(torch.int32).view(-1)[0:2], None, None], None, "k_cache: overlaps slot_mapping"
    yield "reshape_and_cache", [torch.zeros(2, 1, 8), torch.zeros(2, 1, 8), kc, kc, torch.tensor([0, 1]), None, None], \
        None, "v_cache: overlaps k_cache"
    bm = kc.view(torch.int64).view(-1)[0:4].view(2, 2)
    yield "copy_blocks", [kc, vc, bm], None, "k_caches[0]: overlaps block_mapping"
    buf = torch.zeros(4)
    q, kc4 = torch.randn(2, 1, 8), torch.randn(4, 4, 1, 8)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    yield "paged_attention", [q, kc4, kc4, bt, buf.view(torch.int32)[0:2], None, None, None, None,
                              torch.empty(2, 1, 8), buf[1:3].view(2, 1), None], \
        capi.options("paged_attention"), "lse: overlaps seq_lens"
    lse = torch.zeros(1, 4)
    yield "flash_attention_varlen", [torch.randn(4, 1, 4), torch.randn(4, 1, 4), torch.randn(4, 1, 4),
                                     torch.tensor([0, 2, 4], dtype=torch.int32), lse.view(torch.int32).view(-1)[0:3],
                                     None, torch.empty(4, 1, 4), lse], \
        capi.options("flash_attention_varlen"), "lse: overlaps cu_seqlens_k"
    x = torch.randn(4, 4)
    yield "rms_norm", [x, None, x.t()], capi.options("rms_norm"), "out: overlaps x"
    q = torch.randn(3, 2, 8)
    yield "rotary_embedding", [torch.zeros(3, dtype=torch.long), q, q, torch.randn(4, 8)], \
        capi.options("rotary_embedding"), "k: overlaps q"


def _float_query_cases():
    x = torch.randn(4, 4)
    yield "gelu", [x, x.t()], capi.options("gelu"), "out: overlaps x"
    x = torch.randn(4, 16)
    yield "silu_and_mul", [x, x[:, :8]], None, "out: overlaps x"
    x = torch.randn(4, 8)
    yield "softmax", [x, x.view(torch.bfloat16)[:, :8]], capi.options("softmax"), "out: overlaps x"
    logits = torch.randn(4, 8)
    yield "cross_entropy", [logits, torch.tensor([0, 1, 2, 3]), logits[:, 1]], \
        capi.options("cross_entropy", reduction="none"), "loss: overlaps logits"
    w = torch.randn(4, 4)
    yield "embedding", [torch.tensor([0, 1]), w, w[1:3]], None, "out: overlaps weight"
    buf = torch.randn(5, 2, 1, 8)
    yield "copy_blocks", [buf[0:4], buf[1:5], torch.tensor([[1, 2]])], None, "v_caches[0]: overlaps k_caches[0]"
    kc = torch.randn(4, 4, 1, 8)
    yield "paged_attention", [torch.randn(2, 1, 8), kc, kc, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                              torch.tensor([5, 6], dtype=torch.int32), None, None, None, None, kc[0, 0:2], None,
                              None], capi.options("paged_attention"), "out: overlaps k_cache"
    q = torch.randn(1, 4, 4, 4)
    yield "flash_attention", [q, torch.randn(1, 4, 4, 4), torch.randn(1, 4, 4, 4), None, q.transpose(1, 2), None], \
        capi.options("flash_attention"), "out: overlaps q"
    buf = torch.randn(5, 1, 4)
    yield "merge_attn_states", [buf[0:4], torch.randn(4, 1), torch.randn(4, 1, 4), torch.randn(4, 1), buf[1:5],
                                None], None, "out: overlaps out_a"
    qp, bt = torch.randn(2, 1, 2), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    yield "mla_decode", [torch.randn(2, 1, 4), qp, torch.randn(4, 4, 6), bt, torch.tensor([5, 6], dtype=torch.int32),
                         None, torch.empty(2, 1, 4), qp[:, :, 0]], \
        capi.options("mla_decode", scale=0.5, kv_lora_rank=4, rope_dim=2), "lse: overlaps q_pe"


@pytest.mark.parametrize("cases", [_overlap_query_cases, _float_query_cases], ids=["index-data", "float-inputs"])
def test_query_support_agrees(cases):
    # every case of the generator (none left out when one is added), each reported by its op
    seen = 0
    for op, tensors, options, text in cases():
        s = capi.query_support(op, tensors, options)
        assert s.name == "KS_ERR_INVALID_ARGUMENT" and text in s.message, (op, s)
        seen += 1
    assert seen >= 8


def test_query_support_float_inputs_on_cuda_descriptors():
    """Outputs over float inputs are refused for CUDA descriptors too, after the CUDA layout checks and
    before any plan (no driver needed)."""
    from capi_helpers import on_cuda
    buf = torch.randn(5, 8)
    s = capi.query_support("softmax", [on_cuda(buf[0:4]), on_cuda(buf[1:5])], capi.options("softmax"))
    assert s.name == "KS_ERR_INVALID_ARGUMENT" and "out: overlaps x" in s.message, s
    q, k, v = torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4)
    s = capi.query_support("flash_attention", [on_cuda(q), on_cuda(k), on_cuda(v), None, on_cuda(v), None],
                           capi.options("flash_attention"))
    assert s.name == "KS_ERR_INVALID_ARGUMENT" and "out: overlaps v" in s.message, s
    # a dry run without data compares nothing (the query of metadata only)
    x = capi.to_dltensor(torch.randn(4, 4))
    x.data = None
    s = capi.query_support("gelu", [x, x], capi.options("gelu"))
    assert s.name == "KS_OK", s


def test_query_support_on_cuda_descriptors():
    """The overlap checks are host-side pointer arithmetic, also for CUDA tensors: the query of a
    CUDA call refuses them before any plan (no driver needed)."""
    from capi_helpers import on_cuda
    out = torch.zeros(2, 4)
    ids = out.view(torch.int32).view(-1)[0:2]
    s = capi.query_support("embedding", [on_cuda(ids), on_cuda(torch.ones(3, 4)), on_cuda(out)])
    assert s.name == "KS_ERR_INVALID_ARGUMENT" and "out: overlaps ids" in s.message, s
    q = torch.randn(3, 2, 8)
    s = capi.query_support("rotary_embedding", [on_cuda(torch.zeros(3, dtype=torch.long)), on_cuda(q), on_cuda(q),
                                                on_cuda(torch.randn(4, 8))], capi.options("rotary_embedding"))
    assert s.name == "KS_ERR_INVALID_ARGUMENT" and "k: overlaps q" in s.message, s


# ---- what still runs


def test_norms_in_place():
    x, w = torch.randn(6, 32), torch.randn(32)
    want = capi.rms_norm(x, w)
    xi = x.clone()
    assert capi.rms_norm(xi, w, out=xi) is xi
    assert torch.equal(xi, want)
    xt = x.t().contiguous().t()  # column-major x, in place through the same strides
    assert capi.rms_norm(xt, w, out=xt) is xt
    assert torch.equal(xt, want)
    want = capi.layer_norm(x, w)
    xi = x.clone()
    capi.layer_norm(xi, w, out=xi)
    assert torch.equal(xi, want)
    r = torch.randn(6, 32)
    want_y, want_h = capi.fused_add_rms_norm(x, r.clone(), w)
    xi, ri = x.clone(), r.clone()
    y, h = capi.fused_add_rms_norm(xi, ri, w, out=xi)
    assert y is xi and torch.equal(y, want_y) and torch.equal(h, want_h)
    # x, residual and out as disjoint slices of one buffer
    buf = torch.randn(3, 6, 32)
    buf[0], buf[1] = x, r
    y, h = capi.fused_add_rms_norm(buf[0], buf[1], w, out=buf[2])
    assert torch.equal(y, want_y) and torch.equal(h, want_h)


def test_interleaved_slices_of_one_buffer():
    """Views that interleave in one allocation without sharing a byte are not overlaps."""
    # rope: q and k as token-strided slices of a fused qkv projection
    t, h, d = 5, 2, 8
    qkv = torch.randn(t, 3 * h * d)
    q, k = qkv[:, : h * d], qkv[:, h * d: 2 * h * d]
    cache, pos = torch.randn(16, d), torch.randint(0, 16, (t,))
    want_q, want_k = capi.rotary_embedding(pos, q.clone(), k.clone(), cache, head_size=d)
    capi.rotary_embedding(pos, q, k, cache, head_size=d)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    # reshape_and_cache: k and v halves of a [num_blocks, 2, block_size, Hkv, D] cache
    kv = torch.zeros(4, 2, 4, 1, 8)
    key, value = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    slots = torch.tensor([0, 5, 13])
    capi.reshape_and_cache(key, value, kv[:, 0], kv[:, 1], slots)
    kc, vc = torch.zeros(4, 4, 1, 8), torch.zeros(4, 4, 1, 8)
    capi.reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kv[:, 0], kc) and torch.equal(kv[:, 1], vc)
    # embedding: out rows and the ids interleaved in one float32 buffer [4, 8]
    buf = torch.zeros(4, 8)
    out, ids = buf[:, :4], buf.view(torch.int32)[:, 4]
    ids.copy_(torch.tensor([2, 0, 1, 2], dtype=torch.int32))
    weight = torch.randn(3, 4)
    capi.embedding(ids, weight, out=out)
    assert torch.equal(out, weight[[2, 0, 1, 2]])


def test_attention_outputs_beside_index_data():
    """out, lse and the index data of a call may live side by side in one allocation."""
    q, kc, vc = torch.randn(2, 1, 8), torch.randn(4, 4, 1, 8), torch.randn(4, 4, 1, 8)
    bt, sl = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([5, 6], dtype=torch.int32)
    want_o, want_l = capi.paged_attention(q, kc, vc, bt, sl, return_lse=True)
    buf = torch.zeros(32)
    meta = buf[20:26].view(torch.int32)
    meta[0:4].copy_(bt.view(-1))
    meta[4:6].copy_(sl)
    o, lse = capi.paged_attention(q, kc, vc, meta[0:4].view(2, 2), meta[4:6], out=buf[0:16].view(2, 1, 8),
                                  lse=buf[16:18].view(2, 1))
    assert torch.equal(o, want_o) and torch.equal(lse, want_l)
    qv, kv_, vv = torch.randn(4, 1, 4), torch.randn(4, 1, 4), torch.randn(4, 1, 4)
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    want_o, want_l = capi.flash_attention_varlen(qv, kv_, vv, cu, cu, 2, 2, return_lse=True)
    buf = torch.zeros(32)
    buf[24:27].view(torch.int32).copy_(cu)
    o, lse = capi.flash_attention_varlen(qv, kv_, vv, buf[24:27].view(torch.int32), buf[24:27].view(torch.int32),
                                         2, 2, out=buf[0:16].view(4, 1, 4), lse=buf[16:20].view(1, 4))
    assert torch.equal(o, want_o) and torch.equal(lse, want_l)


def test_copy_blocks_and_huge_block_size_still_run():
    kc, vc = torch.randn(4, 2, 1, 8), torch.randn(4, 2, 1, 8)
    k0, v0 = kc.clone(), vc.clone()
    capi.copy_blocks([kc], [vc], torch.tensor([[1, 0], [2, 3]]))
    assert torch.equal(kc[0], k0[1]) and torch.equal(kc[3], k0[2]) and torch.equal(vc[3], v0[2])
    # a huge (stride-0) block size with a valid block id: seq_len 2 reads block 0
    base = torch.randn(8)
    kcache = torch.as_strided(base, (1, 2**63 - 1, 1, 1), (1000, 0, 1, 1))
    q = torch.randn(1, 1, 1)
    out, lse = capi.paged_attention(q, kcache, kcache, torch.tensor([[0]], dtype=torch.int32),
                                    torch.tensor([2], dtype=torch.int32), return_lse=True, scale=1.0)
    assert torch.allclose(out, base[0].expand(1, 1, 1))
    assert torch.allclose(lse, (q[0, 0, 0] * base[0] + torch.log(torch.tensor(2.0))).view(1, 1))



# ---- true in place, where every path reads before it writes: still runs, matches the reference

REF = dict(backend="reference")


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_in_place_elementwise_and_softmax():
    import kernelset as ks
    x = torch.randn(6, 32)
    for approx in ("none", "tanh"):
        xi = x.clone()
        assert capi.gelu(xi, approximate=approx, out=xi) is xi
        assert torch.equal(xi, capi.gelu(x, approximate=approx))
        _close(xi, ks.gelu(x, approximate=approx, **REF))
    gate, up = torch.randn(6, 32), torch.randn(6, 32)
    want = capi.swiglu(gate, up)
    _close(want, ks.swiglu(gate, up, **REF))
    g, u = gate.clone(), up.clone()
    capi.swiglu(g, u, out=g)  # out = gate
    assert torch.equal(g, want) and torch.equal(u, up)
    g, u = gate.clone(), up.clone()
    capi.swiglu(g, u, out=u)  # out = up
    assert torch.equal(u, want) and torch.equal(g, gate)
    xt = x.t().contiguous().t()  # column-major: in place through the same strides
    for name in ("softmax", "log_softmax"):
        fn = getattr(capi, name)
        want = fn(x, temperature=0.7)
        _close(want, getattr(ks, name)(x, temperature=0.7, **REF))
        xi = x.clone()
        assert fn(xi, temperature=0.7, out=xi) is xi
        assert torch.equal(xi, want)
        xs = xt.clone().t().contiguous().t()
        fn(xs, temperature=0.7, out=xs)
        assert torch.equal(xs, want)


def test_cross_entropy_mean_loss_may_share_memory():
    """A mean or sum writes its one element after every input was read: sharing is harmless and allowed."""
    import kernelset as ks
    logits, target = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    want = ks.cross_entropy(logits, target, **REF)
    buf = logits.clone()
    loss = capi.cross_entropy(buf, target, out=buf[3, 7])
    _close(loss, want)


def test_copy_blocks_same_cache_twice():
    """The same cache as k and v, or for two layers, copies the same blocks twice (as in Python)."""
    import kernelset as ks
    kc = torch.randn(4, 2, 1, 8)
    mapping = torch.tensor([[1, 0], [2, 3]])
    want = kc.clone()
    ks.copy_blocks([want], [want.clone()], mapping, **REF)
    got = kc.clone()
    capi.copy_blocks([got], [got], mapping)
    assert torch.equal(got, want)
    got = kc.clone()
    capi.copy_blocks([got, got], [got, got], mapping)
    assert torch.equal(got, want)


def test_in_place_attention():
    """out = q (and merge's out = out_a, lse = lse_a): each query row is read before its output row is
    written, by the CPU loops and the CUDA kernels."""
    import kernelset as ks
    # paged decode
    q, kc, vc = torch.randn(2, 2, 8), torch.randn(4, 4, 1, 8), torch.randn(4, 4, 1, 8)
    bt, sl = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([5, 6], dtype=torch.int32)
    want = ks.paged_attention(q, kc, vc, bt, sl, return_lse=True, **REF)
    qi = q.clone()
    o, lse = capi.paged_attention(qi, kc, vc, bt, sl, out=qi, return_lse=True)
    assert o is qi
    _close(o, want.out)
    _close(lse, want.lse)
    # flash (dense) and varlen
    q, k, v = torch.randn(2, 5, 2, 8), torch.randn(2, 7, 1, 8), torch.randn(2, 7, 1, 8)
    want = ks.flash_attention(q, k, v, causal=True, return_lse=True, **REF)
    qi = q.clone()
    o, lse = capi.flash_attention(qi, k, v, out=qi, causal=True, return_lse=True)
    assert o is qi
    _close(o, want.out)
    _close(lse, want.lse)
    q, k, v = torch.randn(6, 2, 8), torch.randn(9, 2, 8), torch.randn(9, 2, 8)
    cuq, cuk = torch.tensor([0, 2, 6], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    want = ks.flash_attention_varlen(q, k, v, cuq, cuk, 4, 5, causal=True, return_lse=True, **REF)
    qi = q.clone()
    o, lse = capi.flash_attention_varlen(qi, k, v, cuq, cuk, 4, 5, out=qi, causal=True, return_lse=True)
    assert o is qi
    _close(o, want.out)
    _close(lse, want.lse)
    # merge_attn_states: out = out_a, lse = lse_a; and out = out_b
    oa, ob, la, lb = torch.randn(5, 2, 8), torch.randn(5, 2, 8), torch.randn(5, 2), torch.randn(5, 2)
    want = ks.merge_attn_states(oa, la, ob, lb, **REF)
    oi, li = oa.clone(), la.clone()
    o, lse = capi.merge_attn_states(oi, li, ob, lb, out=oi, lse=li)
    assert o is oi and lse is li
    _close(o, want.out)
    _close(lse, want.lse)
    oi = ob.clone()
    _close(capi.merge_attn_states(oa, la, oi, lb, out=oi), want.out)
    # mla_decode: out = q_nope
    qn, qp, kv = torch.randn(2, 3, 4), torch.randn(2, 3, 2), torch.randn(4, 4, 6)
    want = ks.mla_decode(qn, qp, kv, bt, sl, scale=0.5, kv_lora_rank=4, rope_dim=2, return_lse=True, **REF)
    qi = qn.clone()
    o, lse = capi.mla_decode(qi, qp, kv, bt, sl, out=qi, return_lse=True, scale=0.5, kv_lora_rank=4, rope_dim=2)
    assert o is qi
    _close(o, want.out)
    _close(lse, want.lse)
