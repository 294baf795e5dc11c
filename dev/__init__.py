"""Developer tools: code generation (unasync)."""
