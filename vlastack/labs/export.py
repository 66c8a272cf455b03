"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("export", "todo")
