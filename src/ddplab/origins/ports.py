"""Moved to ``ddplab.rank.ports`` (lab 05's ranks check the port themselves, and a lab script imports only
``ddplab.rank``); re-exported here for code that still imports it from the origins."""
from ddplab.rank.ports import PortStatus, check_port, free_port, holder  # noqa: F401
