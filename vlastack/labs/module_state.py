"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("module_state", "todo")
