"""Compile every Triton kernel for a CUDA GPU without one (triton's front end, LLVM and ptxas
run on the CPU) and print its resources: registers, spills, shared memory.

The CPU interpreter that the tests use accepts programs the compiler refuses; this script is the
check that the kernels are valid GPU code at the shapes generation uses.

    python benchmarks/compile_kernels.py [--arch 90] [--budget 128] [--modes 8]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mfd_hub.kernels import (  # noqa: E402
    accept_triton,
    kv_compact_triton,
    mode_attention_triton,
    tree_attention_triton,
    tree_build_triton,
)
from mfd_hub.kernels.backend import next_power_of_2  # noqa: E402


def kernel_specs(budget, modes, positions, vocab, head_dim, block):
    """(name, warps, kernel, {argument: type}, {constexpr: value}) at generation's shapes (the
    launch wrappers use the same warps)."""
    tb, ta, ac, kv, ma = tree_build_triton, tree_attention_triton, accept_triton, kv_compact_triton, mode_attention_triton
    keep = next_power_of_2(min(budget, vocab))
    chunk = max(keep, min(tb.VOCAB_CHUNK, next_power_of_2(vocab)))
    merge = next_power_of_2(triton.cdiv(vocab, chunk) * keep)
    width = min(budget, vocab)
    cells = next_power_of_2(len([(i, j) for j in range(width) for i in range(budget // (j + 1))]))
    b_pad, l_pad = next_power_of_2(budget), next_power_of_2(positions)
    words = next_power_of_2((positions + 2) // 3)
    e_pad = next_power_of_2(modes) * b_pad
    n_tree = budget + 1
    i64, i32, f32 = "*i64", "i32", "fp32"
    return [
        ("vocab top-k: chunks", tb.WARPS["chunk"], tb._vocab_chunk_kernel,
         dict(logits_ptr="*bf16", lse_ptr="*fp32", keys_ptr=i64, n_rows=i32, vocab=i32, row_stride=i32),
         dict(ROWS=1, CHUNK=chunk, KEEP=keep)),
        ("vocab top-k: merge", tb.WARPS["merge"], tb._vocab_merge_kernel,
         dict(keys_ptr=i64, scores_ptr=i64, ids_ptr=i64, n_rows=i32, n_keys=i32, n_out=i32),
         dict(ROWS=1, MERGE=merge, OUT_PAD=keep)),
        ("tree: per-mode beams", tb.WARPS["beams"], tb._mode_beams_kernel,
         dict(scores_ptr=i64, ids_ptr=i64, cell_i_ptr="*i32", cell_j_ptr="*i32", n_cells=i32, length=i32,
              width=i32, budget=i32, sort_tmp=i64, slot_tmp=i64, words_tmp=i64, tokens_tmp=i64, keys_tmp=i64,
              out_s=i64, out_depth=i64, out_token=i64, out_words=i64),
         dict(B_PAD=b_pad, C_PAD=next_power_of_2(width), CELLS_PAD=cells, LOG_CELLS=cells.bit_length() - 1,
              L_PAD=l_pad, LOG_ALL=(l_pad * b_pad).bit_length() - 1, NW=words)),
        ("tree: merge modes + layout", tb.WARPS["modes"], tb._merge_modes_kernel,
         dict(ent_s=i64, ent_depth=i64, ent_token=i64, ent_words=i64, n_entries=i32, n_nodes=i32, anchor=i32,
              tmp=i64, tokens_out=i64, parents_out=i64, depths_out=i64, scores_out=i64, modes_out=i64),
         dict(E_PAD=e_pad, LOG_E=e_pad.bit_length() - 1, B_PAD=b_pad, NW=words)),
        ("ancestor mask", 4, ta._ancestor_mask_kernel, dict(parents_ptr=i64, mask_ptr="*i8", n=i32, steps=i32),
         dict(ROWS=16, N_PAD=next_power_of_2(n_tree))),
        ("verify bias", 4, ta._verify_bias_kernel,
         dict(mask_ptr="*i8", bias_ptr="*bf16", n=i32, prefix_len=i32, neg=f32), dict(BLOCK=1024)),
        ("accept walk", 4, ac._accept_kernel,
         dict(tokens_ptr=i64, parents_ptr=i64, depths_ptr=i64, target_ptr=i64, path_ptr=i64, info_ptr=i64,
              n=i32, max_depth=i32),
         dict(N_PAD=next_power_of_2(n_tree), P_PAD=next_power_of_2(positions + 1), STEPS=positions.bit_length())),
        ("KV compaction", 4, kv._compact_kernel,
         dict(table_ptr=i64, path_ptr=i64, n=i32, prefix_len=i32, rows_per_head=i32, head_dim=i32),
         dict(DTYPE=triton.language.bfloat16, N_PAD=next_power_of_2(positions + 1), D_PAD=head_dim)),
        ("mode attention", 8, ma._mode_attention_kernel,
         dict(q_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", kb_ptr="*bf16", vb_ptr="*bf16", cvis_ptr="*u8",
              bvis_ptr="*u8", out_ptr="*bf16", n_heads=i32, n_blocks=i32, rep=i32, n_ctx=i32, n_modes=i32,
              seq=i32, head_dim=i32, scale=f32,
              **{f"s{g}{i}": i32 for g, count in (("q", 6), ("c", 4), ("b", 6), ("v", 4)) for i in range(count)}),
         dict(HAS_CVIS=True, HAS_BVIS=False, PRECISION="tf32", Q_PAD=next_power_of_2(modes * block),
              D_PAD=head_dim, BLOCK_C=64)),
    ]


def resource_usage(cubin):
    """Registers / local (spill) bytes per thread from the cubin, via the cuobjdump triton ships."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    found = {key: re.search(rf"{key}:(\d+)", text) for key in ("REG", "LOCAL")}
    return {key: int(m.group(1)) if m else "?" for key, m in found.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90 = H100/H200)")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--modes", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=151_936)
    args = parser.parse_args(argv)
    target = GPUTarget("cuda", args.arch, 32)
    failures = 0
    for name, warps, kernel, signature, constexprs in kernel_specs(args.budget, args.modes, 15, args.vocab, 128, 16):
        signature = {**signature, **{k: "constexpr" for k in constexprs}}
        started = time.perf_counter()
        try:
            source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
            compiled = triton.compile(source, target=target, options={"num_warps": warps})
        except Exception as error:  # report every kernel, then fail
            failures += 1
            print(f"FAIL  {name}: {str(error).strip().splitlines()[-1]}")
            continue
        meta = compiled.metadata
        usage = resource_usage(compiled.asm["cubin"])
        print(
            f"ok    {name:28s} warps {meta.num_warps:2d}  shared {meta.shared:6d} B  registers {usage['REG']:>3}  "
            f"local (spill) {usage['LOCAL']:>5} B  ({time.perf_counter() - started:.1f} s)"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
