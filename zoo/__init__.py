"""Drafters shipped with mfd-hub: the SmolLM2-135M miniature's checkpoints (one folder each,
with their model cards and verify reports). ``mfd_hub.miniature.shipped_drafter_dir`` finds them."""
