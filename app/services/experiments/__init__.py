"""Experiments: create, advance, score, regrade and read evaluation runs."""
