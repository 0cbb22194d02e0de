"""Small asyncio and failure-handling tools every process uses: stopping tasks for good,
periodic jobs, and telling an outage from a bug.
"""
