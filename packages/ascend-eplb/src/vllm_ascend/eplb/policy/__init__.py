"""EPLB policies (pure numpy/scipy)."""
