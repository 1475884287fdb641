"""Helpers for tests, the demo and benchmarks: tiny local models."""
