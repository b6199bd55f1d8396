"""The simulator: the protocol core driven in virtual time."""

from hopbus.sim.engine import Blocked, SimResult, Simulation
from hopbus.sim.run import prepare, simulate, summarize

__all__ = ["Blocked", "SimResult", "Simulation", "prepare", "simulate", "summarize"]
