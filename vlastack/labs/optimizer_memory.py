"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("optimizer_memory", "todo")
