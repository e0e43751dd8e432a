"""Visible checks of 10-scaling: one `check_<name>(<name>)` per graded function, called from its test cell.

Each check lives in a private module of its own topic (course/checks/_scaling_<topic>.py); this module gathers them.
"""
from __future__ import annotations

from course.checks._scaling_comm import check_predict_scaling, check_predict_step_time
from course.checks._scaling_memory import check_per_rank_bytes
from course.checks._scaling_overlap import check_BucketedAllReduce
from course.checks._scaling_resume import check_load_checkpoint, check_save_checkpoint
from course.checks._scaling_zero import check_ShardedOptimizer

__all__ = ["check_per_rank_bytes", "check_ShardedOptimizer", "check_predict_step_time", "check_predict_scaling",
           "check_BucketedAllReduce", "check_save_checkpoint", "check_load_checkpoint"]
