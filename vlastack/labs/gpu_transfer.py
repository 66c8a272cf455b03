"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("gpu_transfer", "todo")
