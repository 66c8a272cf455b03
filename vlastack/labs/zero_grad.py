"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("zero_grad", "todo")
