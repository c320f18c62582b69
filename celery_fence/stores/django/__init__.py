"""The ``django://<alias>`` store: the SQL store on a Django database, whose run transactions are Django
transactions on Django's own connection (``store``, ``run``; SQLAlchemy on that connection: ``borrowed``).
The Django app that migrates its tables is :mod:`celery_fence.contrib.django`. Loaded through the
``celery_fence.stores`` entry point only, so that nothing imports Django unless a store URL names it."""
