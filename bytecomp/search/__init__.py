"""The decision tree of strategies per tensor and the search for the best plan.

>>> from bytecomp.search import Planner, to_plan
>>> result = Planner(profile, cluster, ["topk:ratio=0.01"]).search()
>>> to_plan(result, profile).save("plan.yaml")
"""

from bytecomp.search.planner import Planner, SearchResult, simulate_plan, to_plan

__all__ = ["SearchResult", "Planner", "simulate_plan", "to_plan"]
