"""Integrations with the frameworks Celery users build on: :mod:`celery_fence.contrib.django`."""
