"""Time ``convert zlab`` and ``verify`` on a drafter of a published shape (random bf16 weights).

Builds a z-lab-format drafter with the shape of a released DFlash drafter (DESIGN §3), converts it
to an MFD checkpoint with K modes (sharded as the Hub does), then runs every verify check and
prints the time of each. Needs ~4x the checkpoint's size in free memory.

    python benchmarks/convert_verify_real_shape.py --shape qwen3-4b --max-shard-size 500MB
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from mfd_hub import DFlashConfig, DFlashDraftModel
from mfd_hub.converters import convert_zlab
from mfd_hub.testing import write_zlab_checkpoint
from mfd_hub.verify import verify_checkpoint

SHAPES = {  # DESIGN §3: hidden, intermediate, taps, target layers, mask id, vocabulary
    "qwen3-4b": (2560, 9728, [1, 9, 17, 25, 33], 36, 151669, 151936),
    "qwen3-8b": (4096, 12288, [1, 9, 17, 25, 33], 36, 151669, 151936),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-4b")
    parser.add_argument("--modes", type=int, default=8)
    parser.add_argument("--max-shard-size", default="5GB")
    parser.add_argument("--workdir", default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    hidden, inter, taps, n_target, mask, vocab = SHAPES[args.shape]
    config = DFlashConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=5, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, block_size=16, num_target_layers=n_target, target_layer_ids=taps,
        mask_token_id=mask,
    )
    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        root = Path(scratch)
        start = time.perf_counter()
        torch.manual_seed(0)
        state = DFlashDraftModel(config).to(torch.bfloat16).state_dict()
        write_zlab_checkpoint(root / "zlab", config, state)
        size = sum(p.stat().st_size for p in (root / "zlab").iterdir())
        params = sum(t.numel() for t in state.values())
        del state
        print(f"{args.shape}: {params / 1e6:.0f}M parameters, {size / 2**30:.2f} GiB z-lab checkpoint "
              f"(built in {time.perf_counter() - start:.1f} s)")

        start = time.perf_counter()
        convert_zlab(root / "zlab", root / "mfd", num_modes=args.modes, max_shard_size=args.max_shard_size)
        shards = sorted(p.name for p in (root / "mfd").glob("*.safetensors"))
        print(f"convert zlab -> MFD (K={args.modes}): {time.perf_counter() - start:.1f} s, {len(shards)} shard(s)")

        start, last, rows = time.perf_counter(), [time.perf_counter()], []

        def lap(check):
            now = time.perf_counter()
            rows.append((check.name, check.status, now - last[0]))
            last[0] = now

        report = verify_checkpoint(root / "mfd", listener=lap)
        print(f"verify: {'sound' if report.ok else 'FAILED'} in {time.perf_counter() - start:.1f} s")
        for name, status, seconds in rows:
            print(f"  {name:<14} {status:<5} {seconds:7.2f} s")


if __name__ == "__main__":
    main()
