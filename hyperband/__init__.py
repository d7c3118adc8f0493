"""Hyperband (Li et al., JMLR 2018) as plain Python: schedule, promotion, search space, bracket state.

No Prefect, MLflow or trainer imports here: decisions are pure functions of integers, ids and scores.
"""

from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.bracket import BracketState
from prefect_hyperband.hyperband.promotion import promote, sort_key
from prefect_hyperband.hyperband.schedule import Bracket, Rung, brackets, plan_summary, s_max

__all__ = ["AshaState", "Bracket", "BracketState", "Rung", "brackets", "plan_summary", "promote", "s_max", "sort_key"]
