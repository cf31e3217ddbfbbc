"""Tools around a run: doctor, the multi-node pre-flight, the classroom check, the system packages.
"""
