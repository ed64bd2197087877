"""Analysis package: pcap reading, packet matching and metrics; ``load`` and ``load_table``
give batches as tidy tables (analysis/results.py)."""

from analysis.results import load, load_table

__all__ = ["load", "load_table"]
