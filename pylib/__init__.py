"""pylib: every parallel mode of the book, implemented over torch.distributed.

Sub-packages mirror the book: `runtime` (launch ranks, the rank mesh, traced collectives), `model` (the single-device
reference Transformer), one folder per parallelism (`tp`, `cp`, `ep`, `pp`, `dp`), `compose` (all of them on one
mesh), `analysis` (formulas), `viz` (figures) and `labs` (the lab harness).
"""

__version__ = "0.1.0"
