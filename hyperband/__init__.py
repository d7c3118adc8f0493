"""Hyperband (Li et al., JMLR 2018) as plain Python: schedule, promotion, search space, bracket state.

No Prefect, MLflow or trainer imports here: decisions are pure functions of integers, ids and scores.
"""

from hyperband.asha import AshaState
from hyperband.bracket import BracketState
from hyperband.promotion import promote, sort_key
from hyperband.schedule import Bracket, Rung, brackets, plan_summary, s_max

__all__ = ["AshaState", "Bracket", "BracketState", "Rung", "brackets", "plan_summary", "promote", "s_max", "sort_key"]
