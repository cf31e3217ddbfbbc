"""The course: each lab's workbook module (runs, claims, exercises), the claims
register and its rules, answers and checkers, the notebook build.
"""
