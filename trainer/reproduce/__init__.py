"""The papers' reproduction protocols, one module per model kind (``ordrec-train reproduce KIND``)."""
