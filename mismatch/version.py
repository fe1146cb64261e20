"""The toolkit version, stamped on every result row, and the schema version of run and task ids."""

__version__ = "0.2.0"

# Run ids and task ids hash a configuration's field names and values. Bump this when a hashed field is
# added, removed, renamed or changes meaning: every id changes with it, on purpose and once.
# `tests/sweep/test_ids.py` pins the shipped studies' ids to it.
ID_SCHEMA = 4  # 4: the student's shared prefix runs once with gradients (SmolLM2 runs round otherwise); 3: OPDConfig.eval_probe; 2: this field in the hash (schema 1: no field)
