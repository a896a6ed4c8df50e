"""Testing helpers: the `ir_snapshot` pytest/syrupy integration and small hand-built programs."""
