"""texir's own backends: pure functions of a frozen sub-program (no torch, no executorch)."""
