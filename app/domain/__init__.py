"""The rules with no I/O that several layers share: the resolved task (`specs`) and how a
submission resolves into one, prompt configs, the image catalogue, the experiment report's
arithmetic, captured model calls, and the reference package's formats.
"""
