"""What runs inside a rank: the lab scripts' helpers (they import torch) and the rank hook. Nothing
here imports the launcher, the engine's loop or a view (import-linter).
"""
