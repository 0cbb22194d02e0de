"""The `sandhive` command line: one module per command group, each a thin caller of the
layers below (`main` holds the top-level commands and the entry point).
"""
