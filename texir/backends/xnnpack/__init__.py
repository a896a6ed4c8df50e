"""texir's native XNNPACK backend: ExecuTorch 1.5.1's delegate blob (schema.fbs, XH00) from the typed IR."""
