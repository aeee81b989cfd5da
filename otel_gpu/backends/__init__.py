"""Backends: the only place a vendor library is imported (lazily, inside each backend)."""
