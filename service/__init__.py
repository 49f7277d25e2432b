"""ordrec serving runtime: artifact format, id maps, scorers, indices, gRPC server.

This package is the light side: it reads arrays and computes scores. The
trainer imports it to write artifacts and to score during evaluation, so the
figures the trainer reports come from the code that answers queries. It never
imports the trainer.
"""
