# mfd-hub remote code 0.1.0, generated from kernels/backend.py; edit the source, not this copy.
"""Which implementation the kernels run: Triton on CUDA, the torch references elsewhere.

One switch forces either: the environment variable ``MFD_HUB_KERNELS`` (``auto``, ``torch`` or
``triton``, read at every call) or ``set_kernel_backend`` (which wins over the variable until it
is reset with ``None``). ``auto`` picks Triton for CUDA tensors when triton is installed.
Forcing ``triton`` on CPU tensors works only under triton's interpreter (``TRITON_INTERPRET=1``
set before the kernels are imported): that is how the CI checks the kernels without a GPU.

Triton is optional: without it every kernel falls back to its torch reference, and forcing
``triton`` raises a clear error.

This file is part of the remote-code bundle: torch only (triton inside try/except).
"""

import os

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch references run everywhere
    triton = None
    tl = None

BACKENDS = ("auto", "torch", "triton")
# triton decides at decoration time (when the kernel files are imported) whether kernels run in
# its interpreter; this records the same decision.
INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
ENV_VAR = "MFD_HUB_KERNELS"
_forced = None


def set_kernel_backend(name):
    """Force ``"torch"`` or ``"triton"`` (or ``"auto"``) for every kernel; ``None`` returns the
    choice to the ``MFD_HUB_KERNELS`` environment variable. Returns the previous setting."""
    global _forced
    if name is not None and name not in BACKENDS:
        raise ValueError(f"kernel backend must be one of {BACKENDS} or None, got {name!r}")
    previous, _forced = _forced, name
    return previous


def kernel_backend():
    """The requested backend: the setter's choice, else the environment variable, else auto."""
    name = _forced if _forced is not None else os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(f"{ENV_VAR} must be one of {BACKENDS}, got {name!r}")
    return name


def use_triton(tensor):
    """Should a kernel on ``tensor``'s device run in Triton? Raises when triton is forced but
    cannot run there."""
    name = kernel_backend()
    if name == "torch":
        return False
    if name == "auto":
        return triton is not None and tensor.device.type == "cuda"
    if triton is None:
        raise RuntimeError(f"{ENV_VAR}=triton but triton is not installed (pip install triton)")
    if tensor.device.type != "cuda" and not INTERPRETED:
        raise RuntimeError(
            f"{ENV_VAR}=triton on {tensor.device.type} tensors needs triton's interpreter: "
            "set TRITON_INTERPRET=1 before importing the kernels"
        )
    return True


def next_power_of_2(n):
    """The smallest power of two >= max(n, 1) (Triton block sizes)."""
    return 1 << max(0, int(n) - 1).bit_length()
