"""The image catalogue at run time: which stream a task waits on, admission by image,
queued tasks whose image left, and per-image figures.
"""
