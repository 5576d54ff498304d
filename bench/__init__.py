"""Benchmarks comparing purefx with ``torch.export.unflatten``.

``bench.models`` builds the synthetic models; ``bench.run`` is the runner
(``python -m bench.run --help``).
"""
