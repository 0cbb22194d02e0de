"""The v1 wire models: what clients send and what the API answers, one module per feature.

Leaves: they import settings-free definitions only (`app.domain`, `app.states`, `app.ids`),
never storage, the API or the worker.
"""
