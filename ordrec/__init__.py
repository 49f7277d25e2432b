"""ordrec: ordinal-ranking recommenders, an offline trainer and a gRPC service.

Installed, everything lives under this namespace: ``ordrec.v1`` (generated from
``proto/``), ``ordrec.service`` (the serving runtime, from ``service/``) and
``ordrec.trainer`` (readers, models, evaluation, the job; from ``trainer/``).
"""
