"""The tests' Django app: one model, the order a fenced task writes with the ORM."""
