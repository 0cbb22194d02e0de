"""RL episodes (`/v1/episodes`): rows, the API's calls to the worker that holds one,
step counts, rewards and the sweep.
"""
