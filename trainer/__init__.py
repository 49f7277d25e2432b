"""ordrec trainer: data readers, the five models, evaluation protocols, publishing."""
