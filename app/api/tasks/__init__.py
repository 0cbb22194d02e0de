"""`/v1/tasks` routes: submit, list, read, stream, files and artifacts."""
