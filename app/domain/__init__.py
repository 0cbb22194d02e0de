"""The rules with no I/O that several layers share: how a submission resolves into a task
(`resolve`, over `app.specs`), prompt configs, the image catalogue, the arithmetic of an
experiment's report and of GRPO groups, captured model calls, and the reference package's
formats.
"""
