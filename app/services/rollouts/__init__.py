"""Rollouts out: an experiment's or a task's rollouts as JSONL, ready for a trainer's loader
(the GRPO groups they carry are computed in `app.domain.rollout_groups`), and the same
records as ATIF trajectories (`atif`) and Inspect eval logs (`inspect_log`).
"""
