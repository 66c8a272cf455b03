"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("worker_sharding", "todo")
