"""Ascend Triton implementations of Model Runner V2's kernels, one module per ``kernels.v2`` module.

Each kernel walks its independent work items (requests, rows, ``(row, block)`` pairs) grid-stride, over
the grid ``_geometry.programs`` gives for the device: one program per vector core on Ascend (what the
module docstrings describe), one program per item on CUDA, as vLLM launches its own kernels. Kernels
whose columns are independent (temperature, penalties, bincount) also cut rows into column chunks
(``LaunchGeometry.column_split``): a tile each on CUDA, on Ascend only while rows are fewer than cores.
"""
