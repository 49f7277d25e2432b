"""Reusable metrics (``metrics``) and the cron job's held-out gate (``holdout``); the papers'
protocols that use them live in :mod:`ordrec.trainer.reproduce`."""
