"""The `python` scorer: a dataset's own `compute_score` run in a sandbox of its own.

`score` runs it from the worker's side; `runner` (root, in the sandbox) and `code` (the
scorer's code, as `nobody`, in a process of its own) are sent into the sandbox as text and
never imported by Sandhive.
"""
