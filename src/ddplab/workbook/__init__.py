"""Per-lab analysis used by the notebooks and `make workbook` (one module per lab)."""
from ddplab import warm as _warm

# Every user of a lab module starts runs: its torchrun agents' warm parent imports torch meanwhile.
_warm.prestart()
