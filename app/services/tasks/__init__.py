"""Tasks: submit, read, cancel, end; their attempts, files, artifacts and admission."""
