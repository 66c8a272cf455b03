"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("grad_modes", "todo")
