"""Side-by-side benchmarks of backends (`gpuparity bench ...`)."""
