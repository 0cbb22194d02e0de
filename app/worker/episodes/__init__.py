"""The worker's side of RL episodes: claim, serve turn by turn, reward, sweep."""
