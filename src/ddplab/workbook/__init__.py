"""Per-lab analysis used by the notebooks and `make workbook` (one module per lab)."""
