"""Ascend Triton implementations of Model Runner V2's kernels, one module per ``kernels.v2`` module."""
