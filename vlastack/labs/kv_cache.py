"""stub"""

from vlastack.labs._core import Lab

LAB = Lab("kv_cache", "todo")
