"""Rollouts for RL: an experiment's items as GRPO groups, and their JSONL export."""
