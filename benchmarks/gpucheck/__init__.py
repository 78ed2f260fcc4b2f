"""The sections of ``benchmarks/gpu_check.py``, one module each, and what they share.

Every module imports only the standard library at its top: torch, triton and mfd_hub load inside
the functions, after ``bootstrap.prepare_process`` has told Triton whether it runs in its
interpreter and mapped mfd_hub onto this checkout."""
