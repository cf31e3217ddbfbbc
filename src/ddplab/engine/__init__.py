"""The engine: the one pipeline (diagnose), the watch loop, evidence, the judge, the failure catalog,
the --check comparison. It imports no origin, view, course or tool module (import-linter).
"""
