"""An order pipeline on celery-fence: reserve stock -> charge -> ship -> notify, each exactly once.

``python -m example_app demo`` runs it on real workers with faults injected (see ``demo.py``).
"""
