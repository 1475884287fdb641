"""Sampling on the device through the kernels package."""
