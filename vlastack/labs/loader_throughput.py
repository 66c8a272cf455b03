"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("loader_throughput", "todo")
