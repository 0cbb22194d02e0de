"""`/v1/experiments` routes: create, list, read, results, and the event stream."""
