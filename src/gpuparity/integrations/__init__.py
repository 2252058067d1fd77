"""Bridges from gpuparity's verified ops to other libraries' models (each optional: a missing
library never breaks `import gpuparity`)."""
