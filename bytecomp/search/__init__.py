"""The decision tree of strategies per tensor and the search for the best plan.

>>> from bytecomp.search import Planner, to_plan
>>> result = Planner(profile, cluster, ["topk:ratio=0.01"]).search()
>>> to_plan(result, profile).save("plan.yaml")
"""

from bytecomp.search.planner import Planner
from bytecomp.search.plans import simulate_plan, to_plan
from bytecomp.search.result import SearchResult

__all__ = ["SearchResult", "Planner", "simulate_plan", "to_plan"]
