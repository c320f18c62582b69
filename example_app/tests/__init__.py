"""Example tests of the order pipeline with celery-fence's fault kit: what a user writes for their own app."""
