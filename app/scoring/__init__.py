"""Built-in scorers: turn an agent's final answer and a dataset row into a score in [0, 1].

Pure functions of their inputs (no I/O, no Postgres, Redis or Docker), used by experiments
to score each item. Build one with `app.scoring.registry.scorer_for(spec)`; run it with
`app.scoring.types.score_answer`, which turns any failure into a `ScorerError`.
"""
