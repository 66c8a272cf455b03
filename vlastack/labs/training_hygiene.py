"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("training_hygiene", "todo")
