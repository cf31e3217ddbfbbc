"""Where evidence comes from, one module per origin (a started job, processes found by attach,
saved node folders, torch's dumps), with what starting a job needs: the labs as the launcher finds
them (catalog), the command, the warm agent, ports, the machine's turns, the namespaces of a
multi-node job. Each origin hands the engine a Source (ddplab.engine.diagnose).
"""
