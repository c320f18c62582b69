"""celery-fence as a Django app (``INSTALLED_APPS += ["celery_fence.contrib.django"]``): its migrations
create the ``fence_*`` tables, and the ``django://<alias>`` store runs a run's fenced transaction on
Django's own connection, so ORM writes in ``self.fence.atomic()`` commit with the run's completion
(docs/django.md).
"""
