"""The GPU example: repro variants on the CUDA driver API, and `gpuleakfixture` releases.

- `repro.py`: the repro script (ctypes on ``libcuda.so.1``, no framework); its variants
  are device leak, device plateau, pinned host leak, pinned host reuse and an OOM ending.
- `fixture.py`: synthetic `gpuleakfixture` releases whose version picks the variants (the
  reuse variants up to 0.1.4, the leak variants from 0.1.5), served as a package index by
  `service.example.index.serve_index`.
- `pinned_probe.py`: what the kernel reports for pinned host pages (`bench/gpu_check.py`).
"""
