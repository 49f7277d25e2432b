"""Data ingestion: one reader per input shape (see ``trainer.data.readers``)."""

from ordrec.trainer.data.types import AttributeTable, DataError, NeighborLists, Ratings, TagAssignments

__all__ = ["AttributeTable", "DataError", "NeighborLists", "Ratings", "TagAssignments"]
