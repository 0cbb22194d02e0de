"""Rollouts for RL: an experiment's or a task's rollouts as JSONL, ready for a trainer's loader
(the GRPO groups they carry are computed in `app.domain.rollout_groups`).
"""
