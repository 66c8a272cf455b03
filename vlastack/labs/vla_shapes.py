"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("vla_shapes", "todo")
